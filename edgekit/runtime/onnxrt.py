"""ONNX Runtime adapter, with a check that the providers asked for are the ones used.

ONNX Runtime silently falls back to the CPU when a requested execution provider cannot
load (only a UserWarning): we compare ``session.get_providers()`` with the request and
refuse the fallback unless ``allow_fallback`` is set.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgekit.errors import BackendUnavailable, DeviceError, ModelError, first_line
from edgekit.imaging.image import InputSpec
from edgekit.runtime.backends import MAX_THREADS
from edgekit.util.optionspec import Option, defaults

_ONNX_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
}
_PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}


def provider_names(providers: list[str] | str | None) -> list[str]:
    """Expand short names (cpu, cuda, tensorrt) to ONNX Runtime provider names."""
    if providers is None:
        return ["CPUExecutionProvider"]
    if isinstance(providers, str):
        providers = [p for p in providers.split(",") if p]
    return [_PROVIDER_ALIASES.get(p.lower(), p) for p in providers]


FALLBACK_HINT = "install the provider, request --providers cpu, or pass --allow-fallback"


def check_providers(requested: list[str], used: list[str], allow_fallback: bool,
                    hint: str = FALLBACK_HINT) -> list[str]:
    """The requested providers missing from ``used``; DeviceError if any and not ``allow_fallback``."""
    dropped = [p for p in requested if p not in used]
    if dropped and not allow_fallback:
        raise DeviceError(f"ONNX Runtime would silently run without {dropped} (using {used})", hint)
    return dropped


def session_options(ort: Any, num_threads: int | None, profile: bool) -> Any:
    """``SessionOptions`` with intra-op threads (None/0: ONNX Runtime chooses) and profiling."""
    opts = ort.SessionOptions()
    # ONNX Runtime prints its warnings (e.g. "`tf_half_pixel_for_nn` is deprecated") in colour
    # straight to stderr, even under --quiet; its errors come back as exceptions (one line each), so it
    # logs only fatal errors, and warnings too when edgekit logs at DEBUG (-vv).
    severity = 2 if logging.getLogger("edgekit").isEnabledFor(logging.DEBUG) else 4
    ort.set_default_logger_severity(severity)
    opts.log_severity_level = severity
    if num_threads:
        opts.intra_op_num_threads = int(num_threads)
    opts.enable_profiling = bool(profile)
    if profile:  # the trace goes to a temporary directory, never the working directory
        opts.profile_file_prefix = str(Path(tempfile.mkdtemp(prefix="edgekit-ort-")) / "profile")
    return opts


class OnnxRuntime:
    """Run an ``.onnx`` model with ONNX Runtime.

    Args:
        model_path: the model file.
        input_spec: preprocessing + input description; read from the model when omitted.
        providers: execution providers in priority order (names or cpu/cuda/tensorrt).
        allow_fallback: accept a session that dropped some of the requested providers.
        num_threads: intra-op threads (0/None lets ONNX Runtime choose).
        profile: record ONNX Runtime's per-op profile (see :meth:`end_profiling` and
            :func:`summarize_profile`); the trace goes to a temporary directory, not the cwd.
        input_size: ``"HxW"`` or ``(H, W)`` for an input whose height/width are symbolic;
            without it such a model is refused (a shape is never guessed). A symbolic batch is 1.

    ``infer`` returns arrays owned by the caller. ``InferenceSession.run`` is thread-safe.
    Any other keyword is an error (see :attr:`OPTIONS`).
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("providers", "strs", None, "execution providers in order (cpu, cuda, tensorrt)"),
        Option("allow_fallback", "bool", False, "accept a session without some requested provider"),
        Option("num_threads", "int", None, "intra-op threads (None: ONNX Runtime chooses)", ge=0, le=MAX_THREADS),
        Option("profile", "bool", False, "record ONNX Runtime's per-op profile"),
        Option("input_size", "str_or_list", None, "HxW for a model whose input height/width are symbolic"),
    )
    _DEFAULT = defaults(OPTIONS)  # the keyword defaults below come from the spec, never a second copy

    def __init__(
        self,
        model_path: str | Path,
        input_spec: InputSpec | None = None,
        providers: list[str] | str | None = _DEFAULT["providers"],
        allow_fallback: bool = _DEFAULT["allow_fallback"],
        num_threads: int | None = _DEFAULT["num_threads"],
        profile: bool = _DEFAULT["profile"],
        input_size: str | tuple[int, int] | list[int] | None = _DEFAULT["input_size"],
    ):
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendUnavailable("onnxruntime is not installed", "pip install 'edgekit-vision[onnx]'") from exc
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ModelError(f"model {self.model_path} does not exist")
        self.providers_requested = provider_names(providers)
        available = ort.get_available_providers()
        usable = [p for p in self.providers_requested if p in available]
        if not usable:  # a GPU provider this onnxruntime lacks: the accelerator's runtime is missing (exit 1)
            raise DeviceError(
                f"none of the requested ONNX Runtime providers {self.providers_requested} is available "
                f"(available: {available})",
                "install onnxruntime-gpu for CUDA/TensorRT, or pass --providers cpu",
            )
        opts = session_options(ort, num_threads, profile)
        # the trace's temporary directory goes with the runtime (close), even if it never opens
        self._profile_dir = Path(opts.profile_file_prefix).parent if profile else None
        t0 = time.perf_counter_ns()
        try:
            self._session = ort.InferenceSession(str(self.model_path), sess_options=opts, providers=usable)
        except Exception as exc:  # onnxruntime raises its own untyped exceptions for bad files
            self.close()
            raise ModelError(f"ONNX Runtime cannot load {self.model_path}: {first_line(exc, 300)}",
                             "copy or export the model again: the file is corrupt or not an ONNX model") from exc
        self.init_ms = (time.perf_counter_ns() - t0) / 1e6
        self.providers_used = self._session.get_providers()
        check_providers(self.providers_requested, self.providers_used, allow_fallback)
        self.num_threads = num_threads
        self._bind_io(input_spec, input_size)

    def _bind_io(self, input_spec: InputSpec | None, input_size: Any = None) -> None:
        """Read the session's single input and outputs (shared with the GPU adapter)."""
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            raise ModelError(f"{self.model_path} has {len(inputs)} inputs; edgekit runs single-input models")
        self._input_name = inputs[0].name
        outputs = self._session.get_outputs()
        for o in outputs:  # a string label or a ZipMap (sklearn) decodes to nothing: say so at load
            if not o.type.startswith("tensor(") or o.type in ("tensor(string)",):
                raise ModelError(f"{self.model_path}: output '{o.name}' is {o.type}; edgekit decodes numeric tensors",
                                 "export the model without its label/ZipMap post-processing (scores as a tensor)")
        self._output_names = [o.name for o in outputs]
        self.input_spec = self._spec(inputs[0], input_spec, _size(input_size))
        self.output_quantization = [None] * len(self._output_names)  # ONNX outputs here are float

    @staticmethod
    def _spec(node: Any, given: InputSpec | None, size: tuple[int, int] | None = None) -> InputSpec:
        """The input spec: the bundle's (``given``) with the session's shape, or for a bare model
        its static shape (symbolic batch -> 1, symbolic H/W from ``size``), NCHW when the
        channel count (1 or 3) comes first, RGB or gray, pixels / 255 (stated by ``run``/``bench``)."""
        dims = list(node.shape)
        layout = _layout(dims)
        dtype = _ONNX_DTYPES.get(node.type)
        if dtype is None:  # an int64/bool/string input would fail at the first frame, inside ONNX Runtime
            raise ModelError(f"input '{node.name}' is {node.type}; edgekit feeds images as float32, float16, uint8 "
                             "or int8", "export the model with an image input of one of those types")
        batch = dims[0] if dims else None
        if len(dims) != 4 or (isinstance(batch, int) and batch > 1):
            raise ModelError(f"input '{node.name}' has shape {_dims(dims)}; edgekit feeds one image at a time: "
                             "[1,H,W,C] or [1,C,H,W]",
                             "export the model with one image input of batch 1 (or a dynamic batch)")
        hw = (2, 3) if layout == "NCHW" else (1, 2)
        shape = [d if isinstance(d, int) and d > 0 else 0 for d in dims]
        if shape:
            shape[0] = shape[0] or 1  # a symbolic batch runs one frame at a time
        if len(shape) == 4 and (size or not all(shape[i] for i in hw)):
            if size is None and given is not None and len(given.shape) == 4:
                size = (given.height, given.width)
            if size is None:
                raise ModelError(f"input '{node.name}' has shape {_dims(dims)}: its height/width are not fixed",
                                 "give the image size with --input-size HxW (e.g. --input-size 224x224)")
            if all(shape[i] for i in hw) and (shape[hw[0]], shape[hw[1]]) != tuple(size):
                raise ModelError(f"--input-size {size[0]}x{size[1]} does not fit input '{node.name}', "
                                 f"fixed at {shape[hw[0]]}x{shape[hw[1]]}", "leave out --input-size")
            shape[hw[0]], shape[hw[1]] = int(size[0]), int(size[1])
        if given is not None:
            d = given.to_dict()
            d.update(shape=shape, dtype=dtype, name=node.name)
            return InputSpec.from_dict(d)
        spec = InputSpec(shape=tuple(shape), dtype=dtype, layout=layout, name=node.name)
        # an integer input of a bare model takes pixels as they are (0..255; int8: shifted by 128)
        quant = {"scale": 1 / 255, "zero_point": -128 if dtype == "int8" else 0} if dtype in ("uint8", "int8") else {}
        return InputSpec.from_dict({**spec.to_dict(), "colour": "gray" if spec.channels == 1 else "rgb", **quant})

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        """Run one inference on a tensor shaped and typed as ``input_spec``.

        Raises ModelError when ONNX Runtime fails inside the graph (a Reshape that does not fit
        the input it was given...): one line instead of its multi-line native report."""
        try:
            return self._session.run(self._output_names, {self._input_name: tensor})
        except Exception as exc:  # onnxruntime's pybind exceptions (Fail, InvalidArgument...) share no base
            raise ModelError(f"ONNX Runtime failed running {self.model_path.name}: {_ort_message(exc)}",
                             "the model cannot run on this input as exported: run it with onnxruntime "
                             "directly, or export it again") from exc

    def output_details(self) -> list[dict[str, Any]]:
        """Each output's ``name``, ``shape`` (symbolic dimensions as their names) and ONNX ``type``."""
        return [{"name": o.name, "shape": list(o.shape), "type": o.type} for o in self._session.get_outputs()]

    def end_profiling(self) -> str | None:
        """Stop profiling and return the path of ONNX Runtime's JSON trace (or None).

        The caller owns the trace (and its temporary directory) from then on; a trace never
        collected is removed by :meth:`close`.
        """
        if not self._session:
            return None
        self._profile_dir = None
        return self._session.end_profiling() or None

    def describe(self) -> dict[str, Any]:
        """Backend, version, providers requested and providers really used."""
        import onnxruntime as ort

        return {
            "backend": "onnxruntime",
            "version": ort.__version__,
            "model": self.model_path.name,
            "providers_requested": self.providers_requested,
            "providers_used": self.providers_used,
            "num_threads": self.num_threads,
            "init_ms": round(self.init_ms, 3),
            "input": {"name": self._input_name, "dtype": self.input_spec.dtype, "shape": list(self.input_spec.shape)},
            "outputs": self._output_names,
        }

    def close(self) -> None:
        """Release the session; a profile trace not collected by then is removed with its directory."""
        self._session = None
        profile_dir = getattr(self, "_profile_dir", None)
        if profile_dir is not None:
            shutil.rmtree(profile_dir, ignore_errors=True)
            self._profile_dir = None

    def __enter__(self) -> OnnxRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ort_message(exc: Exception) -> str:
    """ONNX Runtime's error in one line, without the source path and C++ signature in its middle."""
    text = " ".join(str(exc).split())
    text = re.sub(r"/onnxruntime_src/\S+ .*? was false\. ", "", text)
    return text[:300]


def _dims(dims: list) -> str:
    """``[1,3,?,?]``: a shape with its symbolic dimensions as ``?``."""
    return "[" + ",".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in dims) + "]"


def _layout(dims: list) -> str:
    """NCHW when a static 1 or 3 channels come first and not last (a PyTorch export), else NHWC."""
    def channels(d: Any) -> bool:
        return isinstance(d, int) and d in (1, 3)

    return "NCHW" if len(dims) == 4 and channels(dims[1]) and not channels(dims[3]) else "NHWC"


def _size(value: Any) -> tuple[int, int] | None:
    """``"224x224"``, ``"224"``, ``(224, 224)`` -> ``(224, 224)``; None stays None."""
    if value is None:
        return None
    parts = str(value).lower().split("x") if isinstance(value, str) else list(value)
    try:
        dims = [int(p) for p in parts]
    except (TypeError, ValueError):
        dims = []
    dims = dims * 2 if len(dims) == 1 else dims
    if len(dims) != 2 or min(dims) < 1:
        raise ModelError(f"--input-size {value!r} is not HxW", "give the height and width, e.g. 224x224")
    return dims[0], dims[1]


def summarize_profile(trace: str | Path | list) -> list[dict[str, Any]]:
    """Summarise an ONNX Runtime profiling trace by op type, slowest first.

    The trace is Chrome-trace JSON: one ``"cat": "Node"`` event per node execution with
    ``args.op_name`` and ``dur`` in microseconds (``*_kernel_time`` events are the kernels
    themselves; the ``*_fence_*`` events around them are bookkeeping and are left out).
    Returns rows of ``op_type``, ``calls``, ``total_ms``, ``mean_us`` and ``share`` (of the
    summed kernel time).
    """
    events = json.loads(Path(trace).read_text()) if not isinstance(trace, list) else trace
    total_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ev in events:
        if ev.get("cat") != "Node" or not str(ev.get("name", "")).endswith("_kernel_time"):
            continue
        op = ev.get("args", {}).get("op_name", "?")
        total_us[op] += float(ev.get("dur", 0))
        calls[op] += 1
    grand = sum(total_us.values()) or 1.0
    rows = [
        {"op_type": op, "calls": calls[op], "total_ms": us / 1e3, "mean_us": us / calls[op], "share": us / grand}
        for op, us in total_us.items()
    ]
    return sorted(rows, key=lambda r: -r["total_ms"])
