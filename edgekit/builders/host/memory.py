"""How many bytes one image's activations need at the widest step of a model's graph, read from
the graph itself before anything runs.

:func:`edgekit.builders.host.resources.estimate_memory` is architecture-blind (MobileNetV2-like
widths per input pixel). A wider network (64 channels at full resolution, a U-Net's skips) needs
more, and the reference run that checks a model at load (ONNX Runtime, LiteRT) would be
OOM-killed before that estimate was ever compared. So each source format's graph is measured
at the static input shape: for every op, the bytes of the tensors it reads (weights left out)
plus those it writes, and the largest such sum is the *widest step*. The build's estimate takes
whichever of the two is larger (:func:`edgekit.builders.host.preflight.check_resources`).

The same walk sums every op's outputs: the *activation total* of one image, what an interpreter
that keeps every tensor holds (int8 recovery's per-layer probe and the quantisation report run
those; :func:`edgekit.builders.host.resources.estimate_memory`). Each reader returns an
:class:`Activations`: an ``int`` (the widest step, what the loaders' ``precheck`` always got) that
also carries ``total``.

Every reader returns None when the graph's shapes are not all known (a dynamic input the
format cannot propagate without running): the architecture-blind estimate stands then.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# ONNX TensorProto element types -> bytes (bool/uint8/int8 1, float16/bfloat16 2, float/int32 4,
# double/int64/uint64 8); strings and complex types count as 8
_ONNX_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}


class Activations(int):
    """A graph's widest step for one image (bytes: the ``int`` itself) with ``total``, the bytes of
    every op output of one image summed (each tensor counted once, where it is written)."""

    total: int

    def __new__(cls, widest: int, total: int) -> Activations:
        """``Activations(widest, total)``."""
        made = super().__new__(cls, widest)
        made.total = int(total)
        return made

    def __reduce__(self):
        """Pickled with its ``total`` (an int subclass would otherwise lose it)."""
        return Activations, (int(self), self.total)


# How many tensors of its output's size each op leaves in the graph int8 quantises, when it is not
# one: TensorFlow's converter fuses batch norm and ReLU/ReLU6 into the op before them (0), and the
# int8 build rewrites PRELU and HARD_SWISH into up to four ops (builders/graph: DEPTHWISE_CONV_2D,
# ADD, MUL and SUB; ADD+RELU6, MUL, MUL). ONNX, TFLite, TensorFlow and Keras spellings.
TOTAL_WEIGHTS = {
    **dict.fromkeys(("BatchNormalization", "FusedBatchNormV3", "BiasAdd", "Relu", "Relu6", "ReLU", "Clip"), 0),
    **dict.fromkeys(("PRELU", "PRelu", "Prelu", "PReLU", "HARD_SWISH", "HardSwish"), 4),
}


def widest_step(steps: Iterable[tuple]) -> Activations | None:
    """The largest ``sum(reads) + sum(writes)`` (bytes) of ``steps``, with the sum of every step's
    writes, each times the step's weight (a third item, 1 without one), as its ``total``; None
    when there are none."""
    best, written = None, 0
    for reads, writes, *weight in steps:
        step = int(sum(reads)) + int(sum(writes))
        written += int(sum(writes)) * (weight[0] if weight else 1)
        best = step if best is None else max(best, step)
    return None if best is None else Activations(best, int(written))


def activation_total(activation_bytes: int | None) -> int | None:
    """The ``total`` of an :class:`Activations` (None for a plain int or None: not measured)."""
    return getattr(activation_bytes, "total", None)


def _dims_bytes(dims: Sequence, itemsize: int) -> int | None:
    """Bytes of a tensor of ``dims`` (a leading unknown batch counts as 1); None if any other is unknown."""
    known = [1 if i == 0 and (d is None or d <= 0) else d for i, d in enumerate(dims)]
    if any(d is None or d < 0 for d in known):
        return None
    return int(np.prod(known, dtype=np.int64)) * itemsize


def onnx_activation_bytes(model) -> int | None:
    """The widest step of an ONNX ``ModelProto`` whose input shape is static (after
    :func:`edgekit.builders.sources.onnx.prepare`), from ONNX shape inference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a graph shape inference cannot follow: the blind estimate stands
        return None
    sizes: dict[str, int | None] = {}
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    for info in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        t = info.type.tensor_type
        if not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        found = _dims_bytes(dims, _ONNX_BYTES.get(t.elem_type, 8))
        if found is not None:
            sizes[info.name], shapes[info.name] = found, dims
    weights = {i.name for i in model.graph.initializer}
    constant = set(weights)  # weights and what is computed from them alone (Constant, Shape chains)
    steps = []
    for node in inferred.graph.node:
        reads = [sizes.get(n, 0) for n in node.input if n and n not in weights]
        for n in node.output:
            if n and n not in sizes:  # shape inference lost it (a Reshape to a computed shape)
                sizes[n] = _bounded_output(node, sizes, shapes)
        writes = [sizes[n] for n in node.output if n]
        if any(w is None for w in writes):
            return None  # an output whose shape is unknown could be the widest
        if all(n in constant for n in node.input if n) or node.op_type in ("Shape", "Size"):
            constant.update(node.output)
            steps.append((reads, writes, 0))
        else:
            steps.append((reads, writes, TOTAL_WEIGHTS.get(node.op_type, 1)))
    return widest_step(steps)


# ops whose first output has as many elements as their first input: a lost shape is that size
_SAME_SIZE = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Dropout", "Cast"}
# element-wise ops: a lost output shape is the largest input's (broadcasting a weight adds nothing)
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid",
                "HardSwish", "Tanh", "Clip", "Softmax", "LogSoftmax", "Exp", "Log", "Sqrt", "Erf", "Neg", "Abs",
                "BatchNormalization"}


def _bounded_output(node, sizes: dict[str, int | None], shapes: dict[str, list]) -> int | None:
    """The bytes of ``node``'s first output when shape inference lost its shape but its op says
    (see :data:`_SAME_SIZE`, :data:`_ELEMENTWISE`; MatMul/Gemm by a 2-D matrix of known shape);
    None otherwise (the graph then stays unmeasured)."""
    first = sizes.get(node.input[0]) if node.input else None
    if first is None:
        return None
    if node.op_type in _SAME_SIZE:
        return first
    if node.op_type in _ELEMENTWISE:
        return max(sizes.get(n) or 0 for n in node.input if n)
    matrix = shapes.get(node.input[1], []) if len(node.input) > 1 else []
    if node.op_type in ("MatMul", "Gemm") and len(matrix) == 2 and all(matrix):
        k, n = matrix
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        return first // max(1, n if trans_b else k) * (k if trans_b else n)
    return None


def tflite_activation_bytes(interp) -> int | None:
    """The widest step of a LiteRT interpreter's graph at the shapes the file declares (before
    any resize or allocation); None when the file leaves a dimension open (shape_signature -1)."""
    try:
        tensors = {t["index"]: t for t in interp.get_tensor_details()}
        ops = interp._get_ops_details()  # noqa: SLF001 - the only op list the Python API offers
    except Exception:
        return None

    def size(index: int) -> int | None:
        t = tensors.get(index)
        if t is None:
            return 0
        if any(int(d) < 0 for d in t.get("shape_signature", t["shape"])):
            return None
        return int(np.prod(t["shape"], dtype=np.int64)) * np.dtype(t["dtype"]).itemsize

    # a weight is a tensor no op writes and no graph input feeds
    live = {d["index"] for d in interp.get_input_details()} | {i for op in ops for i in op["outputs"]}
    steps = []
    for op in ops:
        reads = [size(i) for i in op["inputs"] if i in live]
        writes = [size(i) for i in op["outputs"] if i >= 0]
        if any(v is None for v in (*reads, *writes)):
            return None
        # an op of weights alone (DEQUANTIZE of float16 weights) writes no activation
        weight = TOTAL_WEIGHTS.get(op["op_name"], 1) if reads else 0
        steps.append((reads, writes, weight))
    return widest_step(steps)


def savedmodel_activation_bytes(fn) -> int | None:
    """The widest step of a SavedModel signature's graph, from its ops' static output shapes;
    None when the signature's input has an open height or width (shapes are unknown before
    running)."""
    steps = []
    try:
        from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

        # the signature's own graph only calls the model's function (StatefulPartitionedCall):
        # inlined and frozen, its ops and their shapes are visible
        graph = convert_variables_to_constants_v2(fn, lower_control_flow=False, aggressive_inlining=True).graph
        constant: set[str] = set()  # ops computed from weights alone (a bias reshaped): no activation
        for op in graph.get_operations():
            if op.type in ("Const", "VarHandleOp", "ReadVariableOp") or (
                    op.inputs and all(t.op.name in constant for t in op.inputs)):
                constant.add(op.name)
                continue
            if op.type in ("Placeholder", "NoOp", "Identity"):
                continue
            writes = [_tf_bytes(t) for t in op.outputs]
            reads = [_tf_bytes(t) for t in op.inputs if t.op.name not in constant]
            if any(v is None for v in (*reads, *writes)):
                return None
            steps.append((reads, writes, TOTAL_WEIGHTS.get(op.type, 1)))
    except Exception:
        return None
    return widest_step(steps)


def _tf_bytes(tensor) -> int | None:
    shape = tensor.shape
    if shape.rank is None:
        return None
    try:
        itemsize = tensor.dtype.size
    except Exception:  # resource and variant tensors have no size
        return 0
    return _dims_bytes(list(shape.as_list()), itemsize)


def keras_activation_bytes(model) -> int | None:
    """The widest step of a Keras model: per layer, its input and output tensors (static shapes
    of a built model; batch counted as 1); a nested model's own layers count as its steps."""
    steps: list[tuple] = []
    try:
        if not _keras_steps(model, steps):
            return None
    except Exception:  # a subclassed model or a layer without a single input: the blind estimate
        return None
    return widest_step(steps)


def _keras_steps(model, steps: list[tuple]) -> bool:
    """Append ``model``'s layers' steps to ``steps``; False when a shape is unknown."""
    for layer in model.layers:
        if getattr(layer, "layers", None) and hasattr(layer, "input"):  # a nested functional model
            if not _keras_steps(layer, steps):
                return False
            continue
        ins = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
        outs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
        sizes = [_dims_bytes(list(t.shape), np.dtype(str(t.dtype)).itemsize) for t in (*ins, *outs)]
        if any(v is None for v in sizes):
            return False
        steps.append((sizes[: len(ins)], sizes[len(ins):], _keras_weight(layer)))
    return True


def _keras_weight(layer) -> int:
    """A Keras layer's :data:`TOTAL_WEIGHTS` (an ``Activation`` layer by its function's name)."""
    name = type(layer).__name__
    if name == "Activation":
        name = {"relu": "Relu", "relu6": "Relu6", "hard_swish": "HardSwish"}.get(
            getattr(layer.activation, "__name__", ""), name)
    return 0 if name == "InputLayer" else TOTAL_WEIGHTS.get(name, 1)
