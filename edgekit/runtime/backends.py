"""The table of runtime backends: one row per ``--backend`` name, as fsspec keeps its filesystems.

A row names its adapter as a dotted ``"module:Class"`` path (imported only when that backend
is opened, so importing edgekit never loads a backend it will not use), the install hint shown
when its library is missing, the model formats it runs and the options it starts from.

The table is also the allowlist of adapters a bundle's ``edgekit.json`` may name: a copied
bundle must never choose what gets imported and called on the device.
"""

from __future__ import annotations

from typing import Any, NamedTuple

_GPU_ORT_HINT = "pip install 'edgekit[jetson]' (onnxruntime-gpu) on a machine with an NVIDIA GPU"


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
        "pip install 'edgekit[litert]'", "LiteRT (XNNPACK, or the Edge TPU delegate)",
    ),
    "onnxruntime": Backend(
        "edgekit.runtime.onnxrt:OnnxRuntime", ("onnx",), {"providers": ["cpu"]},
        "pip install 'edgekit[onnx]'", "ONNX Runtime on the CPU",
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


def known_adapters() -> list[str]:
    """Every adapter a bundle may name (the ``adapter`` of some row), sorted."""
    return sorted({b.adapter for b in BACKENDS.values()})


def install_hint(adapter: str) -> str | None:
    """The install hint of the first row whose adapter is ``adapter``."""
    return next((b.install_hint for b in BACKENDS.values() if b.adapter == adapter), None)


def default_backend(fmt: str) -> str | None:
    """The backend that opens a bare model file of format ``fmt`` (the first row running it)."""
    return next((name for name, b in BACKENDS.items() if fmt in b.formats), None)
