"""Build, or reuse, a TensorRT engine from an ONNX model on the device that will run it.

An engine (a "plan") is specific to one GPU and one TensorRT version, so a bundle carries
ONNX and the engine is built on the Jetson the first time the model is opened (this takes
seconds to minutes), then cached. :func:`load_or_build` ties the two halves together:

* :mod:`edgekit.runtime.trt_cache`: where engines live, their cache key and JSON sidecar,
  atomic writes, the build lock, and whether a cached plan can be reused;
* :mod:`edgekit.runtime.trt_build`: parsing the ONNX, building the plan (TensorRT 10 and
  11+ paths) and checking which precision the engine really runs in.

This module also loads the libraries (lazily: importing edgekit never loads TensorRT or
CUDA); callers take the cache's and the build's own names from :mod:`edgekit.runtime.trt_cache`
and :mod:`edgekit.runtime.trt_build`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekit.errors import DeviceError, ModelError, UsageError
from edgekit.runtime.trt_build import (
    PRECISIONS,
    WORKSPACE_MB,
    BuildResult,
    build_plan,
    inspect_plan,
    summarize_precision,
)
from edgekit.runtime.trt_cache import (
    SIDECAR_FORMAT,
    SIDECAR_VERSION,
    Engine,
    EngineKey,
    GpuInfo,
    build_lock,
    cached_engine,
    engine_cache_dir,
    engine_key,
    plan_path_for,
    sha256_bytes,
    store_engine,
    timing_cache_path,
)

log = logging.getLogger(__name__)

TRT_HINT = (
    "TensorRT ships with JetPack: sudo apt install nvidia-jetpack (or python3-libnvinfer); "
    "it is not installable from PyPI on a Jetson. Elsewhere, run the ONNX model on the CPU: --backend onnxruntime"
)
CUDA_HINT = "pip install cuda-python (major version matching the CUDA of your JetPack, e.g. 'cuda-python<13')"


# --------------------------------------------------------------------------------------------
# Importing the backend libraries (lazily: importing edgekit never loads TensorRT or CUDA)


def import_tensorrt() -> Any:
    """Return the ``tensorrt`` module, or raise DeviceError with the install hint: TensorRT is the
    accelerator's runtime (it comes with JetPack), so its absence exits 1 as a missing CUDA provider does."""
    try:
        import tensorrt
    except ImportError as exc:
        raise DeviceError("TensorRT's Python bindings (tensorrt) are not installed", TRT_HINT) from exc
    return tensorrt


def import_cudart() -> Any:
    """Return cuda-python's runtime bindings: ``cuda.bindings.runtime`` (cuda-python >= 12.6,
    the only place in 13), else the older ``cuda.cudart``; DeviceError (exit 1) when neither is installed."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError as exc:
            raise DeviceError("cuda-python is not installed", CUDA_HINT) from exc
    return cudart


def cuda_call(cudart: Any, result: Any, what: str = "CUDA call") -> Any:
    """Unpack a cuda-python result ``(err, *values)``; raise DeviceError unless err is 0.

    Returns None, the single value, or a tuple of values.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(getattr(err, "value", err)) != 0:
        name = getattr(err, "name", str(err))
        with contextlib.suppress(Exception):  # the name lookup is a nicety; never mask the real error
            name = cudart.cudaGetErrorName(err)[1].decode()
        raise DeviceError(
            f"{what} failed: {name}", "check the GPU with `edgekit doctor` (driver, CUDA, free memory)"
        )
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def gpu_info(cudart: Any, device: int = 0) -> GpuInfo:
    """Name and compute capability of CUDA device ``device``."""
    count = cuda_call(cudart, cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
    if not count or device >= count:
        raise DeviceError(f"no CUDA device {device} (found {count or 0})", "check the GPU with `edgekit doctor`")
    props = cuda_call(cudart, cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = props.name
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
    return GpuInfo(name=str(name).strip(), compute_capability=f"{props.major}.{props.minor}", index=device)



# --------------------------------------------------------------------------------------------
# Cache lookup, else build


def load_or_build(
    onnx_path: str | Path,
    shape: tuple[int, ...] | None = None,
    precision: str = "fp16",
    cache_dir: str | Path | None = None,
    workspace_mb: int = WORKSPACE_MB,
    rebuild: bool = False,
    device: int = 0,
    trt: Any = None,
    cudart: Any = None,
) -> Engine:
    """Return a cached engine for ``onnx_path`` on this device, building it if needed.

    Args:
        onnx_path: the ONNX model (inside a bundle, engines go to ``<bundle>/.engines/``).
        shape: the bundle's static input shape (batch included).
        precision: ``fp16`` (default) or ``fp32``.
        cache_dir: override where engines are cached.
        workspace_mb: TensorRT workspace pool limit for a build.
        rebuild: build even if a valid cached engine exists.
        device: CUDA device index.
        trt, cudart: the modules to use (default: import them).

    The first call on a device builds (seconds to minutes, logged at WARNING level so a
    user knows why the first start is slow); later calls check the key and the plan's
    sha256 and reuse it. Safe to call from several processes at once (a file lock
    serialises builds).
    """
    trt = trt or import_tensorrt()
    cudart = cudart or import_cudart()
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise ModelError(f"model {onnx_path} does not exist")
    if precision not in PRECISIONS:
        raise UsageError(f"unknown TensorRT precision {precision!r}", f"use one of {', '.join(PRECISIONS)}")
    gpu = gpu_info(cudart, device)
    key = engine_key(trt, gpu, onnx_path, precision, shape)
    directory = engine_cache_dir(onnx_path, cache_dir)
    plan_path = plan_path_for(onnx_path, precision, directory)
    with build_lock(directory, plan_path.stem):
        record, reasons = (None, ["rebuild requested"]) if rebuild else cached_engine(plan_path, key)
        if record is not None:
            return Engine(plan_path=plan_path, record=record, built=False, reason="cached engine reused")
        reason = "; ".join(reasons)
        log.warning(
            "building the TensorRT %s engine for %s on %s (%s); this takes a while, once",
            precision,
            onnx_path.name,
            gpu.name,
            reason,
        )
        record = _build_and_store(trt, gpu, key, onnx_path, plan_path, shape, workspace_mb, reason)
        return Engine(plan_path=plan_path, record=record, built=True, reason=reason)


def _build_and_store(trt: Any, gpu: GpuInfo, key: EngineKey, onnx_path: Path, plan_path: Path,
                     shape: tuple[int, ...] | None, workspace_mb: int, reason: str) -> dict[str, Any]:
    """Build the plan, check its precision, write plan and sidecar; returns the sidecar record.

    Called with the build lock held.
    """
    timing = timing_cache_path(plan_path.parent, str(trt.__version__), gpu)
    result = build_plan(trt, onnx_path, shape, key.precision, workspace_mb, timing)
    if not key.input_shape:
        key = replace(key, input_shape=tuple(result.inputs[0]["shape"]))
    report = inspect_plan(trt, result.plan)
    used = summarize_precision(key.precision, report)
    record = sidecar_record(key, plan_path, onnx_path, result, report, used, reason, workspace_mb)
    store_engine(plan_path, result.plan, record)
    log.warning("TensorRT engine built in %.1f s (%s): %s", result.seconds, used, plan_path)
    return record


def sidecar_record(key: EngineKey, plan_path: Path, onnx_path: Path, result: BuildResult, report: dict[str, Any],
                   used: str, reason: str, workspace_mb: int) -> dict[str, Any]:
    """The sidecar of a plan just built: its key, the precision really used and the build facts."""
    return {
        "format": SIDECAR_FORMAT,
        "version": SIDECAR_VERSION,
        "key": key.to_dict(),
        "plan": plan_path.name,
        "plan_sha256": sha256_bytes(result.plan),
        "plan_bytes": len(result.plan),
        "onnx": onnx_path.name,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "build_seconds": round(result.seconds, 3),
        "rebuild_reason": reason,
        "typing": result.typing,
        "workspace_mb": int(workspace_mb),
        "timing_cache_loaded": result.timing_cache_loaded,
        "precision": {
            "requested": key.precision,
            "used": used,
            "layers": report.get("counts", {}),
            "fp32_layers": report.get("fp32_layers", [])[:50],
        },
        "inputs": result.inputs,
        "outputs": result.outputs,
        "dynamic_input": result.dynamic_input,
        "notes": result.notes,
    }
