class OnnxResize:
    """Stands for onnx2torch's Resize module (never made by the fake convert)."""
