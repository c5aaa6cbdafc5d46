"""Offline Edge TPU compatibility check: which ops of a ``.tflite`` the Edge TPU can run.

Works without the compiler (which exists only for x86-64 Linux) and without TensorFlow:
the graph is read with :mod:`edgekit.tflite.graph` and every operator is checked against
the rules Coral publishes ("TensorFlow models on the Edge TPU", coral.ai/docs/edgetpu/
models-intro): fully int8/uint8 quantised tensors, static shapes, only the 3 innermost
dimensions > 1, an op from the supported-operations table, and that table's per-op
limits. The compiler maps one segment: it cuts the graph at the first op it cannot
map (in execution order) and everything from there on runs on the CPU.

This is a *prediction*; ``edgetpu_compiler`` has the last word (see
:mod:`edgekit.builders.edgetpu_compiler`). :data:`IMPLEMENTED_RULES` and
:data:`NOT_IMPLEMENTED_RULES` say exactly what is and is not modelled.

>>> report = check_model("model_int8.tflite")          # doctest: +SKIP
>>> report.op_share, report.cut, report.cache_status    # doctest: +SKIP
(1.0, None, 'fits')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgekit.tflite.graph import Graph, OperatorInfo, TensorInfo, read_graph

# The compiler's name and why it may be absent; shared by the build (builders/edgetpu.py) and
# `edgekit inspect`, which must not import the build side.
COMPILER = "edgetpu_compiler"
ABSENT_REASON = (
    "edgetpu_compiler not found (it runs only on x86-64 Linux and comes from Coral's apt repository, "
    "package edgetpu-compiler); the plain int8 model and the offline report are kept"
)

MIB = 1024 * 1024
# The Edge TPU has 8 MiB of SRAM; compiler reports show about 6.9-7.5 MiB of it offered
# for parameters ("used" + "remaining" in the compiler's summary), the rest holds
# instructions. Parameters that do not fit are streamed from the host on every inference.
CACHE_BYTES = 8 * MIB
CACHE_SAFE_BYTES = int(6.8 * MIB)

LATEST_RUNTIME = 14  # Edge TPU runtime of compiler 16, the last release
QUANTISED_DTYPES = ("int8", "uint8")
COMPILED_OP = "edgetpu-custom-op"  # what edgetpu_compiler puts in *_edgetpu.tflite

# Coral's supported-operations table: TFLite opcode -> (minimum Edge TPU runtime version,
# Coral's "known limitations" text). Runtime 0 stands for Coral's "All".
SUPPORTED_OPS: dict[str, tuple[int, str]] = {
    "ADD": (0, ""),
    "AVERAGE_POOL_2D": (0, "No fused activation function."),
    "CONCATENATION": (0, "No fused activation function. If any input is a compile-time constant tensor, "
                         "there must be only 2 inputs, and this constant tensor must be all zeroes."),
    "CONV_2D": (0, "Must use the same dilation in x and y dimensions."),
    "DEPTHWISE_CONV_2D": (0, "Runtime <= 12: dilated kernels not supported. 13+: same dilation in x and y."),
    "EXPAND_DIMS": (13, ""),
    "FULLY_CONNECTED": (0, "Only the default format for weights. Output tensor is one-dimensional."),
    "L2_NORMALIZATION": (0, ""),
    "LOGISTIC": (0, ""),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": (14, "Unidirectional LSTM only."),
    "MAXIMUM": (0, ""),
    "MAX_POOL_2D": (0, "No fused activation function."),
    "MEAN": (0, "No reduction in batch dimension. Runtime <= 12: x/y reduction only. "
                "13+: a z-reduction needs a z-dimension that is a multiple of 4."),
    "MINIMUM": (0, ""),
    "MUL": (0, ""),
    "PACK": (0, "No packing in batch dimension."),
    "PAD": (0, "No padding in batch dimension. Runtime <= 12: x/y padding only."),
    "PRELU": (13, "Alpha must be a constant."),
    "QUANTIZE": (13, ""),
    "REDUCE_MAX": (14, "Cannot operate on the batch dimension."),
    "REDUCE_MIN": (14, "Cannot operate on the batch dimension."),
    "RELU": (0, ""),
    "RELU6": (0, ""),
    "RELU_N1_TO_1": (0, ""),
    "RESHAPE": (0, "Certain reshapes might not be mapped for large tensor sizes."),
    "RESIZE_BILINEAR": (0, "Input/output is a 3-dimensional tensor. Depending on input/output size, may "
                           "not be mapped to avoid loss in precision."),
    "RESIZE_NEAREST_NEIGHBOR": (0, "Input/output is a 3-dimensional tensor. Depending on input/output "
                                   "size, may not be mapped to avoid loss in precision."),
    "RSQRT": (14, ""),
    "SLICE": (0, ""),
    "SOFTMAX": (0, "Supports only a 1-D input tensor with a max of 16,000 elements."),
    "SPACE_TO_DEPTH": (0, ""),
    "SPLIT": (0, "No splitting in batch dimension."),
    "SQUARED_DIFFERENCE": (14, ""),
    "SQUEEZE": (0, "Runtime <= 12: only leading 1s may be squeezed (no relayout)."),
    "STRIDED_SLICE": (0, "All strides equal to 1, ellipsis-axis-mask == 0, new-axis-mask == 0."),
    "SUB": (0, ""),
    "SUM": (13, "Cannot operate on the batch dimension."),
    "TANH": (0, ""),
    "TRANSPOSE_CONV": (13, ""),
}  # fmt: skip

IMPLEMENTED_RULES: tuple[str, ...] = (
    "every activation tensor int8/uint8 with quantisation parameters; constants int8/uint8 (int32 for "
    "biases and shape operands): otherwise 'not int8/uint8 quantised'",
    "static shapes: a -1 in any activation tensor's shape_signature is 'dynamic shape'",
    "tensor rank: only the 3 innermost dimensions may be > 1 (so batch must be 1)",
    "op must be in Coral's supported-operations table, for the chosen minimum runtime version "
    "(custom ops are never supported)",
    "AVERAGE_POOL_2D, MAX_POOL_2D, CONCATENATION: no fused activation function",
    "CONCATENATION: a constant input only as one of exactly 2 inputs, and all zeroes",
    "CONV_2D, DEPTHWISE_CONV_2D: same dilation in x and y; DEPTHWISE_CONV_2D not dilated below runtime 13",
    "FULLY_CONNECTED: default weights format; output one-dimensional (keep_num_dims giving >1-D fails)",
    "MEAN: no batch reduction; runtime <= 12 x/y only; 13+ z-reduction needs z a multiple of 4",
    "SUM, REDUCE_MAX, REDUCE_MIN: no batch-dimension reduction",
    "PAD: no batch padding; runtime <= 12 x/y padding only",
    "PACK, SPLIT: not along the batch dimension",
    "PRELU: constant alpha",
    "SOFTMAX: 1-D input (leading 1s allowed) of at most 16,000 elements",
    "SQUEEZE (runtime <= 12): only leading 1s",
    "STRIDED_SLICE: all strides 1, ellipsis_mask == 0, new_axis_mask == 0",
    "RESIZE_BILINEAR/RESIZE_NEAREST_NEIGHBOR: 3-D input/output (rank rule); a size-dependent refusal is "
    "flagged as a note",
    "graph cut at the first unmapped op in execution order; every later op runs on the CPU",
    "more than one subgraph (control flow): warned, only the main subgraph is mapped",
    "parameter bytes of the TPU segment against the ~8 MiB on-chip cache (off-chip streaming warning)",
    "an already compiled *_edgetpu.tflite: ops inside edgetpu-custom-op count as on the TPU",
)

NOT_IMPLEMENTED_RULES: tuple[str, ...] = (
    "size thresholds at which the compiler refuses RESIZE_* ('to avoid loss in precision') or large "
    "RESHAPEs: unpublished, reported only as a note",
    "the compiler's 'unspecified limitation' and 'Operation version not supported' refusals (older "
    "compilers reject newer op versions); depend on the compiler build",
    "ops newer compilers map although Coral's table omits them (e.g. TRANSPOSE): predicted as unsupported",
    "activation/instruction memory limits ('large activation tensors' failures)",
    "partitioning details: independent branches after the cut that the compiler may still map, "
    "multiple subgraphs (-a) and segmentation (-n)",
    "exact cache layout: the compiler pads and re-lays-out parameters; co-compiled models share the cache",
    "int8 quantisation quality (per-tensor vs per-channel scales, saturation): checked by verification, not here",
)


@dataclass(frozen=True)
class OpVerdict:
    """The prediction for one operator (``index`` is its execution position)."""

    index: int
    opcode: str
    dtypes: str
    on_tpu: bool
    reason: str
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    parameter_bytes: int = 0


@dataclass(frozen=True)
class OpRow:
    """Ops aggregated like the compiler's Operator/Count/Status table."""

    opcode: str
    count: int
    dtypes: str
    on_tpu: bool
    reason: str


@dataclass(frozen=True)
class CompatReport:
    """Offline Edge TPU compatibility of one model. ``to_dict()`` is JSON-ready."""

    model: str
    runtime_version: int
    subgraphs: int
    compiled: bool
    ops: tuple[OpVerdict, ...]
    rows: tuple[OpRow, ...]
    cut: OpVerdict | None
    total_ops: int
    tpu_ops: int
    parameter_bytes: int
    tpu_parameter_bytes: int
    cache_status: str
    cache_message: str
    warnings: tuple[str, ...] = ()

    @property
    def cpu_ops(self) -> int:
        return self.total_ops - self.tpu_ops

    @property
    def op_share(self) -> float:
        """Share of operators predicted on the Edge TPU (0..1)."""
        return self.tpu_ops / self.total_ops if self.total_ops else 0.0

    @property
    def parameter_share(self) -> float:
        """Share of parameter bytes predicted on the Edge TPU (0..1)."""
        return self.tpu_parameter_bytes / self.parameter_bytes if self.parameter_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            cpu_ops=self.cpu_ops,
            op_share=round(self.op_share, 4),
            parameter_share=round(self.parameter_share, 4),
            cache_bytes=CACHE_BYTES,
        )
        return d


def check_model(path: str | Path, runtime_version: int | None = None) -> CompatReport:
    """Predict which operators of a ``.tflite`` file run on the Edge TPU.

    Args:
        path: the model (full-integer int8 for any chance of mapping).
        runtime_version: the oldest Edge TPU runtime the model must run on (the compiler's
            ``--min_runtime_version``); None means the newest (14).

    Raises:
        ModelError: the file is not a readable ``.tflite``.
    """
    return check_graph(read_graph(path), runtime_version)


def check_graph(graph: Graph, runtime_version: int | None = None) -> CompatReport:
    """:func:`check_model` for an already parsed graph."""
    runtime = LATEST_RUNTIME if runtime_version is None else int(runtime_version)
    compiled = any(op.opcode == COMPILED_OP for op in graph.operators)
    verdicts: list[OpVerdict] = []
    cut: OpVerdict | None = None
    for op in graph.operators:
        dtypes = graph.dtype_label(op)
        params = graph.op_parameter_bytes(op)
        if compiled:
            on = op.opcode == COMPILED_OP
            reason = "compiled for the Edge TPU" if on else "left on the CPU by edgetpu_compiler"
            verdicts.append(OpVerdict(op.index, op.opcode, dtypes, on, reason, (), (), params))
            continue
        problems, notes = _problems(graph, op, runtime)
        if cut is None and not problems:
            verdicts.append(OpVerdict(op.index, op.opcode, dtypes, True, "mapped", (), notes, params))
            continue
        after_cut = f"after the cut at op {cut.index} ({cut.opcode}): runs on the CPU" if cut else ""
        reason = problems[0] if problems else after_cut
        verdict = OpVerdict(op.index, op.opcode, dtypes, False, reason, tuple(problems), notes, params)
        if cut is None:
            cut = verdict
        verdicts.append(verdict)

    tpu_ops = sum(v.on_tpu for v in verdicts)
    # Each constant counted once even when several ops read it (shared weights).
    tpu_params = _params_of(graph, [op for op, v in zip(graph.operators, verdicts) if v.on_tpu])
    total_params = graph.parameter_bytes
    status, message = _cache(tpu_params, tpu_ops)
    warnings = []
    if graph.subgraph_count > 1:
        warnings.append(
            f"{graph.subgraph_count} subgraphs: the Edge TPU maps only the main one "
            "(control flow such as WHILE/IF runs on the CPU)"
        )
    if not compiled and cut is not None and tpu_ops:
        warnings.append(
            f"graph cut at op {cut.index} ({cut.opcode}: {cut.reason}); "
            f"{len(verdicts) - cut.index} of {len(verdicts)} ops run on the CPU"
        )
    if not compiled and cut is not None and not tpu_ops:
        warnings.append(f"no op is predicted to run on the Edge TPU (op {cut.index} {cut.opcode}: {cut.reason})")
    if status == "streams":
        warnings.append(message)
    return CompatReport(
        model=str(graph.path),
        runtime_version=runtime,
        subgraphs=graph.subgraph_count,
        compiled=compiled,
        ops=tuple(verdicts),
        rows=_rows(verdicts),
        cut=None if compiled else cut,
        total_ops=len(verdicts),
        tpu_ops=tpu_ops,
        parameter_bytes=total_params,
        tpu_parameter_bytes=tpu_params,
        cache_status=status,
        cache_message=message,
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------------------------------
# Rules. Each returns a list of problems (strings); the first one becomes the reason.


def _problems(graph: Graph, op: OperatorInfo, runtime: int) -> tuple[list[str], tuple[str, ...]]:
    problems: list[str] = []
    problems += _quantisation(graph, op)
    problems += _dynamic(graph, op)
    problems += _rank(graph, op)
    supported = _supported(op, runtime)
    problems += supported
    notes: list[str] = []
    if not supported:
        check = _OP_LIMITS.get(op.opcode)
        if check is not None:
            problems += check(graph, op, runtime, notes)
    return problems, tuple(notes)


def _activations(graph: Graph, op: OperatorInfo) -> list[TensorInfo]:
    tensors = [graph.tensor(i) for i in (*op.inputs, *op.outputs)]
    return [t for t in tensors if t is not None and not t.is_constant]


def _quantisation(graph: Graph, op: OperatorInfo) -> list[str]:
    bad: list[str] = []
    for i in (*op.inputs, *op.outputs):
        t = graph.tensor(i)
        if t is None:
            continue
        if t.is_constant:
            # int32 constants are biases (quantised) and shape/axis operands: both fine.
            ok = t.dtype in QUANTISED_DTYPES or t.dtype == "int32"
        else:
            ok = t.dtype in QUANTISED_DTYPES and t.quantised
        label = t.dtype if t.dtype not in QUANTISED_DTYPES else f"{t.dtype} without scale"
        if not ok and label not in bad:
            bad.append(label)
    # No tensor names in the reason, so equal failures aggregate into one table row.
    return [f"not int8/uint8 quantised ({', '.join(bad)})"] if bad else []


def _dynamic(graph: Graph, op: OperatorInfo) -> list[str]:
    for t in _activations(graph, op):
        if t.dynamic:
            return [f"dynamic shape (shape_signature {list(t.shape_signature or ())})"]
    return []


def _rank(graph: Graph, op: OperatorInfo) -> list[str]:
    for t in _activations(graph, op):
        if len(t.shape) > 3 and any(d > 1 for d in t.shape[:-3]):
            return [f"tensor rank rule: {list(t.shape)} has a dimension > 1 outside the 3 innermost (batch must be 1)"]
    return []


def _supported(op: OperatorInfo, runtime: int) -> list[str]:
    if op.custom:
        return [f"custom op {op.opcode!r} is not supported by the Edge TPU"]
    entry = SUPPORTED_OPS.get(op.opcode)
    if entry is None:
        return [f"{op.opcode} is not in the Edge TPU's supported-operations table"]
    if entry[0] > runtime:
        return [f"{op.opcode} needs Edge TPU runtime {entry[0]}+ (minimum runtime {runtime} requested)"]
    return []


def _const_ints(graph: Graph, index: int) -> list[int] | None:
    value = graph.constant(index)
    return None if value is None else [int(v) for v in value.reshape(-1)]


def _input_rank(graph: Graph, op: OperatorInfo) -> int:
    t = graph.tensor(op.inputs[0]) if op.inputs else None
    return len(t.shape) if t is not None else 0


def _axes(graph: Graph, op: OperatorInfo, index: int) -> list[int] | None:
    values = _const_ints(graph, op.inputs[index]) if len(op.inputs) > index else None
    if values is None:
        return None
    rank = _input_rank(graph, op)
    return [a + rank if a < 0 else a for a in values]


def _no_fused_activation(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    act = op.options.get("fused_activation_function", "NONE")
    if act not in ("NONE", 0):
        return [f"{op.opcode} with a fused activation ({act}) is not supported"]
    return []


def _concatenation(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    problems = _no_fused_activation(graph, op, runtime, notes)
    constants = [i for i in op.inputs if (t := graph.tensor(i)) is not None and t.is_constant]
    if constants:
        values = graph.constant(constants[0])
        if len(op.inputs) != 2 or (values is not None and bool((values != 0).any())):
            problems.append("CONCATENATION with a constant input needs exactly 2 inputs and an all-zero constant")
    return problems


def _dilation(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    dh = int(op.options.get("dilation_h_factor", 1))
    dw = int(op.options.get("dilation_w_factor", 1))
    if op.opcode == "DEPTHWISE_CONV_2D" and runtime <= 12 and (dh > 1 or dw > 1):
        return [f"dilated DEPTHWISE_CONV_2D ({dh}x{dw}) needs Edge TPU runtime 13+"]
    if dh != dw:
        return [f"{op.opcode} dilation differs in y and x ({dh} vs {dw})"]
    return []


def _fully_connected(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    problems = []
    fmt = op.options.get("weights_format", "DEFAULT")
    if fmt not in ("DEFAULT", 0):
        problems.append(f"FULLY_CONNECTED weights format {fmt} (only DEFAULT is supported)")
    out = graph.tensor(op.outputs[0]) if op.outputs else None
    if out is not None and any(d > 1 for d in out.shape[:-1]):
        why = " (keep_num_dims)" if op.options.get("keep_num_dims") else ""
        problems.append(f"FULLY_CONNECTED output {list(out.shape)} is not one-dimensional{why}")
    return problems


def _mean(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    problems = _no_batch_axes(graph, op, runtime, notes)
    axes = _axes(graph, op, 1)
    rank = _input_rank(graph, op)
    if axes is None or rank < 3:
        return problems
    z_axis = rank - 1
    if z_axis in axes:
        if runtime <= 12:
            problems.append("MEAN over the channel (z) dimension needs Edge TPU runtime 13+")
        else:
            depth = graph.tensor(op.inputs[0]).shape[-1]
            if depth % 4:
                problems.append(f"MEAN over the channel (z) dimension needs a multiple of 4 channels, not {depth}")
    return problems


def _no_batch_axes(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    axes = _axes(graph, op, 1)
    if axes is None:
        return [f"{op.opcode} axes are not a constant"]
    if 0 in axes and _input_rank(graph, op) >= 2:
        return [f"{op.opcode} reduces the batch dimension"]
    return []


def _pad(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    pads = graph.constant(op.inputs[1]) if len(op.inputs) > 1 else None
    if pads is None:
        return ["PAD paddings are not a constant"]
    pads = pads.reshape(-1, 2)
    if len(pads) >= 2 and pads[0].any():
        return ["PAD pads the batch dimension"]
    if runtime <= 12 and len(pads) == 4 and pads[3].any():
        return ["PAD along the channel dimension needs Edge TPU runtime 13+"]
    return []


def _pack(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    if int(op.options.get("axis", 0)) == 0:
        return ["PACK along the batch dimension"]
    return []


def _split(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    # SPLIT's first input is the axis; the data tensor is the second.
    axis = _const_ints(graph, op.inputs[0]) if op.inputs else None
    data = graph.tensor(op.inputs[1]) if len(op.inputs) > 1 else None
    if axis is None or data is None:
        return ["SPLIT axis is not a constant"]
    a = axis[0] + len(data.shape) if axis[0] < 0 else axis[0]
    return ["SPLIT along the batch dimension"] if a == 0 and len(data.shape) >= 2 else []


def _prelu(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    alpha = graph.tensor(op.inputs[1]) if len(op.inputs) > 1 else None
    return [] if alpha is not None and alpha.is_constant else ["PRELU alpha is not a constant"]


def _softmax(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    t = graph.tensor(op.inputs[0]) if op.inputs else None
    if t is None:
        return []
    if any(d > 1 for d in t.shape[:-1]):
        return [f"SOFTMAX input {list(t.shape)} is not one-dimensional"]
    if t.shape and t.shape[-1] > 16000:
        return [f"SOFTMAX over {t.shape[-1]} elements (the Edge TPU allows 16,000)"]
    return []


def _squeeze(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    t = graph.tensor(op.inputs[0]) if op.inputs else None
    if runtime > 12 or t is None:
        return []
    first_big = next((i for i, d in enumerate(t.shape) if d > 1), len(t.shape))
    dims = [d + len(t.shape) if d < 0 else d for d in op.options.get("squeeze_dims", [])]
    dims = dims or [i for i, d in enumerate(t.shape) if d == 1]
    if any(d > first_big for d in dims):
        return ["SQUEEZE of a non-leading dimension needs Edge TPU runtime 13+"]
    return []


def _strided_slice(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    problems = []
    strides = _const_ints(graph, op.inputs[3]) if len(op.inputs) > 3 else None
    if strides is None or any(s != 1 for s in strides):
        problems.append(f"STRIDED_SLICE strides {strides} (all must be 1)")
    if int(op.options.get("ellipsis_mask", 0)):
        problems.append("STRIDED_SLICE with an ellipsis mask")
    if int(op.options.get("new_axis_mask", 0)):
        problems.append("STRIDED_SLICE with a new-axis mask")
    return problems


def _resize(graph: Graph, op: OperatorInfo, runtime: int, notes: list[str]) -> list[str]:
    # Sizes the compiler refuses are not published: keep a note, predict "mapped".
    notes.append("the compiler may refuse this resize for some input/output sizes (precision)")
    return []


_Limit = Callable[[Graph, OperatorInfo, int, list], list]
_OP_LIMITS: dict[str, _Limit] = {
    "AVERAGE_POOL_2D": _no_fused_activation,
    "MAX_POOL_2D": _no_fused_activation,
    "CONCATENATION": _concatenation,
    "CONV_2D": _dilation,
    "DEPTHWISE_CONV_2D": _dilation,
    "FULLY_CONNECTED": _fully_connected,
    "MEAN": _mean,
    "SUM": _no_batch_axes,
    "REDUCE_MAX": _no_batch_axes,
    "REDUCE_MIN": _no_batch_axes,
    "PAD": _pad,
    "PACK": _pack,
    "SPLIT": _split,
    "PRELU": _prelu,
    "SOFTMAX": _softmax,
    "SQUEEZE": _squeeze,
    "STRIDED_SLICE": _strided_slice,
    "RESIZE_BILINEAR": _resize,
    "RESIZE_NEAREST_NEIGHBOR": _resize,
}


# ---------------------------------------------------------------------------------------


def _params_of(graph: Graph, ops: list[OperatorInfo]) -> int:
    used = {i for op in ops for i in op.inputs if i >= 0}
    return sum(graph.tensors[i].constant_bytes for i in used)


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.50 KiB"`` (binary units, like the compiler)."""
    for unit, size in (("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _cache(tpu_params: int, tpu_ops: int) -> tuple[str, str]:
    size = format_bytes(tpu_params)
    if tpu_ops == 0:
        return "none", "no op is predicted on the Edge TPU, so nothing uses its parameter cache"
    if tpu_params <= CACHE_SAFE_BYTES:
        return "fits", f"{size} of parameters fit the ~8 MiB on-chip cache"
    if tpu_params <= CACHE_BYTES:
        return "tight", (
            f"{size} of parameters: near the ~7 MiB the compiler offers of the 8 MiB on-chip memory; "
            "some may stream from the host (check the compiler's off-chip figure)"
        )
    return "streams", (
        f"{size} of parameters exceed the ~8 MiB on-chip cache: at least "
        f"{format_bytes(tpu_params - CACHE_BYTES)} stream from the host on every inference (slow); "
        "use a smaller head (e.g. global average pooling instead of Flatten->Dense)"
    )


def _rows(verdicts: list[OpVerdict]) -> tuple[OpRow, ...]:
    counts: dict[tuple, int] = {}
    for v in verdicts:
        key = (v.opcode, v.dtypes, v.on_tpu, v.reason)
        counts[key] = counts.get(key, 0) + 1
    return tuple(OpRow(op, n, dt, on, reason) for (op, dt, on, reason), n in counts.items())
