"""Build, or reuse, a TensorRT engine from an ONNX model on the device that will run it.

An engine (a "plan") is specific to one GPU and one TensorRT version, so a bundle carries
ONNX and the engine is built on the Jetson the first time the model is opened (this takes
seconds to minutes), then cached:

* beside the bundle in ``<bundle>/.engines/`` or, when the bundle is read-only, in
  ``$XDG_CACHE_HOME/edgekit/engines/<hash of the bundle path>/``;
* one ``<onnx stem>.<precision>.plan`` per model and precision, with a JSON sidecar
  ``<...>.plan.json`` holding the cache key and what the build really produced. The plan
  file itself is never modified, so ``trtexec --loadEngine`` and other tools can read it;
* keyed by TensorRT version, GPU name and compute capability, ONNX sha256, precision and
  input shape: a mismatch (a JetPack upgrade, another module, a rebuilt bundle) rebuilds
  and says why. A plan whose sha256 differs from its sidecar's (torn write) is rebuilt too.

Two builder paths, chosen by TensorRT's major version:

* TensorRT 10 (JetPack 6): weakly typed network, ``BuilderFlag.FP16`` when FP16 is asked;
  TensorRT picks per-layer precision.
* TensorRT 11+: the precision flags and calibrators are gone and every network is strongly
  typed; precision comes from the graph, so FP16 needs the bundle's FP16 ONNX.

Both set the workspace pool limit, load and save a timing cache (per TensorRT version and
GPU) so rebuilds are faster, use the bundle's static input shape (an optimisation profile
is added only when the ONNX input is dynamic) and build with detailed profiling verbosity
so the engine inspector can say which precision each layer really runs in. Asking for FP16
and getting an all-FP32 engine raises :class:`~edgekit.errors.ModelError`; it is never
silent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekit.errors import BackendUnavailable, ModelError, UsageError

log = logging.getLogger(__name__)

WORKSPACE_MB = 1024
"""Default workspace pool limit. Jetson GPUs share DRAM with the CPU: keep it modest."""
ENGINE_DIR = ".engines"
SIDECAR_FORMAT = "edgekit-tensorrt-engine"
SIDECAR_VERSION = 1
PRECISIONS = ("fp16", "fp32")
TRT_HINT = (
    "TensorRT ships with JetPack: sudo apt install nvidia-jetpack (or python3-libnvinfer); "
    "it is not installable from PyPI on a Jetson"
)
CUDA_HINT = "pip install cuda-python (major version matching the CUDA of your JetPack, e.g. 'cuda-python<13')"

# Layers that move or re-lay data rather than compute: left out of the precision count, since
# a keep_io_types FP16 model legitimately has float32 casts/reformats at its edges.
_BOOKKEEPING_LAYERS = frozenset({"Reformat", "NoOp", "Constant", "Shuffle", "Cast", "Identity"})


# --------------------------------------------------------------------------------------------
# Importing the backend libraries (lazily: importing edgekit never loads TensorRT or CUDA)


def import_tensorrt() -> Any:
    """Return the ``tensorrt`` module, or raise BackendUnavailable with the install hint."""
    try:
        import tensorrt
    except ImportError as exc:
        raise BackendUnavailable("TensorRT's Python bindings (tensorrt) are not installed", TRT_HINT) from exc
    return tensorrt


def import_cudart() -> Any:
    """Return cuda-python's runtime bindings: ``cuda.bindings.runtime`` (cuda-python >= 12.6,
    the only place in 13), else the older ``cuda.cudart``."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError as exc:
            raise BackendUnavailable("cuda-python is not installed", CUDA_HINT) from exc
    return cudart


def cuda_call(cudart: Any, result: Any, what: str = "CUDA call") -> Any:
    """Unpack a cuda-python result ``(err, *values)``; raise BackendUnavailable unless err is 0.

    Returns None, the single value, or a tuple of values.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(getattr(err, "value", err)) != 0:
        name = getattr(err, "name", str(err))
        with contextlib.suppress(Exception):  # the name lookup is a nicety; never mask the real error
            name = cudart.cudaGetErrorName(err)[1].decode()
        raise BackendUnavailable(
            f"{what} failed: {name}", "check the GPU with `edgekit doctor` (driver, CUDA, free memory)"
        )
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def trt_major(trt: Any) -> int:
    """TensorRT's major version (10 on JetPack 6)."""
    return int(str(trt.__version__).split(".")[0])


@dataclass(frozen=True)
class GpuInfo:
    """The GPU an engine is built for: name, compute capability (e.g. "8.7") and index."""

    name: str
    compute_capability: str
    index: int = 0


def gpu_info(cudart: Any, device: int = 0) -> GpuInfo:
    """Name and compute capability of CUDA device ``device``."""
    count = cuda_call(cudart, cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
    if not count or device >= count:
        raise BackendUnavailable(f"no CUDA device {device} (found {count or 0})", "check the GPU with `edgekit doctor`")
    props = cuda_call(cudart, cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = props.name
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
    return GpuInfo(name=str(name).strip(), compute_capability=f"{props.major}.{props.minor}", index=device)


# --------------------------------------------------------------------------------------------
# Cache key, locations and sidecar


@dataclass(frozen=True)
class EngineKey:
    """Everything that makes a cached engine unusable when it changes."""

    tensorrt: str
    gpu: str
    compute_capability: str
    onnx_sha256: str
    precision: str
    input_shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        return d

    def differences(self, other: dict[str, Any] | None) -> list[str]:
        """Human-readable reasons why an engine built under ``other`` (a sidecar key) cannot be reused."""
        if not other:
            return ["no cached engine"]
        mine = self.to_dict()
        labels = {
            "tensorrt": "TensorRT version",
            "gpu": "GPU",
            "compute_capability": "compute capability",
            "onnx_sha256": "ONNX model (sha256)",
            "precision": "precision",
            "input_shape": "input shape",
        }
        out = []
        for k, label in labels.items():
            if other.get(k) != mine[k]:
                old, new = other.get(k), mine[k]
                if k == "onnx_sha256":
                    old, new = str(old)[:12], str(new)[:12]
                out.append(f"{label} changed: {old} -> {new}")
        return out


def engine_cache_dir(model_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where engines for ``model_path`` live: ``cache_dir`` if given, else ``.engines/`` beside
    the model, else (read-only bundle) a per-bundle folder in the user's cache directory."""
    if cache_dir is not None:
        path = Path(cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    beside = Path(model_path).resolve().parent / ENGINE_DIR
    try:
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK | os.X_OK):
            return beside
    except OSError:
        pass  # read-only bundle (a mounted image, another user's directory): use the user cache
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgekit" / "engines"
    digest = hashlib.sha256(str(Path(model_path).resolve().parent).encode()).hexdigest()[:16]
    path = base / digest
    path.mkdir(parents=True, exist_ok=True)
    return path


def plan_path_for(model_path: str | Path, precision: str, cache_dir: Path) -> Path:
    """The plan file for one model and precision inside ``cache_dir``."""
    return cache_dir / f"{Path(model_path).stem}.{precision}.plan"


def sidecar_path(plan_path: str | Path) -> Path:
    """The JSON sidecar beside a plan file (metadata never goes inside the plan)."""
    return Path(str(plan_path) + ".json")


def read_sidecar(plan_path: str | Path) -> dict[str, Any] | None:
    """The sidecar of a plan, or None when missing, unreadable or not ours."""
    try:
        data = json.loads(sidecar_path(plan_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
        return None
    return data


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    from edgekit.bundle import sha256_file

    return sha256_file(path)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old or the new content, never half of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _build_lock(cache_dir: Path, stem: str) -> Iterator[None]:
    """Serialise builds of one engine between processes (two services starting together)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux; Jetsons are
        yield
        return
    with open(cache_dir / f".{stem}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def timing_cache_path(cache_dir: Path, trt_version: str, gpu: GpuInfo) -> Path:
    """Timing caches are specific to a TensorRT version and GPU too: one file per pair."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu.name).strip("-").lower() or "gpu"
    return cache_dir / f"timing-trt{trt_version}-{slug}-sm{gpu.compute_capability.replace('.', '')}.cache"


# --------------------------------------------------------------------------------------------
# Building


@dataclass
class BuildResult:
    """What :func:`build_plan` produced: the serialised plan and facts about the build."""

    plan: bytes
    typing: str  # "weak+fp16-flag", "weak" (TensorRT 10) or "strong" (TensorRT 11+)
    inputs: list[dict[str, Any]]
    outputs: list[str]  # network output names in ONNX order (engines may list them otherwise)
    dynamic_input: bool
    timing_cache_loaded: bool
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _parse_onnx(trt: Any, network: Any, logger: Any, onnx_path: Path) -> None:
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(onnx_path))
    if not ok:
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise ModelError(
            f"TensorRT cannot parse {onnx_path.name}: {'; '.join(errors)[:500] or 'unknown error'}",
            "check the model with `edgekit inspect`, or rebuild the bundle with a lower opset",
        )


def _input_shape(network: Any, shape: tuple[int, ...] | None) -> tuple[str, tuple[int, ...], bool]:
    if network.num_inputs != 1:
        raise ModelError(f"the ONNX model has {network.num_inputs} inputs; edgekit runs single-input models")
    tensor = network.get_input(0)
    onnx_shape = tuple(int(d) for d in tensor.shape)
    dynamic = any(d < 0 for d in onnx_shape)
    if shape is None:
        if dynamic:
            raise ModelError(
                f"input {tensor.name!r} has a dynamic shape {list(onnx_shape)} and no bundle input shape was given",
                "open the model through its bundle",
            )
        return tensor.name, onnx_shape, False
    shape = tuple(int(d) for d in shape)
    if len(shape) != len(onnx_shape) or any(o >= 0 and o != s for o, s in zip(onnx_shape, shape)):
        raise ModelError(
            f"bundle input shape {list(shape)} does not fit the ONNX input {tensor.name!r} {list(onnx_shape)}",
            "rebuild the bundle",
        )
    return tensor.name, shape, dynamic


def build_plan(
    trt: Any,
    onnx_path: str | Path,
    shape: tuple[int, ...] | None = None,
    precision: str = "fp16",
    workspace_mb: int = WORKSPACE_MB,
    timing_cache: str | Path | None = None,
) -> BuildResult:
    """Build a serialised TensorRT engine from an ONNX file.

    Args:
        trt: the ``tensorrt`` module (passed in so tests can hand in a recording fake).
        onnx_path: the model; for TensorRT 11+ and ``precision="fp16"`` it must be the FP16 ONNX.
        shape: the static input shape from the bundle (batch included); an optimisation
            profile pinned to it is added only if the ONNX input is dynamic.
        precision: ``fp16`` or ``fp32``.
        workspace_mb: limit of TensorRT's workspace memory pool.
        timing_cache: file to load the timing cache from (if present) and save it to.

    Returns a :class:`BuildResult`. Raises ModelError when the ONNX cannot be parsed or
    the build fails. Takes seconds to minutes: call it once and cache the plan
    (:func:`load_or_build` does).
    """
    if precision not in PRECISIONS:
        raise UsageError(f"unknown TensorRT precision {precision!r}", f"use one of {', '.join(PRECISIONS)}")
    onnx_path = Path(onnx_path)
    major = trt_major(trt)
    t0 = time.perf_counter()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # TensorRT 10: networks are always explicit-batch (the flag is deprecated), so no flags.
    # TensorRT 11: always strongly typed (the STRONGLY_TYPED flag is deprecated and ignored).
    network = builder.create_network(0)
    _parse_onnx(trt, network, logger, onnx_path)
    name, shape, dynamic = _input_shape(network, shape)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    # DETAILED verbosity lets the engine inspector report each layer's precision afterwards.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    notes: list[str] = []
    if major >= 11:
        typing = "strong"  # precision comes from the ONNX graph; BuilderFlag.FP16 no longer exists
    elif precision == "fp16":
        if not getattr(builder, "platform_has_fast_fp16", True):
            notes.append("this GPU reports no fast FP16: TensorRT may keep most layers in FP32")
            log.warning(notes[-1])
        config.set_flag(trt.BuilderFlag.FP16)
        typing = "weak+fp16-flag"
    else:
        typing = "weak"
    if dynamic:
        profile = builder.create_optimization_profile()
        profile.set_shape(name, shape, shape, shape)  # min = opt = max: the bundle's one shape
        config.add_optimization_profile(profile)

    cache_bytes = b""
    if timing_cache is not None and Path(timing_cache).is_file():
        cache_bytes = Path(timing_cache).read_bytes()
    cache = config.create_timing_cache(cache_bytes)
    # ignore_mismatch=False: never trust timings measured on another device or TensorRT version
    if cache is not None and config.set_timing_cache(cache, False):
        loaded = bool(cache_bytes)
    else:  # a corrupt or foreign cache file: start from an empty one (overwritten after the build)
        loaded = False
        notes.append(f"timing cache {Path(str(timing_cache)).name} unusable; starting a new one")
        log.warning(notes[-1])
        config.set_timing_cache(config.create_timing_cache(b""), False)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise ModelError(
            f"TensorRT could not build an engine from {onnx_path.name}",
            "TensorRT's log above says why; a larger workspace_mb may help",
        )
    if timing_cache is not None:
        _write_atomic(Path(timing_cache), bytes(config.get_timing_cache().serialize()))
    inputs = [{"name": name, "shape": list(shape), "onnx_shape": [int(d) for d in network.get_input(0).shape]}]
    outputs = [network.get_output(i).name for i in range(network.num_outputs)]
    return BuildResult(
        plan=bytes(plan),
        typing=typing,
        inputs=inputs,
        outputs=outputs,
        dynamic_input=dynamic,
        timing_cache_loaded=loaded,
        seconds=time.perf_counter() - t0,
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# What precision did TensorRT really use?


def _tensor_precision(tensor: dict[str, Any]) -> str | None:
    # TensorRT 10: "Format/Datatype": "Row major linear FP16 format" or "Half"/"Float";
    # TensorRT 11 splits that field into "Format" and "DataType".
    text = next((str(tensor[k]) for k in ("DataType", "Format/Datatype", "Format") if tensor.get(k)), "").lower()
    if not text:
        return None
    if "bf16" in text or "bfloat16" in text:
        return "bf16"
    if "fp16" in text or "half" in text or "float16" in text:
        return "fp16"
    if "fp8" in text:
        return "fp8"
    if "int8" in text:
        return "int8"
    if "fp32" in text or "float" in text:
        return "fp32"
    return None


def layer_precisions(engine_info: str | dict) -> dict[str, Any]:
    """Count compute layers by output precision from the inspector's JSON.

    Returns ``{"counts": {"fp16": n, ...}, "fp32_layers": [names...], "inspected": bool}``;
    ``inspected`` is False when the engine carries no per-layer detail (built without
    detailed profiling verbosity).
    """
    data = json.loads(engine_info) if isinstance(engine_info, str) else engine_info
    counts: dict[str, int] = {}
    fp32_layers: list[str] = []
    inspected = False
    for layer in data.get("Layers", []):
        if not isinstance(layer, dict):
            continue  # LAYER_NAMES_ONLY verbosity: a bare name, no types
        if layer.get("LayerType") in _BOOKKEEPING_LAYERS:
            continue
        tensors = layer.get("Outputs") or layer.get("Inputs") or []
        found = [p for p in (_tensor_precision(t) for t in tensors if isinstance(t, dict)) if p]
        if not found:
            continue
        inspected = True
        precision = found[0]
        counts[precision] = counts.get(precision, 0) + 1
        if precision == "fp32":
            fp32_layers.append(str(layer.get("Name", "?")))
    return {"counts": counts, "fp32_layers": fp32_layers, "inspected": inspected}


def summarize_precision(requested: str, report: dict[str, Any]) -> str:
    """Name the precision actually used ("fp16", "fp32", "mixed fp16 12 / fp32 2", "unknown").

    Raises ModelError when FP16 was asked and no compute layer runs in FP16: an engine that
    silently runs FP32 is the failure this check exists for. Warns when the inspector could
    not tell, or when the engine is only partly FP16.
    """
    counts = report.get("counts", {})
    if not report.get("inspected"):
        msg = f"TensorRT's engine inspector reported no layer precisions: cannot confirm the engine runs in {requested}"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        log.warning(msg)
        return "unknown"
    total = sum(counts.values())
    low = counts.get("fp16", 0)
    if requested == "fp16" and low == 0:
        raise ModelError(
            f"FP16 was requested but TensorRT built every one of {total} compute layers in {'/'.join(sorted(counts))}",
            "with TensorRT 11+ build from the bundle's FP16 ONNX (<name>_fp16.onnx, made by "
            "`edgekit build --target jetson`); with TensorRT 10 check that this GPU supports fast FP16, "
            "or ask for precision='fp32' explicitly",
        )
    if len(counts) == 1:
        return next(iter(counts))
    used = "mixed " + " / ".join(f"{p} {n}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    if requested == "fp16":
        log.warning("engine is only partly FP16: %s compute layers", used)
    return used


def inspect_plan(trt: Any, plan: bytes) -> dict[str, Any]:
    """Deserialise a plan and read its per-layer precisions with the engine inspector."""
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise ModelError("TensorRT cannot deserialise the engine it has just built", "see TensorRT's log above")
    try:
        inspector = engine.create_engine_inspector()
        info = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
        report = layer_precisions(info)
    except (AttributeError, ValueError, TypeError) as exc:
        report = {"counts": {}, "fp32_layers": [], "inspected": False, "error": str(exc)}
    finally:
        del engine, runtime
    return report


# --------------------------------------------------------------------------------------------
# The cache


@dataclass(frozen=True)
class Engine:
    """A usable plan on disk and its sidecar record.

    ``built`` is True when this call built it (``reason`` says why), False when the cached
    plan was reused. ``record`` is the sidecar dict (key, precision report, I/O names,
    build time).
    """

    plan_path: Path
    record: dict[str, Any]
    built: bool
    reason: str

    @property
    def precision_used(self) -> str:
        return self.record.get("precision", {}).get("used", "unknown")

    @property
    def outputs(self) -> list[str]:
        return list(self.record.get("outputs", []))


def engine_key(trt: Any, gpu: GpuInfo, onnx_path: Path, precision: str, shape: tuple[int, ...] | None) -> EngineKey:
    """The cache key of one model on this device."""
    return EngineKey(
        tensorrt=str(trt.__version__),
        gpu=gpu.name,
        compute_capability=gpu.compute_capability,
        onnx_sha256=_sha256_file(onnx_path),
        precision=precision,
        input_shape=tuple(int(d) for d in shape) if shape else (),
    )


def cached_engine(plan_path: Path, key: EngineKey) -> tuple[dict[str, Any] | None, list[str]]:
    """The sidecar of a reusable cached plan (or None) and the reasons it is not reusable."""
    record = read_sidecar(plan_path)
    if record is None:
        return None, ["no cached engine" if not plan_path.exists() else "cached engine has no valid sidecar"]
    old_key = record.get("key") or {}
    if not key.input_shape and not record.get("dynamic_input"):
        # No shape given (a bare .onnx): a static-shape engine of this model fits whatever its shape.
        key = replace(key, input_shape=tuple(old_key.get("input_shape", ())))
    reasons = key.differences(old_key)
    if reasons:
        return None, reasons
    if not plan_path.is_file():
        return None, ["plan file missing"]
    if _sha256_file(plan_path) != record.get("plan_sha256"):
        return None, ["plan file does not match its sidecar (interrupted write or modified)"]
    return record, []


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
    with _build_lock(directory, plan_path.stem):
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
        result = build_plan(
            trt, onnx_path, shape, precision, workspace_mb, timing_cache_path(directory, str(trt.__version__), gpu)
        )
        if not key.input_shape:
            key = replace(key, input_shape=tuple(result.inputs[0]["shape"]))
        report = inspect_plan(trt, result.plan)
        used = summarize_precision(precision, report)
        record = {
            "format": SIDECAR_FORMAT,
            "version": SIDECAR_VERSION,
            "key": key.to_dict(),
            "plan": plan_path.name,
            "plan_sha256": _sha256_bytes(result.plan),
            "plan_bytes": len(result.plan),
            "onnx": onnx_path.name,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "build_seconds": round(result.seconds, 3),
            "rebuild_reason": reason,
            "typing": result.typing,
            "workspace_mb": int(workspace_mb),
            "timing_cache_loaded": result.timing_cache_loaded,
            "precision": {
                "requested": precision,
                "used": used,
                "layers": report.get("counts", {}),
                "fp32_layers": report.get("fp32_layers", [])[:50],
            },
            "inputs": result.inputs,
            "outputs": result.outputs,
            "dynamic_input": result.dynamic_input,
            "notes": result.notes,
        }
        # Plan first, sidecar last: a crash in between leaves a sha mismatch, i.e. a rebuild.
        _write_atomic(plan_path, result.plan)
        _write_atomic(sidecar_path(plan_path), (json.dumps(record, indent=2) + "\n").encode())
        log.warning("TensorRT engine built in %.1f s (%s): %s", result.seconds, used, plan_path)
        return Engine(plan_path=plan_path, record=record, built=True, reason=reason)
