"""TensorRT adapter: run an engine built on this device, with trtexec-style stage timings.

Opening an ``.onnx`` (normally the bundle's FP16 model) builds the engine the first time
and reuses the cached plan afterwards (:mod:`edgekit.runtime.trt_engine`); a ``.plan`` /
``.engine`` file is loaded as is. Inference uses TensorRT's named-tensor API: every I/O
tensor gets a device buffer bound once with ``set_tensor_address``, and each
:meth:`TensorRTRuntime.infer` is

    copy into the pinned input buffer -> H2D copy -> ``execute_async_v3`` -> D2H copies -> sync

on one CUDA stream, with CUDA events between the stages, so the H2D, compute and D2H times
are measured on the GPU's clock as ``trtexec`` reports them. CUDA comes from cuda-python
(``cuda.bindings.runtime``, or ``cuda.cudart`` for cuda-python < 12.6).

    >>> with TensorRTRuntime("dist/demo-jetson/demo_fp16.onnx", input_spec=spec) as rt:  # doctest: +SKIP
    ...     scores = rt.infer(tensor)[0]          # first open on a device: builds the engine
    ...     rt.describe()["precision_used"]       # what the engine inspector saw, e.g. "fp16"
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import edgekit.runtime.trt_build as trt_build  # not `from edgekit.runtime`: its registry names this module
import edgekit.runtime.trt_cache as trt_cache
import edgekit.runtime.trt_engine as trt_engine
from edgekit.errors import BackendUnavailable, DeviceError, ModelError
from edgekit.imaging.image import InputSpec
from edgekit.metrics import LatencyRecorder
from edgekit.runtime.backends import MAX_INDEX, MAX_MIB
from edgekit.util.optionspec import Option, defaults

STAGES = ("h2d", "compute", "d2h", "host")
"""Timed stages: the three GPU stages (CUDA events) and the host wall time of ``infer``."""


@dataclass
class _Binding:
    """One I/O tensor: its name, shape, dtype and its pinned host and device buffers."""

    name: str
    is_input: bool
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    host_ptr: int
    device_ptr: int
    host: np.ndarray


class TensorRTRuntime:
    """Run a TensorRT engine (built here from ONNX, or a ready plan) on one CUDA stream.

    Args:
        model_path: ``.onnx`` (engine built or reused from the cache), ``.plan``/``.engine``,
            or a bundle directory (its default model).
        input_spec: the bundle's input description; its shape fixes the engine's input shape.
        precision: ``fp16`` (default) or ``fp32``, for a build from ONNX.
        workspace_mb: TensorRT workspace pool limit for a build.
        cache_dir: where engines are cached (default: ``<bundle>/.engines``).
        rebuild: rebuild the engine even if a valid cached one exists.
        device: CUDA device index.
        warmup: stage timings of the first ``warmup`` inferences are set aside.

    ``infer`` returns new arrays the caller owns (copies of the pinned output buffers).
    One instance owns one execution context and one stream; ``infer`` holds a lock, so
    concurrent callers are serialised rather than corrupting each other's buffers. Opening
    is slow the first time on a device (the engine build); later opens take about a second.
    Any other keyword is an error (see :attr:`OPTIONS`).
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("precision", "str", "fp16", "engine precision for a build from ONNX", choices=trt_build.PRECISIONS),
        Option("workspace_mb", "int", trt_build.WORKSPACE_MB, "workspace pool limit (MiB)", ge=1, le=MAX_MIB),
        Option("cache_dir", "path", None, "engine cache directory (default: <bundle>/.engines)"),
        Option("rebuild", "bool", False, "rebuild the engine even if a cached one is valid"),
        Option("device", "int", 0, "CUDA device index", ge=0, le=MAX_INDEX),
        Option("warmup", "int", 1, "inferences left out of the stage timings", ge=0, le=10000),
    )
    _DEFAULT = defaults(OPTIONS)  # the keyword defaults below come from the spec, never a second copy

    def __init__(
        self,
        model_path: str | Path,
        input_spec: InputSpec | None = None,
        precision: str = _DEFAULT["precision"],
        workspace_mb: int = _DEFAULT["workspace_mb"],
        cache_dir: str | Path | None = _DEFAULT["cache_dir"],
        rebuild: bool = _DEFAULT["rebuild"],
        device: int = _DEFAULT["device"],
        warmup: int = _DEFAULT["warmup"],
    ):
        path = Path(model_path)
        if path.is_dir():
            from edgekit.bundle import load_bundle

            entry = load_bundle(path, allow_rejected=True).model()
            path, input_spec = path / entry.file, input_spec or entry.input
        if not path.is_file():
            raise ModelError(f"model {path} does not exist")
        self._closed = True  # until every resource below exists; makes close() safe on failure
        self._bindings: list[_Binding] = []
        self._events: list[Any] = []
        self._stream = None
        self._context = self._engine = self._runtime = None
        self._lock = threading.Lock()
        trt = trt_engine.import_tensorrt()
        cudart = trt_engine.import_cudart()
        self._trt, self._cudart = trt, cudart
        self.model_path = path
        self.device = int(device)
        t0 = time.perf_counter_ns()
        # Select the device before a possible build: TensorRT builds for the current device.
        trt_engine.cuda_call(cudart, cudart.cudaSetDevice(self.device), "cudaSetDevice")
        shape = tuple(input_spec.shape) if input_spec is not None else None
        self._find_plan(path, shape, precision, cache_dir, workspace_mb, rebuild)
        self.gpu = trt_engine.gpu_info(cudart, self.device)
        try:
            self._open(trt, cudart, shape)
        except BaseException:
            self._closed = False
            self.close()
            raise
        self.init_ms = (time.perf_counter_ns() - t0) / 1e6
        self.input_spec = self._spec(input_spec)
        self._timers = {s: LatencyRecorder(s, warmup=warmup) for s in STAGES}
        self.last_timings_ms: dict[str, float] = {}

    # ------------------------------------------------------------------ setup

    def _find_plan(self, path: Path, shape: tuple[int, ...] | None, precision: str, cache_dir: str | Path | None,
                   workspace_mb: int, rebuild: bool) -> None:
        """Set ``plan_path``, its sidecar ``record`` and how it was obtained: built or reused from
        the cache for an ``.onnx``, taken as is for a plan file."""
        if path.suffix == ".onnx":
            engine = trt_engine.load_or_build(path, shape, precision, cache_dir, workspace_mb, rebuild, self.device,
                                              trt=self._trt, cudart=self._cudart)
            self.plan_path, self.record = engine.plan_path, engine.record
            self.engine_built, self.engine_reason = engine.built, engine.reason
            self.precision_requested = precision
        elif path.suffix in (".plan", ".engine", ".trt"):
            self.plan_path, self.record = path, trt_cache.read_sidecar(path) or {}
            self.engine_built, self.engine_reason = False, "plan file given"
            self.precision_requested = self.record.get("precision", {}).get("requested", "unknown")
        else:
            raise ModelError(f"{path}: TensorRT runs .onnx, .plan or .engine files")

    def _open(self, trt: Any, cudart: Any, shape: tuple[int, ...] | None) -> None:
        call = trt_engine.cuda_call
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = self._runtime.deserialize_cuda_engine(self.plan_path.read_bytes())
        if engine is None:
            raise ModelError(
                f"TensorRT {trt.__version__} cannot load {self.plan_path.name} (built for another TensorRT "
                "version or GPU?)",
                "open the .onnx instead (the engine is rebuilt), or pass rebuild=True",
            )
        self._engine = engine
        self._context = engine.create_execution_context()
        self._closed = False
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        if len(inputs) != 1:
            raise ModelError(f"{self.plan_path.name} has {len(inputs)} inputs; edgekit runs single-input models")
        engine_shape = tuple(engine.get_tensor_shape(inputs[0]))
        if any(d < 0 for d in engine_shape):  # dynamic input: pin it to the bundle's shape
            if shape is None:
                raise ModelError(
                    f"input {inputs[0]!r} is dynamic {list(engine_shape)} and no input shape was given",
                    "open the model through its bundle",
                )
            if not self._context.set_input_shape(inputs[0], shape):
                raise ModelError(f"the engine rejects input shape {list(shape)}", "rebuild the engine")
        self._stream = call(cudart, cudart.cudaStreamCreate(), "cudaStreamCreate")
        self._events = [call(cudart, cudart.cudaEventCreate(), "cudaEventCreate") for _ in range(4)]
        for name in names:  # bind in the engine's I/O order, each by name
            dims = tuple(int(d) for d in self._context.get_tensor_shape(name))
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            nbytes = max(1, int(np.prod(dims, dtype=np.int64)) * dtype.itemsize)
            host_ptr = call(cudart, cudart.cudaMallocHost(nbytes), "cudaMallocHost")
            try:
                device_ptr = call(cudart, cudart.cudaMalloc(nbytes), "cudaMalloc")
            except BackendUnavailable:
                cudart.cudaFreeHost(host_ptr)
                raise
            raw = (ctypes.c_ubyte * nbytes).from_address(int(host_ptr))
            host = np.frombuffer(raw, dtype=dtype, count=int(np.prod(dims, dtype=np.int64))).reshape(dims)
            binding = _Binding(name, name in inputs, dims, dtype, nbytes, int(host_ptr), int(device_ptr), host)
            self._bindings.append(binding)
            if not self._context.set_tensor_address(name, binding.device_ptr):
                raise ModelError(f"TensorRT refused the buffer for tensor {name!r}")
        self._input = next(b for b in self._bindings if b.is_input)
        by_name = {b.name: b for b in self._bindings if not b.is_input}
        # Engines may list outputs in another order than the ONNX graph: return them in the
        # graph's order (recorded in the sidecar at build time) so output 0 means the same everywhere.
        order = [n for n in self.record.get("outputs", []) if n in by_name]
        order += [n for n in by_name if n not in order]
        self._outputs = [by_name[n] for n in order]

    def _spec(self, given: InputSpec | None) -> InputSpec:
        b = self._input
        dtype = b.dtype.name
        if given is not None:
            d = given.to_dict()
            d.update(shape=list(b.shape), dtype=dtype, name=b.name)
            return InputSpec.from_dict(d)
        shape = b.shape
        layout = "NCHW" if len(shape) == 4 and shape[1] in (1, 3) and shape[3] not in (1, 3) else "NHWC"
        spec = InputSpec(shape=shape, dtype=dtype, layout=layout, name=b.name)
        return InputSpec.from_dict({**spec.to_dict(), "colour": "gray" if spec.channels == 1 else "rgb"})

    # ------------------------------------------------------------------ inference

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        """Run one inference on a tensor shaped like ``input_spec``; returns arrays the caller owns."""
        if self._closed:
            raise ModelError("TensorRTRuntime used after close()")
        tensor = np.asarray(tensor)
        if tuple(tensor.shape) != self._input.shape:
            raise ModelError(
                f"input shape {list(tensor.shape)} != engine input {list(self._input.shape)}",
                "preprocess with edgekit.Preprocessor(runtime.input_spec)",
            )
        cudart, call = self._cudart, trt_engine.cuda_call
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        e0, e1, e2, e3 = self._events
        with self._lock:
            t0 = time.perf_counter_ns()
            np.copyto(self._input.host, tensor, casting="same_kind")
            call(cudart, cudart.cudaEventRecord(e0, self._stream), "cudaEventRecord")
            call(
                cudart,
                cudart.cudaMemcpyAsync(
                    self._input.device_ptr, self._input.host_ptr, self._input.nbytes, h2d, self._stream
                ),
                "cudaMemcpyAsync H2D",
            )
            call(cudart, cudart.cudaEventRecord(e1, self._stream), "cudaEventRecord")
            if not self._context.execute_async_v3(int(self._stream)):
                raise DeviceError("TensorRT execute_async_v3 failed", "TensorRT's log above says why")
            call(cudart, cudart.cudaEventRecord(e2, self._stream), "cudaEventRecord")
            for b in self._outputs:
                call(
                    cudart,
                    cudart.cudaMemcpyAsync(b.host_ptr, b.device_ptr, b.nbytes, d2h, self._stream),
                    "cudaMemcpyAsync D2H",
                )
            call(cudart, cudart.cudaEventRecord(e3, self._stream), "cudaEventRecord")
            call(cudart, cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
            out = [b.host.copy() for b in self._outputs]  # copies: the pinned buffers are reused
            host_ns = time.perf_counter_ns() - t0
            ms = {
                "h2d": call(cudart, cudart.cudaEventElapsedTime(e0, e1), "cudaEventElapsedTime"),
                "compute": call(cudart, cudart.cudaEventElapsedTime(e1, e2), "cudaEventElapsedTime"),
                "d2h": call(cudart, cudart.cudaEventElapsedTime(e2, e3), "cudaEventElapsedTime"),
                "host": host_ns / 1e6,
            }
        self.last_timings_ms = {k: float(v) for k, v in ms.items()}
        for stage, value in self.last_timings_ms.items():
            self._timers[stage].add(int(value * 1e6))
        return out

    def stage_summary(self) -> dict[str, dict[str, float]]:
        """Statistics (ms) of each stage over the kept inferences, like trtexec's H2D Latency,
        GPU Compute Time and D2H Latency; ``host`` is the wall time of ``infer`` itself."""
        return {s: r.summary().to_dict() for s, r in self._timers.items() if len(r)}

    # ------------------------------------------------------------------ contract

    def describe(self) -> dict[str, Any]:
        """Backend, version, GPU, how the engine was obtained and the precision really used."""
        precision = self.record.get("precision", {})
        cuda_version = None
        with contextlib.suppress(BackendUnavailable, AttributeError):  # informational only
            cuda_version = trt_engine.cuda_call(self._cudart, self._cudart.cudaRuntimeGetVersion())
        return {
            "backend": "tensorrt",
            "version": str(self._trt.__version__),
            "model": self.model_path.name,
            "engine": str(self.plan_path),
            "engine_built_now": self.engine_built,
            "engine_reason": self.engine_reason,
            "build_seconds": self.record.get("build_seconds"),
            "typing": self.record.get("typing"),
            "precision_requested": self.precision_requested,
            "precision_used": precision.get("used", "unknown"),
            "layer_precisions": precision.get("layers", {}),
            "gpu": self.gpu.name,
            "compute_capability": self.gpu.compute_capability,
            "device": self.device,
            "cuda_runtime": cuda_version,
            "api": "named tensors (set_tensor_address + execute_async_v3), pinned host buffers, one stream",
            "init_ms": round(self.init_ms, 3),
            "input": {"name": self._input.name, "dtype": self._input.dtype.name, "shape": list(self._input.shape)},
            "outputs": [b.name for b in self._outputs],
            "stage_ms": self.stage_summary(),
        }

    def close(self) -> None:
        """Free the buffers, events and stream, then the context and engine. Idempotent."""
        if self._closed:
            return
        self._closed = True
        cudart = self._cudart
        if self._stream is not None:
            cudart.cudaStreamSynchronize(self._stream)
        for b in self._bindings:
            cudart.cudaFree(b.device_ptr)
            cudart.cudaFreeHost(b.host_ptr)
        self._bindings = []
        for e in self._events:
            cudart.cudaEventDestroy(e)
        self._events = []
        if self._stream is not None:
            cudart.cudaStreamDestroy(self._stream)
            self._stream = None
        # The context must go before the engine, and the engine before the runtime.
        self._context = None
        self._engine = None
        self._runtime = None

    def __enter__(self) -> TensorRTRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
