"""ONNX Runtime on an NVIDIA GPU: the TensorRT and CUDA execution providers, with their options.

:class:`~edgekit.runtime.onnxrt.OnnxRuntime` passes bare provider names; this adapter adds
the options that matter on a Jetson:

* TensorRT EP: FP16, an engine cache and a timing cache (TensorRT EP builds its engines on
  the first run, which takes minutes without them), workspace limit; the caches live
  beside the bundle in ``.engines/ort-trt`` (or the user cache when the bundle is read-only).
* CUDA EP: device, cuDNN convolution algorithm search, memory limit.

As with the CPU adapter, a provider that is requested but not used is an error unless
``allow_fallback`` is set: ONNX Runtime itself only prints a warning and runs on the CPU.
CPUExecutionProvider is always appended as the last provider (ONNX Runtime needs it for
nodes the GPU providers do not take), but counts as "requested" only if you asked for it.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, ClassVar

import edgekit.runtime.trt_build as trt_build  # not `from edgekit.runtime`: its registry names this module
import edgekit.runtime.trt_cache as trt_cache
from edgekit.errors import DeviceError, ModelError, first_line
from edgekit.imaging.image import InputSpec
from edgekit.runtime.backends import MAX_INDEX, MAX_MIB, MAX_THREADS
from edgekit.runtime.onnxrt import OnnxRuntime, provider_names, session_options
from edgekit.runtime.onnxrt import check_providers as _check_providers
from edgekit.util.optionspec import Option, defaults

GPU_HINT = (
    "install onnxruntime-gpu (on a Jetson: the JetPack wheel from NVIDIA's Jetson AI Lab index), "
    "or pass --allow-fallback to accept the CPU"
)
DEFAULT_PROVIDERS = ("tensorrt", "cuda")


def tensorrt_ep_options(
    cache_dir: str | Path,
    fp16: bool = True,
    workspace_mb: int = trt_build.WORKSPACE_MB,
    device_id: int = 0,
    engine_cache: bool = True,
    timing_cache: bool = True,
) -> dict[str, str]:
    """Options for ``TensorrtExecutionProvider`` (ONNX Runtime wants them as strings).

    With TensorRT 11 the FP16 flag no longer exists: give the FP16 ONNX and ``fp16=False``
    (ONNX Runtime then builds a strongly typed network whose precision comes from the graph).
    """
    cache = str(Path(cache_dir))
    opts = {
        "device_id": str(int(device_id)),
        "trt_fp16_enable": "True" if fp16 else "False",
        "trt_max_workspace_size": str(int(workspace_mb) << 20),
        "trt_engine_cache_enable": "True" if engine_cache else "False",
        "trt_timing_cache_enable": "True" if timing_cache else "False",
    }
    if engine_cache:
        opts["trt_engine_cache_path"] = cache
    if timing_cache:
        opts["trt_timing_cache_path"] = cache
    return opts


def cuda_ep_options(
    device_id: int = 0, conv_algo_search: str = "HEURISTIC", gpu_mem_limit_mb: int | None = None
) -> dict[str, str]:
    """Options for ``CUDAExecutionProvider``.

    ``HEURISTIC`` cuDNN search starts fast; ``EXHAUSTIVE`` (ONNX Runtime's default) benchmarks
    every convolution on the first run, which costs seconds on a Jetson for a few % later.
    """
    if conv_algo_search not in ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"):
        raise ModelError(f"bad cuDNN algorithm search {conv_algo_search!r}", "use EXHAUSTIVE, HEURISTIC or DEFAULT")
    opts = {"device_id": str(int(device_id)), "cudnn_conv_algo_search": conv_algo_search}
    if gpu_mem_limit_mb:
        opts["gpu_mem_limit"] = str(int(gpu_mem_limit_mb) << 20)
    return opts


def check_providers(requested: list[str], used: list[str], allow_fallback: bool) -> list[str]:
    """:func:`edgekit.runtime.onnxrt.check_providers` with the GPU install hint."""
    return _check_providers(requested, used, allow_fallback, GPU_HINT)


class OnnxRuntimeGPU(OnnxRuntime):
    """ONNX Runtime with the TensorRT and/or CUDA execution providers and their options.

    Args:
        model_path: the ``.onnx`` model (for FP16, the bundle's ``*_fp16.onnx``).
        input_spec: the bundle's input description.
        providers: GPU providers in priority order: ``tensorrt``, ``cuda`` (or full names);
            ``cpu`` may be listed to make the CPU an accepted (requested) provider.
        allow_fallback: accept a session that runs without some requested provider;
            ``describe()["fallback"]`` then lists what was dropped.
        fp16: TensorRT EP FP16 (ignored by the CUDA EP, which runs the graph's own types).
        cache_dir: TensorRT EP engine/timing cache directory (default: beside the model).
        device_id, workspace_mb, conv_algo_search, gpu_mem_limit_mb: provider options.

    ``infer`` returns arrays the caller owns; ``InferenceSession.run`` is thread-safe. The
    first session with the TensorRT EP builds engines (minutes on a Jetson; cached after).
    Any other keyword is an error (see :attr:`OPTIONS`).
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("providers", "strs", DEFAULT_PROVIDERS, "GPU providers in order (tensorrt, cuda)"),
        Option("allow_fallback", "bool", False, "accept a session without some requested provider"),
        Option("fp16", "bool", True, "TensorRT EP FP16"),
        Option("cache_dir", "path", None, "TensorRT EP engine and timing cache directory"),
        Option("device_id", "int", 0, "CUDA device index", ge=0, le=MAX_INDEX),
        Option("workspace_mb", "int", trt_build.WORKSPACE_MB, "TensorRT EP workspace limit (MiB)", ge=1,
               le=MAX_MIB),
        Option("conv_algo_search", "str", "HEURISTIC", "cuDNN convolution algorithm search",
               choices=("EXHAUSTIVE", "HEURISTIC", "DEFAULT")),
        Option("gpu_mem_limit_mb", "int", None, "CUDA EP memory limit (MiB)", ge=1, le=MAX_MIB),
        Option("num_threads", "int", None, "intra-op threads (None: ONNX Runtime chooses)", ge=0, le=MAX_THREADS),
        Option("profile", "bool", False, "record ONNX Runtime's per-op profile"),
    )
    _DEFAULT = defaults(OPTIONS)  # the keyword defaults below come from the spec, never a second copy

    def __init__(
        self,
        model_path: str | Path,
        input_spec: InputSpec | None = None,
        providers: list[str] | str | None = _DEFAULT["providers"],
        allow_fallback: bool = _DEFAULT["allow_fallback"],
        fp16: bool = _DEFAULT["fp16"],
        cache_dir: str | Path | None = _DEFAULT["cache_dir"],
        device_id: int = _DEFAULT["device_id"],
        workspace_mb: int = _DEFAULT["workspace_mb"],
        conv_algo_search: str = _DEFAULT["conv_algo_search"],
        gpu_mem_limit_mb: int | None = _DEFAULT["gpu_mem_limit_mb"],
        num_threads: int | None = _DEFAULT["num_threads"],
        profile: bool = _DEFAULT["profile"],
    ):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise DeviceError("onnxruntime-gpu is not installed", GPU_HINT) from exc  # the GPU's runtime: exit 1
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ModelError(f"model {self.model_path} does not exist")
        self.providers_requested = provider_names(providers or list(DEFAULT_PROVIDERS))
        available = ort.get_available_providers()
        missing = [p for p in self.providers_requested if p not in available]
        if missing and not allow_fallback:
            # Fail before building a session: the message names what this onnxruntime build has.
            raise DeviceError(
                f"{', '.join(missing)} not available in this onnxruntime {ort.__version__} "
                f"(it has {', '.join(available)})",
                GPU_HINT,
            )
        self.provider_options = self._provider_options(
            available, fp16, cache_dir, device_id, workspace_mb, conv_algo_search, gpu_mem_limit_mb
        )
        chain = list(self.provider_options.items())
        t0 = time.perf_counter_ns()
        try:
            self._session = ort.InferenceSession(
                str(self.model_path),
                sess_options=session_options(ort, num_threads, profile),
                providers=[n for n, _ in chain],
                provider_options=[o for _, o in chain],
            )
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            raise ModelError(f"ONNX Runtime cannot load {self.model_path}: {first_line(exc)}") from exc
        self.init_ms = (time.perf_counter_ns() - t0) / 1e6
        # A provider can be "available" and still fail to load (missing libcudnn, libnvinfer):
        # ONNX Runtime then drops it with a warning. Compare what the session really uses.
        self.providers_used = self._session.get_providers()
        self.fallback = check_providers(self.providers_requested, self.providers_used, allow_fallback)
        if self.fallback:
            warnings.warn(
                f"ONNX Runtime runs without {self.fallback} (using {self.providers_used}): allowed by allow_fallback",
                RuntimeWarning,
                stacklevel=2,
            )
        self.num_threads = num_threads
        self._bind_io(input_spec)

    def _provider_options(self, available: list[str], fp16: bool, cache_dir: str | Path | None, device_id: int,
                          workspace_mb: int, conv_algo_search: str,
                          gpu_mem_limit_mb: int | None) -> dict[str, dict[str, str]]:
        """Provider -> its options, in priority order: the requested ones this build has, then the CPU."""
        chain: dict[str, dict[str, str]] = {}
        for name in self.providers_requested + ["CPUExecutionProvider"]:
            if name not in available or name in chain:
                continue
            opts: dict[str, str] = {}
            if name == "TensorrtExecutionProvider":
                cache = Path(cache_dir) if cache_dir else trt_cache.engine_cache_dir(self.model_path) / "ort-trt"
                cache.mkdir(parents=True, exist_ok=True)
                opts = tensorrt_ep_options(cache, fp16, workspace_mb, device_id)
            elif name == "CUDAExecutionProvider":
                opts = cuda_ep_options(device_id, conv_algo_search, gpu_mem_limit_mb)
            chain[name] = opts
        return chain

    def describe(self) -> dict[str, Any]:
        """As :meth:`OnnxRuntime.describe`, plus provider options and what was dropped."""
        info = super().describe()
        info.update(
            backend="onnxruntime-gpu",
            provider_options=self.provider_options,
            fallback=self.fallback,
            on_cpu_only=self.providers_used == ["CPUExecutionProvider"],
        )
        return info
