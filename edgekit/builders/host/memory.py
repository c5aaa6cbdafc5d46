"""How many bytes one image's activations need at the widest step of a model's graph, read from
the graph itself before anything runs.

:func:`edgekit.builders.host.resources.estimate_memory` is architecture-blind (MobileNetV2-like
widths per input pixel). A wider network (64 channels at full resolution, a U-Net's skips) needs
more, and the reference run that checks a model at load (ONNX Runtime, LiteRT) would be
OOM-killed before that estimate was ever compared. So each source format's graph is measured
at the static input shape: for every op, the bytes of the tensors it reads (weights left out)
plus those it writes, and the largest such sum is the *widest step*. The build's estimate takes
whichever of the two is larger (:func:`edgekit.builders.host.preflight.check_resources`).

Every reader returns None when the graph's shapes are not all known (a dynamic input the
format cannot propagate without running): the architecture-blind estimate stands then.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

# ONNX TensorProto element types -> bytes (bool/uint8/int8 1, float16/bfloat16 2, float/int32 4,
# double/int64/uint64 8); strings and complex types count as 8
_ONNX_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}


def widest_step(steps: Iterable[tuple[Sequence[int], Sequence[int]]]) -> int | None:
    """The largest ``sum(reads) + sum(writes)`` (bytes) of ``steps``; None when there are none."""
    best = None
    for reads, writes in steps:
        total = int(sum(reads)) + int(sum(writes))
        best = total if best is None else max(best, total)
    return best


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
    sizes: dict[str, int] = {}
    for info in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        t = info.type.tensor_type
        if not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        found = _dims_bytes(dims, _ONNX_BYTES.get(t.elem_type, 8))
        if found is not None:
            sizes[info.name] = found
    weights = {i.name for i in model.graph.initializer}
    steps = []
    for node in inferred.graph.node:
        reads = [sizes.get(n, 0) for n in node.input if n and n not in weights]
        writes = [sizes.get(n) for n in node.output if n]
        if any(w is None for w in writes):
            return None  # an output whose shape is unknown could be the widest
        steps.append((reads, writes))
    return widest_step(steps)


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
        steps.append((reads, writes))
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
            steps.append((reads, writes))
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
    of a built model; batch counted as 1)."""
    steps = []
    try:
        for layer in model.layers:
            ins = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
            outs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
            sizes = [_dims_bytes(list(t.shape), np.dtype(str(t.dtype)).itemsize) for t in (*ins, *outs)]
            if any(v is None for v in sizes):
                return None
            steps.append((sizes[: len(ins)], sizes[len(ins):]))
    except Exception:  # a subclassed model or a layer without a single input: the blind estimate
        return None
    return widest_step(steps)
