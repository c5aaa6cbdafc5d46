"""HOST side: turning a trained model into bundles. May import TensorFlow/ONNX, but only
inside functions, so that importing this package stays cheap."""
