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
from edgekit.runtime.backends import BACKENDS, Backend, default_backend, install_hint, known_adapters

__all__ = ["BACKENDS", "Backend", "Runtime", "describe_runtime", "open_runtime"]


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


def _format_of(path: Path) -> str:
    return {".tflite": "tflite", ".onnx": "onnx"}.get(path.suffix.lower(), path.suffix.lower().lstrip("."))


def open_runtime(source: str | Path, model: str | None = None, backend: str | None = None,
                 allow_rejected: bool = False, **options: Any) -> Runtime:
    """Open a runtime for a bundle directory or a bare ``.tflite``/``.onnx`` file.

    For a bundle, the adapter and its options come from edgekit.json (bundle-wide options, then
    the model entry's own); keyword ``options`` override them (e.g. ``num_threads=1``,
    ``delegate="none"``, ``device="usb:0"``, ``providers=["cpu"]``). ``backend`` (a key of
    :data:`BACKENDS`, e.g. ``"onnxruntime"`` or ``"tensorrt"``) swaps the adapter for models of
    the formats it runs; the bundle's adapter options are then not applied. A bundle that
    failed its accuracy gate is refused unless ``allow_rejected``.
    """
    from edgekit.bundle import load_bundle
    from edgekit.errors import BundleError, ModelError, UsageError
    from edgekit.plugins import resolve

    if backend is not None and backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}", f"choose one of: {', '.join(BACKENDS)}")
    path = Path(source)
    if path.is_dir():
        bundle = load_bundle(path, allow_rejected=allow_rejected)
        entry = bundle.model(model)
        fmt = entry.format
        adapter = bundle.runtime.get("adapter", BACKENDS["litert"].adapter)
        merged = {**bundle.runtime.get("options", {}), **entry.extra.get("runtime_options", {})}
        if backend and fmt in BACKENDS[backend].formats:
            adapter, defaults = BACKENDS[backend].adapter, BACKENDS[backend].defaults
            merged = {**defaults, **{k: v for k, v in entry.extra.get("runtime_options", {}).items()
                                     if k == "precision"}}
        if adapter not in known_adapters():
            # A copied bundle must not choose what gets imported and called on the device.
            raise BundleError(f"{path}: unknown runtime adapter {adapter!r}",
                              f"adapters are: {', '.join(known_adapters())}; rebuild the bundle")
        cls = resolve(adapter, install_hint(adapter))
        return cls(bundle.path / entry.file, input_spec=entry.input, **{**merged, **options})
    if not path.is_file():
        raise ModelError(f"model {path} does not exist", "give a bundle directory, a .tflite or an .onnx file")
    fmt = _format_of(path)
    name = backend if backend and fmt in BACKENDS[backend].formats else default_backend(fmt)
    if name is None:
        raise ModelError(f"{path}: unsupported model file", "give a bundle directory, a .tflite or an .onnx file")
    row = BACKENDS[name]
    cls = resolve(row.adapter, row.install_hint)
    return cls(path, **{**row.defaults, **options})


def describe_runtime(info: dict) -> str:
    """One line saying what really runs (backend, delegate/providers, node coverage, threads)."""
    parts = [f"{info.get('backend')} {info.get('version')}"]
    if "delegate_requested" in info:
        if info.get("delegate_applied"):
            parts.append(
                f"{info['delegate_requested']} ({info['delegated_nodes']}/{info['total_nodes']} nodes delegated)"
            )
        else:
            parts.append(f"{info['delegate_requested']} (no delegate applied; built-in CPU kernels)")
    if "providers_used" in info:
        parts.append("providers " + ",".join(info["providers_used"]))
    if info.get("num_threads"):
        parts.append(f"{info['num_threads']} thread(s)")
    if info.get("init_ms") is not None:
        parts.append(f"init {info['init_ms']:.1f} ms")
    return ", ".join(parts)
