"""A fake ``cuda`` (cuda-python) package for tests on machines without an NVIDIA GPU.

``cuda.bindings.runtime`` is the fake CUDA runtime (see its docstring); ``cuda.cudart`` is the
pre-12.6 import path and re-exports the same module, as cuda-python 12.x did.
"""
