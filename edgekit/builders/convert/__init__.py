"""Conversions between formats: ONNX -> TensorFlow (onnx2tf, in a child process, with its
fallbacks and ONNX rewrites), SavedModel -> TFLite, float TFLite -> ONNX."""
