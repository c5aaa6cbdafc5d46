"""Per-operator Edge TPU rules: Coral's supported-operations table and each op's limits.

:mod:`edgekit.tflite.edgetpu_rules` walks the graph, cuts it and sums the cache; this module
answers only "can the Edge TPU run this one operator?" (:func:`op_problems`). Every rule
returns a list of problems (strings); the first one becomes the op's reason.
"""

from __future__ import annotations

from collections.abc import Callable

from edgekit.tflite.graph import Graph, OperatorInfo, TensorInfo

QUANTISED_DTYPES = ("int8", "uint8")

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


def op_problems(graph: Graph, op: OperatorInfo, runtime: int) -> tuple[list[str], tuple[str, ...]]:
    """Why ``op`` cannot run on the Edge TPU (empty: it can), and notes on a mapped op.

    Args:
        graph: the parsed model.
        op: one operator of ``graph``'s main subgraph.
        runtime: the oldest Edge TPU runtime version the model must run on.

    Returns:
        ``(problems, notes)``: problems in rule order (the first is the op's reason); notes
        are caveats that do not stop mapping (e.g. a resize the compiler may refuse).
    """
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
