"""Where a float TFLite graph clamps values (MINIMUM/MAXIMUM against a constant), and which
tensors' int8 ranges are those clamps' ranges.

edgekit clamps in the graph before int8 on purpose: an SSD detector's score logits to +-16 and
its regressors to twice the decode scale (builders/int8/recipe.py), a YOLO decode's corners to
the input (builders/graph/yolo.py). TensorFlow's quantiser gives MINIMUM and MAXIMUM the same
scale on input and output, and so does every op that only moves values (RESHAPE,
CONCATENATION, ...: :data:`SAME_SCALE`): the clamp's range travels up the chain to the op
that computed the values (BlazeFace: the classifier CONV_2D -> RESHAPE -> CONCATENATION ->
MINIMUM -> MAXIMUM, all at one scale spanning [-16, 3]). Compared with the unclamped float
values, every tensor of that chain shows the clamp's own cut as an error (RMSE/scale 304 on
BlazeFace's classifier, 1834 on the pose detector's); compared with the float values clipped
as the clamp clips them, it shows what int8 lost (:func:`clamped_ranges` says where, the
quantisation report and recovery's layer ranking compare that way).
"""

from __future__ import annotations

import math

import numpy as np

from edgekit.builders.graph import edit

MAXIMUM, MINIMUM = 55, 57  # tflite::BuiltinOperator
SAME_SCALE = frozenset({
    2,    # CONCATENATION
    5,    # DEPTH_TO_SPACE
    17,   # MAX_POOL_2D
    22,   # RESHAPE
    26,   # SPACE_TO_DEPTH
    34,   # PAD
    36,   # GATHER
    39,   # TRANSPOSE
    43,   # SQUEEZE
    45,   # STRIDED_SLICE
    49,   # SPLIT
    60,   # PADV2
    65,   # SLICE
    69,   # TILE
    70,   # EXPAND_DIMS
    83,   # PACK
    88,   # UNPACK
    97,   # RESIZE_NEAREST_NEIGHBOR
    102,  # SPLIT_V
    130,  # BROADCAST_TO
})
"""Ops whose int8 output keeps its input's scale in TensorFlow's quantiser (they move or pick
values, never compute new ones), so a range given to the output is the input's too."""


def clamped_ranges(blob: bytes) -> dict[str, tuple[float, float]]:
    """Per tensor name, the ``(low, high)`` of the clamp whose int8 range the tensor takes: the
    input of each chain of MINIMUM/MAXIMUM against constants, the chain's inner tensors, and
    every tensor above them through :data:`SAME_SCALE` ops whose every consumer is in the chain.
    A clamp's own output is not in it (its values are clamped already)."""
    model = edit.read(blob)
    found: dict[str, tuple[float, float]] = {}
    for sg in model.subgraphs:
        graph = _Graph(model, sg)
        ranges: dict[int, tuple[float, float]] = {}
        for t in graph.consumers:
            if t not in ranges and (chain := graph.clamp_from(t)) is not None:
                ranges.update(dict.fromkeys(chain[1], chain[0]))
        graph.spread_up(ranges)
        for t, bounds in ranges.items():
            if sg.tensors[t].name:
                found[sg.tensors[t].name.decode("utf-8", "replace")] = bounds
    return found


class _Graph:
    """One subgraph's producers and consumers, by tensor index."""

    def __init__(self, model, sg):
        self.model, self.sg = model, sg
        self.consumers: dict[int, list] = {}
        self.producer: dict[int, object] = {}
        for op in sg.operators:
            for t in edit.valid_indices(op.inputs):
                self.consumers.setdefault(t, []).append(op)
            for t in edit.valid_indices(op.outputs):
                self.producer[t] = op

    def code(self, op) -> int:
        return edit.opcode_of(self.model, op.opcodeIndex)

    def constant(self, t: int) -> float | None:
        """The value of a float32 constant of one value (a clamp's bound), else None."""
        tensor = self.sg.tensors[t]
        data = edit.constant_data(self.model, tensor)
        if data is None or tensor.type != edit.FLOAT32 or data.size != 4:
            return None
        value = float(data.view(np.float32)[0])
        return value if math.isfinite(value) else None

    def bound(self, op, t: int) -> tuple[int, float] | None:
        """``(code, constant)`` when ``op`` is a MINIMUM or MAXIMUM of ``t`` and a scalar constant."""
        code = self.code(op)
        others = [i for i in edit.valid_indices(op.inputs) if i != t]
        if code not in (MINIMUM, MAXIMUM) or len(others) != 1:
            return None
        value = self.constant(others[0])
        return None if value is None else (code, value)

    def clamp_from(self, t: int) -> tuple[tuple[float, float], list[int]] | None:
        """The range a chain of clamps starting at ``t`` (its one consumer a MINIMUM or MAXIMUM
        against a constant, and so on) leaves, and the chain's tensors but its last (``t`` and
        those between the clamps); None when ``t`` is not clamped right after."""
        low, high, chain = -math.inf, math.inf, []
        while len(self.consumers.get(t, [])) == 1:
            op = self.consumers[t][0]
            step = self.bound(op, t)
            if step is None:
                break
            code, value = step
            low, high = (max(low, value), high) if code == MAXIMUM else (low, min(high, value))
            chain.append(t)
            t = int(op.outputs[0])
        return ((low, high), chain) if chain else None

    def spread_up(self, ranges: dict[int, tuple[float, float]]) -> None:
        """Give each input of a :data:`SAME_SCALE` op whose outputs all have a range, and whose
        every consumer is such an op, the hull of those ranges (until nothing changes)."""
        changed = True
        while changed:
            changed = False
            for op in self.sg.operators:
                outs = edit.valid_indices(op.outputs)
                if self.code(op) not in SAME_SCALE or not outs or not all(o in ranges for o in outs):
                    continue
                for t in edit.valid_indices(op.inputs):
                    if t in ranges or edit.constant_data(self.model, self.sg.tensors[t]) is not None:
                        continue  # a constant (a RESHAPE's shape) has no range to take
                    hull = self._hull(t, ranges)
                    if hull is not None:
                        ranges[t], changed = hull, True

    def _hull(self, t: int, ranges: dict[int, tuple[float, float]]) -> tuple[float, float] | None:
        """The widest range over the outputs of ``t``'s consumers, when every consumer is a
        :data:`SAME_SCALE` op with ranged outputs (else None: another consumer sets its scale)."""
        bounds = []
        for op in self.consumers.get(t, []):
            outs = edit.valid_indices(op.outputs)
            if self.code(op) not in SAME_SCALE or not all(o in ranges for o in outs):
                return None
            bounds += [ranges[o] for o in outs]
        if not bounds:
            return None
        return min(b[0] for b in bounds), max(b[1] for b in bounds)
