"""The table of runtime backends: one row per ``--backend`` name, as fsspec keeps its filesystems.

A row names its adapter as a dotted ``"module:Class"`` path (imported only when that backend
is opened, so importing edgekit never loads a backend it will not use), the install hint shown
when its library is missing, the model formats it runs and the options it starts from.

The table is also the allowlist of adapters a bundle's ``edgekit.json`` may name: a copied
bundle must never choose what gets imported and called on the device.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from edgekit.errors import UnknownOptionError, UsageError

_GPU_ORT_HINT = "pip install 'edgekit-vision[jetson]' (onnxruntime-gpu) on a machine with an NVIDIA GPU"


@dataclass(frozen=True)
class Option:
    """One option an adapter takes: its name, accepted types, default, and allowed values or range.

    Adapters list theirs in an ``OPTIONS`` class attribute; :func:`check_options` holds merged
    bundle and caller options against it, so a typo is an error instead of silently nothing.
    """

    name: str
    kinds: tuple[type, ...]
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not fit this option, or None when it does (None always fits:
        it leaves the choice to the adapter)."""
        if value is None:
            return None
        if self.choices:
            return None if value in self.choices else f"is not one of: {', '.join(map(str, self.choices))}"
        number = _as_kind(value, self.kinds)
        if number is _NOT:
            return f"must be {' or '.join(k.__name__ for k in self.kinds)}"
        if isinstance(number, float) and not math.isfinite(number):
            return "must be a finite number"
        if self.minimum is not None and isinstance(number, (int, float)) and number < self.minimum:
            return f"must be at least {self.minimum:g}"
        if self.maximum is not None and isinstance(number, (int, float)) and number > self.maximum:
            return f"must be at most {self.maximum:g}"
        return None


_NOT = object()


def _as_kind(value: Any, kinds: tuple[type, ...]) -> Any:
    """``value`` as the first kind it fits, or ``_NOT``. Numbers may come as text (``--device 0``)."""
    if isinstance(value, bool):  # bool is an int subclass; only a declared bool takes it
        return value if bool in kinds else _NOT
    for kind in kinds:
        if isinstance(value, kind) or (kind is float and isinstance(value, int)):
            return value
    for kind in (int, float):
        if kind in kinds and isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
    return _NOT


def check_options(adapter: type, options: Mapping[str, Any], error: type[Exception], where: str = "",
                  hint: str = "") -> dict[str, Any]:
    """``options`` checked against ``adapter.OPTIONS``, numbers given as text converted.

    Raises ``error`` (one line) for the first option ``adapter`` does not declare or whose value
    does not fit; the message names the key and the options the adapter takes.
    """
    declared = {o.name: o for o in getattr(adapter, "OPTIONS", ())}
    checked = {}
    for key, value in options.items():
        if key not in declared:
            close = difflib.get_close_matches(key, declared, n=1, cutoff=0.75)
            message = f"{where}{adapter.__name__} takes no option {key!r} (it takes: {', '.join(sorted(declared))})"
            others = _backends_taking(key)
            if close:
                fix = f"did you mean {close[0]!r}?"
            elif others:
                fix = f"{key} is an option of the {', '.join(others)} backend(s); this model runs on {adapter.__name__}"
            else:
                fix = hint or None
            if error is UsageError:  # a caller's key: say which, so a mixed bench can apply it where taken
                raise UnknownOptionError(message, fix, key)
            raise error(message, fix)
        why = declared[key].problem(value)
        if why:
            raise error(f"{where}{adapter.__name__} option {key}={value!r} {why}",
                        hint or f"give {key} a value that fits ({declared[key].help or 'see --help'})")
        checked[key] = value if value is None or declared[key].choices else _as_kind(value, declared[key].kinds)
    return checked


PATH = (str, os.PathLike)
"""Kinds of an option naming a file or directory."""

MAX_THREADS = (os.cpu_count() or 1) * 4
"""The most CPU threads an adapter takes: more only slows inference down, and a copied bundle
asking LiteRT for 100000 crashed the process (every thread's stack is reserved at start)."""
MAX_MIB = 1 << 20
"""The largest memory size in MiB an option takes (1 TiB): a larger one is a typo."""
MAX_INDEX = 255
"""The largest device index an option takes."""


class Backend(NamedTuple):
    """One row of :data:`BACKENDS`.

    A tuple so that ``BACKENDS[name][1]`` (the formats) keeps working for older callers.
    """

    adapter: str  # "package.module:Class"
    formats: tuple[str, ...]  # model formats it runs ("tflite", "onnx")
    defaults: dict[str, Any]  # options it starts from, before the caller's
    install_hint: str  # what to install when its library is missing
    summary: str = ""


# A backend replaces the bundle's adapter only for models of its formats, so one bench command
# can mix a TFLite bundle with `--backend onnxruntime` for an ONNX one. For a bare model file,
# the first row that runs its format is the default.
BACKENDS: dict[str, Backend] = {
    "litert": Backend(
        "edgekit.runtime.litert:LiteRTRuntime", ("tflite",), {},
        "pip install 'edgekit-vision[litert]'", "LiteRT (XNNPACK, or the Edge TPU delegate)",
    ),
    "onnxruntime": Backend(
        "edgekit.runtime.onnxrt:OnnxRuntime", ("onnx",), {"providers": ["cpu"]},
        "pip install 'edgekit-vision[onnx]'", "ONNX Runtime on the CPU",
    ),
    "onnxruntime-cuda": Backend(
        "edgekit.runtime.onnxrt_gpu:OnnxRuntimeGPU", ("onnx",), {"providers": ["cuda"]},
        _GPU_ORT_HINT, "ONNX Runtime, CUDA execution provider",
    ),
    "onnxruntime-trt": Backend(
        "edgekit.runtime.onnxrt_gpu:OnnxRuntimeGPU", ("onnx",), {"providers": ["tensorrt", "cuda"]},
        _GPU_ORT_HINT, "ONNX Runtime, TensorRT then CUDA execution providers",
    ),
    "tensorrt": Backend(
        "edgekit.runtime.tensorrt:TensorRTRuntime", ("onnx",), {"precision": "fp16"},
        "TensorRT ships with JetPack (sudo apt install nvidia-jetpack); pip install cuda-python",
        "TensorRT engine built on this device",
    ),
}


def _backends_taking(key: str) -> list[str]:
    """Backends whose adapter declares option ``key`` (those whose adapter module imports here)."""
    import importlib

    names = []
    for name, row in BACKENDS.items():
        module, _, cls = row.adapter.partition(":")
        try:
            options = getattr(getattr(importlib.import_module(module), cls), "OPTIONS", ())
        except (ImportError, AttributeError):  # an adapter module is lazy about its library: rarely hit
            continue
        if any(o.name == key for o in options):
            names.append(name)
    return names


def known_adapters() -> list[str]:
    """Every adapter a bundle may name (the ``adapter`` of some row), sorted."""
    return sorted({b.adapter for b in BACKENDS.values()})


def install_hint(adapter: str) -> str | None:
    """The install hint of the first row whose adapter is ``adapter``."""
    return next((b.install_hint for b in BACKENDS.values() if b.adapter == adapter), None)


def default_backend(fmt: str) -> str | None:
    """The backend that opens a bare model file of format ``fmt`` (the first row running it)."""
    return next((name for name, b in BACKENDS.items() if fmt in b.formats), None)
