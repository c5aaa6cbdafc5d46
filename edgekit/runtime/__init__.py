"""Device-side runtimes: one adapter per backend behind one small contract.

Every adapter is a context manager with ``infer(tensor) -> list[np.ndarray]`` (arrays the
caller owns), ``input_spec``, ``describe()`` and ``close()``. Adapters import their backend
library lazily and never import TensorFlow.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from edgekit.imaging.image import InputSpec
from edgekit.runtime.backends import Backend
from edgekit.runtime.registry import BACKENDS, check_options, default_backend, install_hint, known_adapters

__all__ = ["BACKENDS", "Backend", "Runtime", "check_options", "describe_runtime", "open_runtime"]

if TYPE_CHECKING:
    from edgekit.bundle import Bundle


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


def open_runtime(source: str | Path | Bundle, model: str | None = None, backend: str | None = None,
                 allow_rejected: bool = False, **options: Any) -> Runtime:
    """Open a runtime for a bundle (a directory, or a :class:`~edgekit.bundle.Bundle` already
    loaded, so its files are not hashed again) or a bare ``.tflite``/``.onnx`` file.

    For a bundle, the adapter and its options come from edgekit.json (bundle-wide options, then
    the model entry's own); keyword ``options`` override them (e.g. ``num_threads=1``,
    ``delegate="none"``, ``device="usb:0"``, ``providers=["cpu"]``). ``backend`` (a key of
    :data:`BACKENDS`, e.g. ``"onnxruntime"`` or ``"tensorrt"``) swaps the adapter for models of
    the formats it runs; the bundle's adapter options are then not applied. A bundle that
    failed its accuracy gate is refused unless ``allow_rejected``.

    Every option is checked against the adapter's ``OPTIONS``: one the adapter does not take,
    or a value it cannot use, raises BundleError when edgekit.json holds it and UsageError when
    the caller passed it, naming the key and the options the adapter takes.
    """
    from edgekit.bundle import Bundle, load_bundle
    from edgekit.errors import ModelError, UsageError
    from edgekit.util.plugins import resolve

    if backend is not None and backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}", f"choose one of: {', '.join(BACKENDS)}")
    if isinstance(source, Bundle):  # loaded (and checked) by the caller: its allow_rejected stands
        return _open_bundle_model(source, model, backend, options)
    path = Path(source)
    if path.is_dir():
        bundle = load_bundle(path, allow_rejected=allow_rejected)
        return _open_bundle_model(bundle, model, backend, options)
    if not path.is_file():
        raise ModelError(f"model {path} does not exist", "give a bundle directory, a .tflite or an .onnx file")
    fmt = _format_of(path)
    name = backend if backend and fmt in BACKENDS[backend].formats else default_backend(fmt)
    if name is None:
        source_model = path.suffix.lower() in (".keras", ".h5", ".pb")  # a training format: build it first
        why = " (a model to build, not to run)" if source_model else ""
        raise ModelError(f"{path}: unsupported model file{why}",
                         f"edgekit build --model {path.name} --target cpu --calib DIR, then run the bundle"
                         if source_model else "give a bundle directory, a .tflite or an .onnx file")
    row = BACKENDS[name]
    cls = resolve(row.adapter, row.install_hint)
    options = check_options(cls, options, UsageError)
    return cls(path, **{**row.defaults, **options})


# Entry options that describe the model file rather than how one adapter runs it: they survive
# a --backend swap (the FP16 ONNX is still FP16 for TensorRT), where the options do not.
_MODEL_FACTS = ("precision",)


def _open_bundle_model(bundle: Bundle, model: str | None, backend: str | None, options: dict[str, Any]) -> Runtime:
    """Open one model of a loaded bundle: pick the adapter, merge and check the options."""
    from edgekit.bundle import MANIFEST
    from edgekit.errors import BundleError, UsageError
    from edgekit.util.plugins import resolve

    entry = bundle.model(model)
    adapter = bundle.runtime.get("adapter", BACKENDS["litert"].adapter)
    entry_options = entry.extra.get("runtime_options", {})
    if not isinstance(bundle.runtime.get("options", {}), dict) or not isinstance(entry_options, dict):
        raise BundleError(f"{bundle.path}/{MANIFEST}: runtime options are not an object", "rebuild the bundle")
    from_bundle = {**bundle.runtime.get("options", {}), **entry_options}
    defaults: dict[str, Any] = {}
    if backend and entry.format in BACKENDS[backend].formats:
        adapter, defaults = BACKENDS[backend].adapter, BACKENDS[backend].defaults
        from_bundle = {k: v for k, v in entry_options.items() if k in _MODEL_FACTS}
    if adapter not in known_adapters():
        # A copied bundle must not choose what gets imported and called on the device.
        raise BundleError(f"{bundle.path}: unknown runtime adapter {adapter!r}",
                          f"adapters are: {', '.join(known_adapters())}; rebuild the bundle")
    cls = resolve(adapter, install_hint(adapter))
    if defaults:  # a swapped-in backend keeps only the model facts its adapter takes
        taken = {o.name for o in getattr(cls, "OPTIONS", ())}
        from_bundle = {k: v for k, v in from_bundle.items() if k in taken}
    from_bundle = check_options(cls, from_bundle, BundleError, f"{bundle.path}/{MANIFEST}: ",
                                "fix the runtime options in edgekit.json, or rebuild the bundle")
    options = check_options(cls, options, UsageError)
    runtime = cls(bundle.path / entry.file, input_spec=entry.input, **{**defaults, **from_bundle, **options})
    conform = getattr(runtime, "conform_outputs", None)
    if callable(conform):  # a sensor's outputs (the IMX500) are held to the shapes the bundle recorded
        try:
            conform([o.get("shape") if isinstance(o, dict) else None for o in entry.outputs])
        except BaseException:
            runtime.close()
            raise
    return runtime


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
    if info.get("simulation"):  # outputs as the device gives them; the timings are this host's
        parts.append(f"SIMULATION ({info.get('note') or 'not device speed'})")
    if info.get("num_threads"):
        parts.append(f"{info['num_threads']} thread(s)")
    if info.get("init_ms") is not None:
        parts.append(f"init {info['init_ms']:.1f} ms")
    return ", ".join(parts)
