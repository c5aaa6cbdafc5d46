"""Push a constant scale up through a float TFLite graph's linear ops, before quantising.

``y * c`` (``c`` a constant) at the end of a chain of ADD, SUB, constant MULs, CONCATENATION and
STRIDED_SLICE equals the same chain run on ``x * c`` at its start, with the chain's constants
scaled too. Exact in real numbers (float rounding apart), but not for int8: every tensor of the
chain gets its own per-tensor scale, and a tensor that holds values of several magnitudes pays
for the largest. A YOLOv8 export decodes its boxes in grid cells for all three levels in one
tensor, then multiplies by each anchor's stride (8, 16, 32): one int8 step of the cell tensor is
6 px on the coarsest level. Pushed up, the decode runs on ``distance * stride / input size``
(what Ultralytics' Edge TPU export computes): every tensor in [0, 1] of the input.
"""

from __future__ import annotations

import numpy as np

from edgekit.builders.graph import edit

ADD, CONCATENATION, MUL, SUB, STRIDED_SLICE = 0, 2, 18, 41, 45  # tflite::BuiltinOperator


def _value(model, sg, t: int) -> np.ndarray | None:
    """A float32 constant tensor's values, shaped; None for an activation or another type."""
    tensor = sg.tensors[t]
    data = edit.constant_data(model, tensor)
    if data is None or tensor.type != edit.FLOAT32:
        return None
    shape = [int(d) for d in tensor.shape] if tensor.shape is not None else []
    return np.frombuffer(data.tobytes(), np.float32).reshape(shape)


def _const(model, sg, values: np.ndarray, name: str) -> int:
    schema, _ = edit.load_schema()
    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.name = list(values.shape), edit.FLOAT32, name.encode()
    tensor.buffer = edit.new_buffer(model, np.ascontiguousarray(values, np.float32))
    sg.tensors.append(tensor)
    return len(sg.tensors) - 1


class Scaler:
    """Builds ``t * c`` for tensors of one subgraph by pushing ``c`` towards the inputs; new ops
    are collected in :attr:`ops` (in an order that runs) and inserted by the caller."""

    def __init__(self, model, axis: int):
        self.model, self.sg, self.axis = model, model.subgraphs[0], axis
        self.producers = {t: op for op in self.sg.operators for t in edit.valid_indices(op.outputs)}
        self.ops: list = []
        self.pushed = 0  # ops the scale went through
        self._memo: dict[tuple, int] = {}

    def _uniform(self, c: np.ndarray) -> bool:
        """``c`` is the same along the axis that CONCATENATION and STRIDED_SLICE work on."""
        return c.ndim <= self.axis or c.shape[self.axis] == 1

    def scaled(self, t: int, c: np.ndarray, depth: int = 12) -> int:
        """A tensor equal to tensor ``t`` times ``c`` (made once per tensor and scale)."""
        key = (t, c.shape, c.tobytes())
        if key not in self._memo:
            self._memo[key] = self._scaled(t, c, depth)
        return self._memo[key]

    def _scaled(self, t: int, c: np.ndarray, depth: int) -> int:
        from edgekit.builders.graph.ops import op as _op
        from edgekit.builders.graph.ops import temp as _temp

        op = self.producers.get(t)
        code = edit.opcode_of(self.model, op.opcodeIndex) if op is not None else None
        fused = getattr(op.builtinOptions, "fusedActivationFunction", 0) if op is not None else 0
        ins = edit.valid_indices(op.inputs) if op is not None else []
        values = [_value(self.model, self.sg, i) for i in ins]
        out = None
        if depth and not fused and code in (ADD, SUB) and len(ins) == 2:
            parts = [self._part(i, v, c, depth) for i, v in zip(ins, values)]
            out = self._emit(op, code, parts, t)
        elif depth and not fused and code == MUL and len(ins) == 2 and any(v is not None for v in values):
            k, x = (values[0], ins[1]) if values[0] is not None else (values[1], ins[0])
            kept = ins[1 - ins.index(x)]
            if k.size == 1:  # a scalar (x * 0.5) stays where it is: branches keep one scale to share
                out = self._emit(op, code, [self.scaled(x, c, depth - 1), kept], t)
            elif self._uniform(np.broadcast_to(k, np.broadcast_shapes(k.shape, c.shape)) * c):
                self.pushed += 1  # per-anchor strides: folded into the scale that goes up
                return self.scaled(x, k * c, depth - 1)
        elif depth and not fused and code == CONCATENATION and self._uniform(c) \
                and int(op.builtinOptions.axis) % len(self.sg.tensors[t].shape) == self.axis:
            out = self._emit(op, code, [self.scaled(i, c, depth - 1) for i in ins], t)
        elif depth and code == STRIDED_SLICE and self._uniform(c) and self._along_axis(ins[0], t):
            out = self._emit(op, code, [self.scaled(ins[0], c, depth - 1), *ins[1:]], t)
        if out is not None:
            self.pushed += 1
            return out
        scaled = _temp(self.model, self.sg, t, "scaled")
        self.ops.append(_op(self.model, self.sg, MUL, [t, _const(self.model, self.sg, c, "edgekit/scale")], scaled))
        return scaled

    def _along_axis(self, src: int, dst: int) -> bool:
        """A slice that cuts only along the scale's uniform axis (the rows), so ``c`` fits both."""
        a, b = (list(self.sg.tensors[i].shape) for i in (src, dst))
        return len(a) == len(b) and all(x == y for i, (x, y) in enumerate(zip(a, b)) if i != self.axis)

    def _part(self, t: int, value: np.ndarray | None, c: np.ndarray, depth: int) -> int:
        if value is not None:  # a constant operand is scaled where it stands
            return _const(self.model, self.sg, value * c, "edgekit/scaled_constant")
        return self.scaled(t, c, depth - 1)

    def _emit(self, op, code: int, inputs: list[int], like: int) -> int:
        """A copy of ``op`` on ``inputs`` (options kept) writing a new tensor shaped like ``like``."""
        import copy

        from edgekit.builders.graph.ops import temp as _temp

        new = copy.deepcopy(op)
        new.inputs = inputs
        new.outputs = [_temp(self.model, self.sg, like, "scaled")]
        self.ops.append(new)
        return int(new.outputs[0])


def drop_dead_ops(sg) -> int:
    """Remove operators whose outputs nothing reads (not an op, not a graph output); returns how many."""
    outputs = set(edit.valid_indices(sg.outputs))
    dropped = 0
    while True:
        read = outputs | {t for op in sg.operators for t in edit.valid_indices(op.inputs)}
        kept = [op for op in sg.operators if any(t in read for t in edit.valid_indices(op.outputs))]
        if len(kept) == len(sg.operators):
            return dropped
        dropped += len(sg.operators) - len(kept)
        sg.operators = kept
