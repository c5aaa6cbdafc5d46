"""The table of runtime backends: one row per ``--backend`` name, as fsspec's registry keeps its filesystems.

A row names its adapter as a dotted ``"module:Class"`` path (imported only when that backend
is opened, so importing edgekit never loads a backend it will not use), the install hint shown
when its library is missing, the model formats it runs and the options it starts from. The
adapters never import this module (they take their row type and limits from
:mod:`edgekit.runtime.backends`), so the table can name them without a cycle.

The table is also the allowlist of adapters a bundle's ``edgekit.json`` may name: a copied
bundle must never choose what gets imported and called on the device.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from edgekit.errors import UnknownOptionError, UsageError
from edgekit.runtime.backends import Backend
from edgekit.util.optionspec import OptionValueError, by_name, close_match

_GPU_ORT_HINT = "pip install 'edgekit-vision[jetson]' (onnxruntime-gpu) on a machine with an NVIDIA GPU"

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
    "rknn-lite": Backend(
        "edgekit.runtime.rknn_lite:RknnLiteRuntime", ("rknn",), {},
        "pip install rknn-toolkit-lite2 on the Rockchip board", "Rockchip NPU (RK3588 and kin) via RKNNLite",
    ),
    "rknn-sim": Backend(
        "edgekit.runtime.rknn_sim:RknnSimRuntime", ("rknn",), {},
        "edgekit toolchain install rk3588", "RKNN-Toolkit2's simulator on the host (a simulation, not NPU speed)",
    ),
    "imx500": Backend(
        "edgekit.runtime.imx500:Imx500Runtime", ("imx500", "rpk"), {},
        "on the Pi: sudo apt install imx500-all python3-picamera2", "Sony IMX500 in the Raspberry Pi AI Camera",
    ),
}


def check_options(adapter: type, options: Mapping[str, Any], error: type[Exception], where: str = "",
                  hint: str = "") -> dict[str, Any]:
    """``options`` checked against ``adapter.OPTIONS`` (:class:`~edgekit.util.optionspec.Option`),
    numbers given as text converted.

    Raises ``error`` (one line) for the first option ``adapter`` does not declare or whose value
    does not fit; the message names the key and the options the adapter takes.
    """
    declared = by_name(getattr(adapter, "OPTIONS", ()))
    checked = {}
    for key, value in options.items():
        if key not in declared:
            close = close_match(key, declared, cutoff=0.75)
            message = f"{where}{adapter.__name__} takes no option {key!r} (it takes: {', '.join(sorted(declared))})"
            others = _backends_taking(key)
            if close:
                fix = f"did you mean {close!r}?"
            elif others:
                fix = f"{key} is an option of the {', '.join(others)} backend(s); this model runs on {adapter.__name__}"
            else:
                fix = hint or None
            if error is UsageError:  # a caller's key: say which, so a mixed bench can apply it where taken
                raise UnknownOptionError(message, fix, key)
            raise error(message, fix)
        try:
            checked[key] = declared[key].coerce(value)
        except OptionValueError as exc:
            why = f"is not {exc.what}" if declared[key].choices else f"must be {exc.what}"
            raise error(f"{where}{adapter.__name__} option {key}={value!r} {why}",
                        hint or f"give {key} a value that fits ({declared[key].help or 'see --help'})") from None
    return checked


def _backends_taking(key: str) -> list[str]:
    """Backends whose adapter declares option ``key`` (those whose adapter module imports here)."""
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
