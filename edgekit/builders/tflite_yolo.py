"""Normalise a YOLOv8-style output's pixel boxes inside a float TFLite graph, before quantising.

An Ultralytics YOLOv8/v11 ONNX export ends in one ``[1, 4 + nc, N]`` tensor: ``cx, cy, w, h`` in
input pixels (0 to 160 and beyond) concatenated with ``nc`` sigmoid scores in [0, 1]. Per-tensor
int8 gives that tensor one scale, about 0.7 here: every score becomes 0 or 0.7 and the int8
model's mAP is 0.000 while its output cosine is 0.998 (the boxes carry the cosine). Dividing the
box rows by the input size in the graph, as Ultralytics' own Edge TPU export does, puts boxes and
scores in one [0, 1] range: 1/255 steps for the scores, 0.6 px for the boxes.

The rewritten model's boxes are normalised: edgekit's YOLO decoder takes them as such
(``box_units=auto``: every coordinate <= 1.5, :mod:`edgekit.detect.yolo`), and the build records
the rewrite in the model's manifest entry (``rewrites``).
"""

from __future__ import annotations

import numpy as np

from edgekit.builders import tflite_edit

LOGISTIC, MUL = 14, 18  # tflite::BuiltinOperator
NORMALISED_LIMIT = 1.5  # edgekit.detect.yolo's box_units=auto bound (kept equal: a test checks it)
BOXES = 4
MOVES = {22, 39, 43, 70}  # RESHAPE, TRANSPOSE, SQUEEZE, EXPAND_DIMS


def yolo_output(model) -> tuple[int, int, int] | None:
    """``(concatenation op index, axis, nc)`` when the main subgraph's only output is a rank-3
    CONCATENATION of 4 box rows and ``nc`` sigmoid score rows (``[1, 4+nc, N]`` or ``[1, N, 4+nc]``)."""
    sg = model.subgraphs[0]
    outs = tflite_edit._indices(sg.outputs)
    if len(outs) != 1 or len(sg.inputs) != 1 or len(sg.tensors[int(sg.inputs[0])].shape) != 4:
        return None
    producers = {t: (i, op) for i, op in enumerate(sg.operators) for t in tflite_edit._indices(op.outputs)}
    if outs[0] not in producers:
        return None
    index, cat = producers[outs[0]]
    shape = [int(d) for d in sg.tensors[outs[0]].shape]
    if tflite_edit._opcode(model, cat.opcodeIndex) != 2 or len(cat.inputs) != 2 or len(shape) != 3:
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
    code = tflite_edit._opcode(model, op.opcodeIndex)
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
    from edgekit.builders.tflite_scale import Scaler, drop_dead_ops

    w, h = input_size(model)
    shape = [BOXES if i == axis and w != h else 1 for i in range(3)]
    scale = np.array([1 / w, 1 / h, 1 / w, 1 / h] if w != h else [1 / w], np.float32).reshape(shape)
    scaler = Scaler(model, axis)  # the scale goes up the box decode (builders/tflite_scale.py)
    cat.inputs = [scaler.scaled(int(cat.inputs[0]), scale), int(cat.inputs[1])]
    sg.operators[index:index] = scaler.ops
    drop_dead_ops(sg)
    return axis, nc
