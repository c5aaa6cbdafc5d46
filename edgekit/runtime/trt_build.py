"""Building a TensorRT engine from ONNX, and checking which precision it really runs in.

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
silent. The ``tensorrt`` module is always passed in (tests hand in a recording fake).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import ModelError, UsageError
from edgekit.runtime.trt_cache import write_atomic

log = logging.getLogger("edgekit.runtime.trt_engine")  # one logger for cache and build messages

WORKSPACE_MB = 1024
"""Default workspace pool limit. Jetson GPUs share DRAM with the CPU: keep it modest."""
PRECISIONS = ("fp16", "fp32")


# Layers that move or re-lay data rather than compute: left out of the precision count, since
# a keep_io_types FP16 model legitimately has float32 casts/reformats at its edges.
_BOOKKEEPING_LAYERS = frozenset({"Reformat", "NoOp", "Constant", "Shuffle", "Cast", "Identity"})


def trt_major(trt: Any) -> int:
    """TensorRT's major version (10 on JetPack 6)."""
    return int(str(trt.__version__).split(".")[0])



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


def _builder_config(trt: Any, builder: Any, precision: str, workspace_mb: int, notes: list[str]) -> tuple[Any, str]:
    """A builder config with the workspace limit, detailed profiling and the precision flags
    this TensorRT has; returns it with the network typing it implies."""
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    # DETAILED verbosity lets the engine inspector report each layer's precision afterwards.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if trt_major(trt) >= 11:
        return config, "strong"  # precision comes from the ONNX graph; BuilderFlag.FP16 no longer exists
    if precision != "fp16":
        return config, "weak"
    if not getattr(builder, "platform_has_fast_fp16", True):
        notes.append("this GPU reports no fast FP16: TensorRT may keep most layers in FP32")
        log.warning(notes[-1])
    config.set_flag(trt.BuilderFlag.FP16)
    return config, "weak+fp16-flag"


def _use_timing_cache(config: Any, timing_cache: str | Path | None, notes: list[str]) -> bool:
    """Give the build the timing cache file's content; True when a non-empty one was accepted."""
    cache_bytes = b""
    if timing_cache is not None and Path(timing_cache).is_file():
        cache_bytes = Path(timing_cache).read_bytes()
    cache = config.create_timing_cache(cache_bytes)
    # ignore_mismatch=False: never trust timings measured on another device or TensorRT version
    if cache is not None and config.set_timing_cache(cache, False):
        return bool(cache_bytes)
    # a corrupt or foreign cache file: start from an empty one (overwritten after the build)
    notes.append(f"timing cache {Path(str(timing_cache)).name} unusable; starting a new one")
    log.warning(notes[-1])
    config.set_timing_cache(config.create_timing_cache(b""), False)
    return False


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
    (:func:`edgekit.runtime.trt_engine.load_or_build` does).
    """
    if precision not in PRECISIONS:
        raise UsageError(f"unknown TensorRT precision {precision!r}", f"use one of {', '.join(PRECISIONS)}")
    onnx_path = Path(onnx_path)
    t0 = time.perf_counter()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # TensorRT 10: networks are always explicit-batch (the flag is deprecated), so no flags.
    # TensorRT 11: always strongly typed (the STRONGLY_TYPED flag is deprecated and ignored).
    network = builder.create_network(0)
    _parse_onnx(trt, network, logger, onnx_path)
    name, shape, dynamic = _input_shape(network, shape)
    notes: list[str] = []
    config, typing = _builder_config(trt, builder, precision, workspace_mb, notes)
    if dynamic:
        profile = builder.create_optimization_profile()
        profile.set_shape(name, shape, shape, shape)  # min = opt = max: the bundle's one shape
        config.add_optimization_profile(profile)
    loaded = _use_timing_cache(config, timing_cache, notes)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise ModelError(
            f"TensorRT could not build an engine from {onnx_path.name}",
            "TensorRT's log above says why; a larger workspace_mb may help",
        )
    if timing_cache is not None:
        write_atomic(Path(timing_cache), bytes(config.get_timing_cache().serialize()))
    inputs = [{"name": name, "shape": list(shape), "onnx_shape": [int(d) for d in network.get_input(0).shape]}]
    outputs = [network.get_output(i).name for i in range(network.num_outputs)]
    return BuildResult(plan=bytes(plan), typing=typing, inputs=inputs, outputs=outputs, dynamic_input=dynamic,
                       timing_cache_loaded=loaded, seconds=time.perf_counter() - t0, notes=notes)


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


