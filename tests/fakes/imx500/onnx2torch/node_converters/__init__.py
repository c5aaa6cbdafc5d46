"""Fake ``onnx2torch.node_converters``: the module classes the job looks for (the fake model has none)."""
