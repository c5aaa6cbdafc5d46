"""Fake ``cuda.bindings`` (cuda-python >= 12.6): only ``runtime`` is provided."""
