"""Device-side runtimes: one adapter per backend behind one small contract.

Every adapter is a context manager with ``infer(tensor) -> list[np.ndarray]`` (arrays the
caller owns), ``input_spec``, ``describe()`` and ``close()``. Adapters import their backend
library lazily and never import TensorFlow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edgekit.image import InputSpec


@runtime_checkable
class Runtime(Protocol):
    """The contract every adapter satisfies."""

    input_spec: InputSpec

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        """Run one inference; returns new arrays owned by the caller."""
        ...

    def describe(self) -> dict[str, Any]:
        """What really runs: backend, version, delegates/providers applied, node coverage."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Runtime: ...

    def __exit__(self, *exc: object) -> None: ...


_ADAPTER_HINTS = {
    "edgekit.runtime.litert": "pip install 'edgekit[litert]'",
    "edgekit.runtime.onnxrt": "pip install 'edgekit[onnx]'",
}


def open_runtime(source: str | Path, model: str | None = None, **options: Any) -> Runtime:
    """Open a runtime for a bundle directory or a bare ``.tflite``/``.onnx`` file.

    For a bundle, the adapter and its options come from edgekit.json; keyword ``options``
    override them (e.g. ``num_threads=1``, ``delegate="none"``, ``device="usb:0"``).
    """
    from edgekit.bundle import load_bundle
    from edgekit.errors import ModelError
    from edgekit.plugins import resolve

    path = Path(source)
    if path.is_dir():
        bundle = load_bundle(path)
        entry = bundle.model(model)
        adapter = bundle.runtime.get("adapter", "edgekit.runtime.litert:LiteRTRuntime")
        merged = {**bundle.runtime.get("options", {}), **entry.extra.get("runtime_options", {}), **options}
        cls = resolve(adapter, _ADAPTER_HINTS.get(adapter.split(":")[0]))
        return cls(bundle.path / entry.file, input_spec=entry.input, **merged)
    if not path.is_file():
        raise ModelError(f"model {path} does not exist", "give a bundle directory, a .tflite or an .onnx file")
    if path.suffix == ".tflite":
        from edgekit.runtime.litert import LiteRTRuntime

        return LiteRTRuntime(path, **options)
    if path.suffix == ".onnx":
        from edgekit.runtime.onnxrt import OnnxRuntime

        return OnnxRuntime(path, **options)
    raise ModelError(f"{path}: unsupported model file", "give a bundle directory, a .tflite or an .onnx file")
