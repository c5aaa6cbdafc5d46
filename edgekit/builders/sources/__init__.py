"""Build sources: the user's model loaded whatever its format (Keras, SavedModel, ONNX, float
TFLite), its inputs and labels, and the calibration and evaluation images."""
