"""Normalise a YOLOv8-style output's pixel boxes inside a float TFLite graph, before quantising.

An Ultralytics YOLOv8/v11 ONNX export ends in one ``[1, 4 + nc, N]`` tensor: ``cx, cy, w, h`` in
input pixels (0 to 160 and beyond) concatenated with ``nc`` sigmoid scores in [0, 1]. Per-tensor
int8 gives that tensor one scale, about 0.7 here: every score becomes 0 or 0.7 and the int8
model's mAP is 0.000 while its output cosine is 0.998 (the boxes carry the cosine). Dividing the
box rows by the input size in the graph, as Ultralytics' own Edge TPU export does, puts boxes and
scores in one [0, 1] range: 1/255 steps for the scores, 0.6 px for the boxes.

The rewritten model's boxes are normalised: the build records the rewrite in the model's manifest
entry (``rewrites``) and says so to the detect head (``task_options.box_units = "normalized"``), so
run, bench and serve do not depend on ``box_units=auto``'s range rule (:mod:`edgekit.detect.yolo`).
"""

from __future__ import annotations

import numpy as np

from edgekit.builders.graph import edit

LOGISTIC, MUL = 14, 18  # tflite::BuiltinOperator
NORMALISED_LIMIT = 1.5  # edgekit.detect.yolo's box_units=auto bound (kept equal: a test checks it)
BOXES = 4
MOVES = {22, 39, 43, 70}  # RESHAPE, TRANSPOSE, SQUEEZE, EXPAND_DIMS


def yolo_output(model) -> tuple[int, int, int] | None:
    """``(concatenation op index, axis, nc)`` when the main subgraph's only output is a rank-3
    CONCATENATION of 4 box rows and ``nc`` sigmoid score rows (``[1, 4+nc, N]`` or ``[1, N, 4+nc]``)."""
    sg = model.subgraphs[0]
    outs = edit.valid_indices(sg.outputs)
    if len(outs) != 1 or len(sg.inputs) != 1 or len(sg.tensors[int(sg.inputs[0])].shape) != 4:
        return None
    producers = {t: (i, op) for i, op in enumerate(sg.operators) for t in edit.valid_indices(op.outputs)}
    if outs[0] not in producers:
        return None
    index, cat = producers[outs[0]]
    shape = [int(d) for d in sg.tensors[outs[0]].shape]
    if edit.opcode_of(model, cat.opcodeIndex) != 2 or len(cat.inputs) != 2 or len(shape) != 3:
        return None
    axis = int(cat.builtinOptions.axis) % 3
    box, score = (sg.tensors[int(t)] for t in cat.inputs)
    nc = shape[axis] - BOXES
    if axis == 0 or int(box.shape[axis]) != BOXES or nc < 1 or int(score.shape[axis]) != nc \
            or not _sigmoid_fed(model, producers, int(cat.inputs[1])):
        return None
    return index, axis, nc


def _sigmoid_fed(model, producers: dict, tensor: int, depth: int = 8) -> bool:
    """Whether ``tensor`` is a LOGISTIC's output, through ops that only move values (a converter
    may reshape or transpose the scores after the sigmoid)."""
    op = producers.get(tensor, (None, None))[1]
    if op is None or depth == 0:
        return False
    code = edit.opcode_of(model, op.opcodeIndex)
    if code == LOGISTIC:
        return True
    if code == 2:  # CONCATENATION: every input
        return all(_sigmoid_fed(model, producers, int(t), depth - 1) for t in op.inputs)
    return code in MOVES and _sigmoid_fed(model, producers, int(op.inputs[0]), depth - 1)


def input_size(model) -> tuple[int, int]:
    """The main subgraph's NHWC input ``(width, height)``."""
    sg = model.subgraphs[0]
    _, h, w, _ = (int(d) for d in sg.tensors[int(sg.inputs[0])].shape)
    return w, h


def pixel_boxes(outputs: list[list[np.ndarray]], axis: int) -> bool:
    """Whether the original float outputs (per image, its one output) hold pixel boxes beside
    [0, 1] scores: some box coordinate past :data:`NORMALISED_LIMIT`, every score within [0, 1]."""
    rows = [np.moveaxis(np.asarray(o[0])[0], axis - 1, 0) for o in outputs]
    return bool(rows) and max(float(np.abs(r[:BOXES]).max()) for r in rows) > NORMALISED_LIMIT \
        and all(float(r[BOXES:].min()) >= 0 and float(r[BOXES:].max()) <= 1 for r in rows)


def undo(shape: tuple[int, ...], axis: int, size: tuple[int, int]) -> np.ndarray:
    """What the normalised output is multiplied by to give the original's pixels (for the check)."""
    w, h = size
    factor = np.ones(shape[axis], np.float32)
    factor[:BOXES] = [w, h, w, h]
    return factor.reshape([shape[axis] if i == axis else 1 for i in range(len(shape))])


def normalise_boxes(model) -> tuple[int, int] | None:
    """Divide the YOLO output's box rows by the input size (one MUL before the concatenation),
    in place; returns ``(axis, nc)``, or None when the graph has no such output."""
    found = yolo_output(model)
    if found is None:
        return None
    index, axis, nc = found
    sg = model.subgraphs[0]
    cat = sg.operators[index]
    from edgekit.builders.graph.scale import Scaler, drop_dead_ops

    w, h = input_size(model)
    shape = [BOXES if i == axis and w != h else 1 for i in range(3)]
    scale = np.array([1 / w, 1 / h, 1 / w, 1 / h] if w != h else [1 / w], np.float32).reshape(shape)
    scaler = Scaler(model, axis)  # the scale goes up the box decode (builders/graph/scale.py)
    cat.inputs = [scaler.scaled(int(cat.inputs[0]), scale), int(cat.inputs[1])]
    sg.operators[index:index] = scaler.ops
    drop_dead_ops(sg)
    return axis, nc


ADD, SUB, MAXIMUM, MINIMUM = 0, 41, 55, 57  # tflite::BuiltinOperator


def _corners(model, sg, box: int) -> tuple[object, object, int, int] | None:
    """``(add, sub, x1y1, x2y2)`` when ``box`` is ``CONCATENATION((x1y1 + x2y2) * 0.5, x2y2 - x1y1)``:
    a decode from corners to centre and size (YOLOv8/v11's dist2bbox)."""
    producers = {t: op for op in sg.operators for t in edit.valid_indices(op.outputs)}

    def code(op) -> int | None:
        return edit.opcode_of(model, op.opcodeIndex) if op is not None else None

    cat = producers.get(box)
    if code(cat) != 2 or len(cat.inputs) != 2:
        return None
    half, sub = producers.get(int(cat.inputs[0])), producers.get(int(cat.inputs[1]))
    if code(half) != MUL or code(sub) != SUB:
        return None
    add = next((producers.get(int(t)) for t in half.inputs if code(producers.get(int(t))) == ADD), None)
    if add is None or {int(t) for t in add.inputs} != {int(t) for t in sub.inputs}:
        return None
    x2y2, x1y1 = (int(t) for t in sub.inputs)
    return add, sub, x1y1, x2y2


def clamp_corners(model, index: int) -> bool:
    """Clamp a normalised YOLO decode's corners to the input ([0, 1]) before it computes centre and
    size (MAXIMUM, MINIMUM: ops the Edge TPU maps); ``index``: the output concatenation.

    The detect head clips every box to the image part the model saw, so a clamped box ends where
    the unclamped one did once clipped; but the unclamped boxes of an undertrained or confused
    head reach several input widths (3.5 here), and the int8 output's one scale pays for that
    range: 0.014 steps for the scores instead of 0.004. Only NMS between boxes that leave the
    input can differ. Returns whether the decode was found."""
    from edgekit.builders.graph.ops import op as _op
    from edgekit.builders.graph.ops import scalar as _scalar
    from edgekit.builders.graph.ops import temp as _temp

    sg = model.subgraphs[0]
    found = _corners(model, sg, int(sg.operators[index].inputs[0]))
    if found is None:
        return False
    add, sub, x1y1, x2y2 = found
    new, ops = {}, []
    for t in (x1y1, x2y2):
        low, high = _temp(model, sg, t, "clamp_low"), _temp(model, sg, t, "clamped")
        ops += [_op(model, sg, MAXIMUM, [t, _scalar(model, sg, 0.0)], low),
                _op(model, sg, MINIMUM, [low, _scalar(model, sg, 1.0)], high)]
        new[t] = high
    add.inputs = [new.get(int(t), int(t)) for t in add.inputs]
    sub.inputs = [new.get(int(t), int(t)) for t in sub.inputs]
    first = min(sg.operators.index(add), sg.operators.index(sub))
    sg.operators[first:first] = ops
    return True


def expected(shape: tuple[int, ...], axis: int, size: tuple[int, int], clamped: bool):
    """The original float output as the rewritten graph gives it: boxes normalised and, with
    ``clamped``, their corners clipped to the input (for the rewrites' check)."""

    def reshape(ref: np.ndarray) -> np.ndarray:
        # the original's layout may be the graph's transposed ([1, N, 4+nc] for [1, 4+nc, N])
        flip = np.ndim(ref) == 3 and ref.shape[axis] != shape[axis] and ref.shape[3 - axis] == shape[axis]
        out = np.array(np.swapaxes(ref, 1, 2) if flip else ref, np.float64) / undo(shape, axis, size)
        if clamped:
            rows = np.moveaxis(out, axis, 0)  # a view: written through
            c, half = rows[0:2].copy(), rows[2:4] / 2
            lo, hi = np.clip(c - half, 0, 1), np.clip(c + half, 0, 1)
            rows[0:2], rows[2:4] = (lo + hi) / 2, hi - lo
        return np.swapaxes(out, 1, 2) if flip else out

    return reshape

