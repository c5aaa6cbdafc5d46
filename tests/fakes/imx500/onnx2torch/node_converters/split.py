class OnnxSplit:
    """Stands for onnx2torch's Split module (never made by the fake convert)."""


class OnnxSplit13(OnnxSplit):
    """Stands for onnx2torch's opset-13 Split module."""
