"""LiteRT adapter: ``ai_edge_litert`` with XNNPACK (default) or the Edge TPU delegate.

Falls back to the frozen ``tflite_runtime`` package (older device images with numpy<2)
and never to TensorFlow, which would cost ~500 MB and seconds of import on a device.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgekit.errors import BackendUnavailable, DelegateError, DeviceError, ModelError, first_line
from edgekit.imaging.image import InputSpec, InputSpecError
from edgekit.runtime.backends import MAX_THREADS
from edgekit.util.optionspec import Option, defaults
from edgekit.util.quiet import native_stderr_to_log

log = logging.getLogger("edgekit.runtime.litert")

EDGETPU_LIBRARY = "libedgetpu.so.1"
EDGETPU_CUSTOM_OP = b"edgetpu-custom-op"


def _interpreter_module():
    try:
        from ai_edge_litert import interpreter as mod

        return mod, "ai_edge_litert"
    except ImportError:
        pass
    try:
        from tflite_runtime import interpreter as mod  # numpy<2 device images only

        return mod, "tflite_runtime"
    except ImportError as exc:
        raise BackendUnavailable(
            "no TFLite runtime installed (ai_edge_litert or tflite_runtime)", "pip install 'edgekit-vision[litert]'"
        ) from exc


def edgetpu_device_string(device: str | None) -> str | None:
    """Validate an Edge TPU device string: None/'' (first found), ':N', 'usb', 'usb:N', 'pci', 'pci:N'."""
    if device in (None, "", "auto"):
        return None
    kind, _, index = str(device).partition(":")
    if kind not in ("", "usb", "pci") or (index and not index.isdigit()) or (kind == "" and not index):
        raise ModelError(f"bad Edge TPU device {device!r}", "use usb, usb:N, pci, pci:N or :N")
    return str(device)


def is_edgetpu_compiled(path: str | Path) -> bool:
    """True when a .tflite holds the ``edgetpu-custom-op`` that edgetpu_compiler emits.

    Such a model cannot run on the CPU ("unresolved custom op"); checking the bytes also
    catches a compiled model that was renamed. The file is mapped, not read into memory.
    """
    with open(path, "rb") as f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return m.find(EDGETPU_CUSTOM_OP) >= 0
        except ValueError:  # empty file: cannot be mapped, and is not a compiled model
            return False


def load_edgetpu_delegate(mod: Any, device: str | None) -> Any:
    """Load ``libedgetpu.so.1`` for one device, telling a missing library from a missing TPU.

    The library is opened with ctypes first: LiteRT's ``load_delegate`` reports both cases
    the same way and prints a stray traceback from its destructor when the library is absent.
    """
    device = edgetpu_device_string(device)
    try:
        ctypes.CDLL(EDGETPU_LIBRARY)
    except OSError as exc:
        raise DelegateError(
            f"the Edge TPU runtime library {EDGETPU_LIBRARY} is not installed",
            "install libedgetpu1-std from Coral's apt repository (built for this LiteRT version)",
        ) from exc
    try:
        return mod.load_delegate(EDGETPU_LIBRARY, {"device": device} if device else {})
    except (ValueError, OSError) as exc:
        raise DeviceError(
            f"no Edge TPU found (device {device or 'any'}): {first_line(exc)}",
            "plug in the Coral, check `lsusb`/udev permissions, or pick another --device (usb:N, pci:N)",
        ) from exc


def spec_from_details(detail: dict, preprocess: InputSpec | None = None) -> InputSpec:
    """An InputSpec for a tensor as the interpreter reports it, keeping known preprocessing."""
    scale, zero_point = detail.get("quantization", (0.0, 0))
    dtype = np.dtype(detail["dtype"]).name
    quantised = dtype in ("uint8", "int8", "int16") and scale
    shape = [int(s) for s in detail["shape"]]
    # channels first (Ultralytics' LiteRT export, onnx2tf -kat): [1, 1|3, H, W] with H, W not 1 or 3
    layout = "NCHW" if len(shape) == 4 and shape[1] in (1, 3) and shape[3] not in (1, 3) else "NHWC"
    base = preprocess or InputSpec(shape=tuple(shape), layout=layout)
    d = base.to_dict()
    d.update(
        shape=shape,
        dtype=dtype,
        scale=float(scale) if quantised else None,
        zero_point=int(zero_point) if quantised else None,
        name=detail.get("name", ""),
    )
    if len(shape) == 4 and not preprocess and shape[1 if layout == "NCHW" else 3] == 1:
        d["colour"] = "gray"
    return InputSpec.from_dict(d)


def _image_spec(path: Path, detail: dict, preprocess: InputSpec | None) -> InputSpec:
    """:func:`spec_from_details`, a refusal naming the file (a [1,64,64,8] input is no image)."""
    try:
        return spec_from_details(detail, preprocess)
    except InputSpecError as exc:
        raise ModelError(f"{path.name}: {exc.message}",
                         "edgekit feeds images: [1,H,W,C] or [1,C,H,W] with 1 or 3 channels") from exc


def _check_image_input(path: Path, detail: dict) -> None:
    """One image per inference with a fixed size, or a ModelError now: a batch of 4 failed at the
    first frame (a ValueError inside set_tensor), and a symbolic height/width (``-1`` in the
    signature) is allocated as 1, so the model silently ran on 1x1 images."""
    shape = [int(s) for s in detail["shape"]]
    signature = [int(s) for s in detail.get("shape_signature", shape)]
    text = "[" + ",".join("?" if s < 0 else str(s) for s in signature) + "]"
    if shape and shape[0] > 1:
        raise ModelError(f"{path.name}: input '{detail.get('name', '')}' has shape {text}; edgekit feeds one "
                         "image at a time", "convert the model with a batch of 1")
    if len(signature) == 4 and any(s < 0 for s in signature[1:]):
        raise ModelError(f"{path.name}: input '{detail.get('name', '')}' has shape {text}: its image size is not "
                         "fixed (LiteRT would run it on 1x1 images)",
                         "convert the model with a fixed input size, e.g. a [1,224,224,3] signature")


def delegation_coverage(ops: list[dict]) -> dict[str, int]:
    """Count original nodes replaced by DELEGATE kernels.

    The interpreter lists the original nodes followed by one ``DELEGATE`` node per
    delegated partition; a partition is every original node between the delegate node's
    input tensors and its output tensors, found by walking producers backwards.
    """
    original = [o for o in ops if o.get("op_name") != "DELEGATE"]
    kernels = [o for o in ops if o.get("op_name") == "DELEGATE"]
    delegated = delegated_nodes(ops)
    return {
        "total_nodes": len(original),
        "delegated_nodes": len(delegated),
        "cpu_nodes": len(original) - len(delegated),
        "delegate_kernels": len(kernels),
    }


def delegated_nodes(ops: list[dict]) -> set[int]:
    """Indices of the original nodes that ``DELEGATE`` kernels replaced (see :func:`delegation_coverage`)."""
    original = [o for o in ops if o.get("op_name") != "DELEGATE"]
    kernels = [o for o in ops if o.get("op_name") == "DELEGATE"]
    producer = {int(t): o["index"] for o in original for t in o["outputs"]}
    by_index = {o["index"]: o for o in original}
    delegated: set[int] = set()
    for kernel in kernels:
        boundary = {int(t) for t in kernel["inputs"]}
        stack = [int(t) for t in kernel["outputs"]]
        while stack:
            tensor = stack.pop()
            node = producer.get(tensor)
            if tensor in boundary or node is None or node in delegated:
                continue
            delegated.add(node)
            stack.extend(int(t) for t in by_index[node]["inputs"] if t >= 0)
    return delegated


def _quantization(detail: dict) -> tuple[float, int] | None:
    scale, zero_point = detail.get("quantization", (0.0, 0))
    return (float(scale), int(zero_point)) if scale else None


def _check_delegate_fits(path: Path, delegate: str, compiled: bool) -> None:
    """A compiled model needs the Edge TPU; the Edge TPU needs a compiled model. Either
    mismatch is an error: the second would run everything on the CPU, silently."""
    if compiled and delegate != "edgetpu":
        raise ModelError(
            f"{path.name} is compiled for the Edge TPU and cannot run on the CPU",
            "run it with --delegate edgetpu on a machine with a Coral, or use the plain int8 model",
        )
    if delegate == "edgetpu" and not compiled and path.name.endswith("_edgetpu.tflite"):
        # named by edgetpu_compiler, yet without its op: a stand-in compiler, or one that mapped nothing
        raise BackendUnavailable(
            f"{path.name} carries the Edge TPU compiler's name but not its edgetpu-custom-op: the compiler "
            "that wrote it compiled nothing for the Edge TPU",
            "run the bundle's plain int8 model on the CPU (BUNDLE:int8), or rebuild with Coral's edgetpu_compiler",
        )
    if delegate == "edgetpu" and not compiled:
        raise BackendUnavailable(
            f"{path.name} is not compiled for the Edge TPU, so it cannot run on one",
            "build on x86-64 Linux with edgetpu_compiler on PATH (Coral's apt repository), "
            "or drop --device/--delegate edgetpu to run the plain int8 model on the CPU",
        )


class LiteRTRuntime:
    """Run a ``.tflite`` model.

    Args:
        model_path: the model file.
        input_spec: preprocessing + input tensor description (from the bundle); read from
            the model when omitted.
        delegate: ``"xnnpack"`` (LiteRT's default delegate), ``"none"`` (plain built-in
            kernels) or ``"edgetpu"`` (``libedgetpu.so.1``).
        num_threads: CPU threads for the interpreter; measure, more is not always faster.
        device: Edge TPU device string (``usb``, ``usb:0``, ``pci:0``...).
        profile: accepted so one ``--profile`` opens every variant of a benchmark; LiteRT's
            Python API has no per-op timings, so the profile is the static :meth:`op_profile`.

    Any other keyword is an error (see :attr:`OPTIONS`).

    ``infer`` returns copies (``get_tensor`` copies), so results stay valid after the next
    call. One instance must not be used from two threads at once.
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("delegate", "str", "xnnpack", "xnnpack, none (built-in kernels) or edgetpu",
               choices=("xnnpack", "none", "edgetpu")),
        Option("num_threads", "int", None, "CPU threads for the interpreter", ge=1, le=MAX_THREADS),
        Option("device", "str", None, "Edge TPU device: usb, usb:N, pci, pci:N"),
        Option("profile", "bool", False, "no effect: the op profile is static (op_profile)"),
    )
    _DEFAULT = defaults(OPTIONS)  # the keyword defaults below come from the spec, never a second copy

    def __init__(
        self,
        model_path: str | Path,
        input_spec: InputSpec | None = None,
        delegate: str = _DEFAULT["delegate"],
        num_threads: int | None = _DEFAULT["num_threads"],
        device: str | None = _DEFAULT["device"],
        profile: bool = _DEFAULT["profile"],
    ):
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ModelError(f"model {self.model_path} does not exist")
        mod, self._backend = _interpreter_module()
        self._delegate_name = delegate or "none"
        self.compiled_for_edgetpu = is_edgetpu_compiled(self.model_path)
        _check_delegate_fits(self.model_path, self._delegate_name, self.compiled_for_edgetpu)
        if num_threads is not None:
            num_threads = int(num_threads)
            if not 1 <= num_threads <= MAX_THREADS:  # 100000 segfaults inside LiteRT
                raise ModelError(f"num_threads must be 1 to {MAX_THREADS}, not {num_threads}",
                                 f"use --threads 1 to {MAX_THREADS}")
        kwargs: dict[str, Any] = {"model_path": str(self.model_path), "num_threads": num_threads}
        self._delegates = []
        self.device = device
        if self._delegate_name == "edgetpu":
            self._delegates = [load_edgetpu_delegate(mod, device)]
            kwargs["experimental_delegates"] = self._delegates
        elif self._delegate_name == "none":
            kwargs["experimental_op_resolver_type"] = mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        elif self._delegate_name != "xnnpack":
            raise ModelError(f"unknown LiteRT delegate {delegate!r}", "use xnnpack, none or edgetpu")
        t0 = time.perf_counter_ns()
        try:
            # LiteRT prints "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." from C++
            # on fd 2 with no switch to turn it off (edgekit.util.quiet): it goes to the DEBUG log.
            with native_stderr_to_log(log):
                self._interp = mod.Interpreter(**kwargs)
                inputs = self._interp.get_input_details()
                if len(inputs) == 1:  # before allocating: a free image size is allocated as 1x1
                    _check_image_input(self.model_path, inputs[0])
                self._interp.allocate_tensors()
            self._input_details = self._interp.get_input_details()
            self._output_details = self._interp.get_output_details()
        except (ValueError, RuntimeError) as exc:  # UnicodeDecodeError too: a tensor name that is not UTF-8
            raise ModelError(
                f"LiteRT cannot load {self.model_path}: {first_line(exc)}",
                "check that the file is a complete .tflite model for this runtime",
            ) from exc
        self.init_ms = (time.perf_counter_ns() - t0) / 1e6
        self.num_threads = num_threads or 1  # LiteRT's own default when none is given
        if len(self._input_details) != 1:
            raise ModelError(
                f"{self.model_path} has {len(self._input_details)} inputs; edgekit runs single-input models"
            )
        self._input_index = self._input_details[0]["index"]
        self._output_indices = [o["index"] for o in self._output_details]
        self.input_spec = _image_spec(self.model_path, self._input_details[0], input_spec)
        # (scale, zero_point) per output, None for float outputs: what results.Decoder needs.
        self.output_quantization = [_quantization(d) for d in self._output_details]

    # The three calls below are the whole hot path; keep it that way (benchmarks/overhead.py).
    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        """Run one inference on a tensor shaped and typed as ``input_spec``."""
        interp = self._interp
        try:  # free when nothing is raised (Python 3.11's zero-cost exceptions)
            interp.set_tensor(self._input_index, tensor)
            interp.invoke()
        except (ValueError, RuntimeError) as exc:  # a kernel that fails on this input: one line, not a traceback
            raise ModelError(f"LiteRT failed running {self.model_path.name}: {first_line(exc, 300)}",
                             "the model cannot run on this input as converted: convert it again") from exc
        return [interp.get_tensor(i) for i in self._output_indices]

    # Read-only views of the interpreter, so builders, inspect and bench never reach into _interp.
    def input_details(self) -> list[dict[str, Any]]:
        """The interpreter's input tensor details (name, index, shape, dtype, quantization)."""
        return list(self._input_details)

    def output_details(self) -> list[dict[str, Any]]:
        """The interpreter's output tensor details, in output order."""
        return list(self._output_details)

    def tensor_details(self) -> list[dict[str, Any]]:
        """Details of every tensor of the graph (index, name, dtype, shape, quantization)."""
        return self._read_graph(lambda interp: interp.get_tensor_details())

    def ops_details(self) -> list[dict[str, Any]]:
        """The execution plan: the original nodes, then one ``DELEGATE`` node per delegated partition."""
        return self._read_graph(lambda interp: interp._get_ops_details())  # LiteRT has no public API for the plan

    def _read_graph(self, read: Any) -> list[dict[str, Any]]:
        """``read(interpreter)``; a graph LiteRT loaded but cannot describe (a tensor name that is
        not UTF-8 raises UnicodeDecodeError in every details call) is a ModelError, not a traceback."""
        if self._interp is None:
            raise ModelError("LiteRTRuntime used after close()")
        try:
            return read(self._interp)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"LiteRT cannot describe the graph of {self.model_path}: {first_line(exc)}",
                             "the model file is corrupt: copy or export it again") from exc

    def delegation(self) -> dict[str, int]:
        """How many of the model's nodes a delegate took (measured, not predicted)."""
        return delegation_coverage(self.ops_details())

    def op_profile(self) -> list[dict[str, Any]]:
        """Ops by type and where they run (delegated or CPU kernels), most frequent first.

        The LiteRT Python API exposes no per-op timings (the C++ benchmark tool's
        ``--enable_op_profiling`` does); this is the static half of a profile.
        """
        ops = self.ops_details()
        original = [o for o in ops if o.get("op_name") != "DELEGATE"]
        delegated = delegated_nodes(ops)
        total: Counter[str] = Counter(o["op_name"] for o in original)
        on_delegate: Counter[str] = Counter(o["op_name"] for o in original if o["index"] in delegated)
        return [
            {"op_type": name, "count": n, "delegated": on_delegate[name], "cpu": n - on_delegate[name]}
            for name, n in total.most_common()
        ]

    def describe(self) -> dict[str, Any]:
        """Backend, version, the delegate really applied and how many nodes it took."""
        import importlib.metadata as md

        try:
            version = md.version("ai-edge-litert" if self._backend == "ai_edge_litert" else "tflite-runtime")
        except md.PackageNotFoundError:
            version = "unknown"
        info = {
            "backend": self._backend,
            "version": version,
            "model": self.model_path.name,
            "delegate_requested": self._delegate_name,
            "num_threads": self.num_threads,
            "device": self.device if self._delegate_name == "edgetpu" else None,
            "compiled_for_edgetpu": self.compiled_for_edgetpu,
            "init_ms": round(self.init_ms, 3),
            "input": {
                "dtype": self.input_spec.dtype,
                "shape": list(self.input_spec.shape),
                "scale": self.input_spec.scale,
                "zero_point": self.input_spec.zero_point,
            },
            "outputs": [
                {"dtype": np.dtype(d["dtype"]).name, "shape": [int(x) for x in d["shape"]], "quantization": q}
                for d, q in zip(self._output_details, self.output_quantization)
            ],
        }
        info.update(self.delegation())
        info["delegate_applied"] = info["delegate_kernels"] > 0
        return info

    def close(self) -> None:
        self._interp = None
        self._delegates = []

    def __enter__(self) -> LiteRTRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
