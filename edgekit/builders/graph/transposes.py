"""Layout regions of a float TFLite graph dropped: the ops between a TRANSPOSE and its inverse run
on the untransposed tensors instead, exactly (the Edge TPU has no ``TRANSPOSE``).

onnx2tf leaves runs of NCHW ops between ``TRANSPOSE(0,3,1,2)`` and ``TRANSPOSE(0,2,3,1)`` wherever
its per-op layout guesses go wrong. PaddleOCR's PP-OCRv4 text detector came out with 53: onnx2tf's
``Add`` (1.29) compares its NHWC result with the ONNX (NCHW) output shape and, when both operands
are 4-D (a ``[1]`` or ``[1, C, 1, 1]`` constant is broadcast to 4-D first), "rescues" the
mismatch by transposing both to NCHW; the hard-swish and learnable-affine ops after each
convolution then ran in NCHW, and the Edge TPU graph was cut at op 4 of 299.

A region is grown from a ``TRANSPOSE`` with a constant permutation ``P``: every consumer of a
tensor in the permuted layout must be a layout-free op (elementwise: one input, or broadcasting
against a constant or another permuted tensor; ``CONCATENATION``; ``PAD``; a reduction keeping its
dims) whose other activation inputs are permuted too (more ``TRANSPOSE(P)`` entries), or a
``TRANSPOSE`` by ``P``'s inverse (an exit). Then the entries and exits go, every op in between
reads and writes the untransposed layout (shapes permuted back), its constants are permuted
(a broadcast constant taken to full rank first, a one-element constant kept), its axis,
paddings or reduced axes remapped. Any other consumer, or a model output in the region, leaves
the region as it is. Each op computes the same values in another layout: the outputs do not
change (the caller checks them, builders/graph/rewrite.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgekit.builders.graph import edit

# tflite::BuiltinOperator
TRANSPOSE, CONCATENATION, PAD, PADV2 = 39, 2, 34, 60
UNARY = frozenset({14, 19, 20, 21, 28, 47, 59, 75, 76, 92, 98, 101, 111, 117, 150, 152})
"""LOGISTIC, RELU, RELU_N1_TO_1, RELU6, TANH, EXP, NEG, SQRT, RSQRT, SQUARE, LEAKY_RELU, ABS, ELU,
HARD_SWISH, GELU, RELU_0_TO_1: one input, elementwise."""
BROADCAST = frozenset({0, 18, 41, 42, 55, 57, 78, 99})
"""ADD, MUL, SUB, DIV, MAXIMUM, MINIMUM, POW, SQUARED_DIFFERENCE: elementwise, broadcasting."""
REDUCE = frozenset({40, 74, 82})  # MEAN, SUM, REDUCE_MAX (with keep_dims)


@dataclass
class Region:
    """One layout region: the permutation, its entry and exit TRANSPOSEs, the ops between and
    the activation tensors they read and write in the permuted layout."""

    perm: list[int]
    entries: list = field(default_factory=list)
    exits: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    tensors: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _Graph:
    producer: dict
    consumers: dict
    outputs: frozenset

    @classmethod
    def of(cls, sg) -> _Graph:
        consumers: dict[int, list] = {}
        for op in sg.operators:
            for t in set(edit.valid_indices(op.inputs)):
                consumers.setdefault(t, []).append(op)
        producer = {t: op for op in sg.operators for t in edit.valid_indices(op.outputs)}
        return cls(producer, consumers, frozenset(edit.valid_indices(sg.outputs)))


def drop_layout_regions(model) -> int:
    """Drop every layout region (see the module doc) of ``model`` (the flatbuffer object, edited
    in place); returns how many TRANSPOSEs went."""
    removed = 0
    for sg in model.subgraphs:
        failed: set[int] = set()
        while True:
            graph, region = _Graph.of(sg), None
            for op in sg.operators:
                if id(op) not in failed and _perm(model, sg, op) is not None:
                    region = grow(model, sg, op, graph)
                    if region is not None:
                        break
                    failed.add(id(op))
            if region is None:
                break
            _apply(model, sg, region)
            removed += len(region.entries) + len(region.exits)
    return removed


def _perm(model, sg, op) -> list[int] | None:
    """A TRANSPOSE's constant permutation when it is not the identity, else None."""
    if edit.opcode_of(model, op.opcodeIndex) != TRANSPOSE or len(op.inputs) < 2:
        return None
    data = edit.constant_data(model, sg.tensors[int(op.inputs[1])])
    perm = None if data is None else [int(v) for v in np.frombuffer(data.tobytes(), np.int32)]
    return perm if perm and perm != list(range(len(perm))) else None


def grow(model, sg, seed, graph: _Graph) -> Region | None:
    """The layout region entered by the TRANSPOSE ``seed``, or None where it cannot go."""
    region = Region(_perm(model, sg, seed))
    inverse = [int(i) for i in np.argsort(region.perm)]
    queue, waiting, placed = [_enter(region, seed)], {}, {id(seed)}
    while queue:
        t = queue.pop()
        if t in graph.outputs or len(sg.tensors[t].shape) != len(region.perm) \
                or sg.tensors[t].type != edit.FLOAT32:
            return None
        for op in graph.consumers.get(t, []):
            if id(op) in placed:
                continue
            if _perm(model, sg, op) == inverse:
                if int(op.outputs[0]) in graph.outputs:
                    return None
                region.exits.append(op)
                placed.add(id(op))
                continue
            entered = _inputs(model, sg, op, region, graph)
            if entered is None:  # another input may join the region later (one branch not walked yet)
                waiting[id(op)] = op
                continue
            waiting.pop(id(op), None)
            region.ops.append(op)
            placed.update(id(p) for p in (op, *entered))
            queue += [_enter(region, p) for p in entered] + [int(o) for o in op.outputs]
            region.tensors.update(int(o) for o in op.outputs)
    return None if waiting else region


def _enter(region: Region, op) -> int:
    region.entries.append(op)
    region.tensors.add(int(op.outputs[0]))
    return int(op.outputs[0])


def _inputs(model, sg, op, region: Region, graph: _Graph) -> list | None:
    """The new entries (TRANSPOSE(P) ops) ``op`` brings into ``region`` when it is layout-free and
    its inputs allow it (see the module doc), else None."""
    code, rank = edit.opcode_of(model, op.opcodeIndex), len(region.perm)
    inputs = [int(t) for t in op.inputs]
    if len(edit.valid_indices(op.outputs)) != 1 or any(t < 0 for t in inputs):
        return None
    if code in UNARY or code == CONCATENATION:
        data = inputs
    elif code in BROADCAST:
        data = [t for t in inputs if _constant(model, sg, t, rank) is None]
    elif code in (PAD, PADV2) or (code in REDUCE and getattr(op.builtinOptions, "keepDims", False)):
        data = inputs[:1]
        if any(_constant(model, sg, t, rank) is None for t in inputs[1:]):
            return None
    else:
        return None
    entered = []
    for t in data:
        if t in region.tensors:
            continue
        source = graph.producer.get(t)
        if source is None or _perm(model, sg, source) != region.perm \
                or int(source.inputs[0]) in region.tensors:
            return None
        if not any(source is e for e in (*region.entries, *entered)):
            entered.append(source)
    return entered


def _constant(model, sg, t: int, rank: int) -> np.ndarray | None:
    """Tensor ``t``'s constant values in its shape (rank ``rank`` at most), else None."""
    tensor = sg.tensors[t]
    data = edit.constant_data(model, tensor)
    dtype = {edit.FLOAT32: np.float32, 2: np.int32}.get(tensor.type)  # tflite::TensorType INT32 = 2
    shape = [int(d) for d in tensor.shape] if tensor.shape is not None else []
    if data is None or dtype is None or len(shape) > rank:
        return None
    return np.frombuffer(data.tobytes(), dtype).reshape(shape)


def _apply(model, sg, region: Region) -> None:
    """Rewrite ``region`` in the untransposed layout (see the module doc)."""
    perm, rank = region.perm, len(region.perm)
    inverse = [int(i) for i in np.argsort(perm)]
    into = {int(op.outputs[0]): int(op.inputs[0]) for op in (*region.entries, *region.exits)}

    def resolve(t: int) -> int:
        while t in into:
            t = into[t]
        return t

    for t in region.tensors:
        tensor = sg.tensors[t]
        tensor.shape = np.asarray([int(tensor.shape[i]) for i in inverse], np.int32)
        if tensor.shapeSignature is not None and len(tensor.shapeSignature) == rank:
            tensor.shapeSignature = np.asarray([int(tensor.shapeSignature[i]) for i in inverse], np.int32)
    for op in region.ops:
        _relayout(model, sg, op, perm)
    gone = {id(op) for op in (*region.entries, *region.exits)}
    sg.operators = [op for op in sg.operators if id(op) not in gone]
    for op in sg.operators:
        op.inputs = [resolve(int(t)) if t >= 0 else -1 for t in op.inputs]


def _relayout(model, sg, op, perm: list[int]) -> None:
    """One region op made to work on the untransposed layout: its axis, paddings, reduced axes or
    broadcast constants permuted back."""
    code, rank = edit.opcode_of(model, op.opcodeIndex), len(perm)
    inverse = [int(i) for i in np.argsort(perm)]
    if code == CONCATENATION:
        op.builtinOptions.axis = perm[op.builtinOptions.axis % rank]
    elif code in (PAD, PADV2):
        paddings = int(op.inputs[1])
        op.inputs[1] = _new_constant(model, sg, paddings, _constant(model, sg, paddings, rank)[inverse])
    elif code in REDUCE:
        axes = _constant(model, sg, int(op.inputs[1]), rank)
        remapped = np.array([perm[a % rank] for a in axes.ravel()], np.int32).reshape(axes.shape)
        op.inputs[1] = _new_constant(model, sg, int(op.inputs[1]), remapped)
    elif code in BROADCAST:
        for i, t in enumerate(op.inputs):
            values = _constant(model, sg, int(t), rank)
            if values is not None and values.size > 1:
                full = values.reshape((1,) * (rank - values.ndim) + values.shape)
                op.inputs[i] = _new_constant(model, sg, int(t), np.ascontiguousarray(full.transpose(inverse)))


def _new_constant(model, sg, like: int, values: np.ndarray) -> int:
    """A new constant tensor of ``values``, named and typed like tensor ``like`` (which other ops
    may still read as it is)."""
    schema, _ = edit.load_schema()
    ref = sg.tensors[like]
    tensor = schema.TensorT()
    tensor.shape, tensor.type = np.asarray(values.shape, np.int32), ref.type
    tensor.name = (ref.name or b"const") + b"/untransposed"
    tensor.buffer = edit.new_buffer(model, values)
    sg.tensors.append(tensor)
    return len(sg.tensors) - 1
