"""SSD-style raw outputs: box regressors ``[1, N, num_coords]`` and class scores ``[1, N, C]`` with N anchors.

By default the rows are 4 values decoded with the TF Object Detection API's
``FasterRcnnBoxCoder`` convention (``ty, tx, th, tw`` against anchors ``cy, cx, h, w``
normalised to [0, 1], divided by the ``box_coder_scales`` y, x, h, w, default 10, 10, 5, 5,
sizes through ``exp``). The ``ssd_decode`` option takes MediaPipe's
``TensorsToDetectionsCalculator`` options instead (:mod:`edgekit.detect.ssd_decode`): x/y
order, linear sizes, a box plus keypoints per row (BlazeFace ``[1, 896, 16]``, the palm
detector ``[1, 2016, 18]``), sigmoid scores with clipping. Anchors come from the ``anchors``
option (an ``[N, 4]`` list or a ``.npy`` path) or are generated from the ``ssd_anchors``
options (:mod:`edgekit.detect.anchors`).

Two outputs of ``[1, N, 4]`` + ``[1, N, C]`` are also what a model with *decoded* boxes gives
(:mod:`edgekit.detect.decoded`): SSD is chosen only when anchors are configured.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgekit.detect.anchors import anchors_for
from edgekit.detect.config import Candidates, DetectConfig
from edgekit.detect.scores import Quant, best_class, real
from edgekit.detect.ssd_decode import decode, tf_od, valid
from edgekit.errors import ModelError
from edgekit.heads.tensors import softmax


def roles(shapes: list[tuple[int, ...]], num_classes: int | None, coords: int = 4) -> tuple[int, int] | None:
    """``(boxes, scores)`` output indices of two outputs ``[1, N, coords]`` + ``[1, N, C]``, or None.

    C is nc, or nc + 1 with a background column, when the class count is known.
    """
    if len(shapes) != 2 or not all(len(s) == 3 and s[0] == 1 for s in shapes):
        return None
    if shapes[0][1] != shapes[1][1]:
        return None
    boxes = [i for i, s in enumerate(shapes) if s[2] == coords]
    if not boxes:
        return None
    b = boxes[0]
    s = 1 - b
    width = shapes[s][2]
    if num_classes and width not in (num_classes, num_classes + 1):
        return None
    return b, s


def config_roles(shapes: list[tuple[int, ...]], config: DetectConfig) -> tuple[int, int] | None:
    """:func:`roles` with the row width and class count of ``config`` (``ssd_decode``'s when given)."""
    d = config.ssd_decode
    if d is None:
        return roles(shapes, config.num_classes)
    return roles(shapes, config.num_classes or d.num_classes, d.num_coords)


def fits(shapes: list[tuple[int, ...]], config: DetectConfig) -> bool:
    """Two outputs ``[1, N, num_coords]`` and ``[1, N, C]``, and anchors configured (``anchors`` or ``ssd_anchors``)."""
    configured = config.anchors is not None or bool(config.ssd_anchors)
    return configured and config_roles(shapes, config) is not None


def check_counts(shapes: list[tuple[int, ...]], config: DetectConfig) -> None:
    """Raise ModelError when the model's box count is not the anchors' or ``ssd_decode.num_boxes``."""
    roles_found = config_roles(shapes, config)
    n = shapes[roles_found[0]][1] if roles_found else -1
    if n <= 0:
        return
    anchors_for(config, n)
    d = config.ssd_decode
    if d is not None and d.num_boxes is not None and d.num_boxes != n:
        raise ModelError(f"the model has {n} boxes, ssd_decode.num_boxes says {d.num_boxes}",
                         "check that the decode options are this model's")


def pick(outputs: list[np.ndarray], config: DetectConfig, quant: list[Quant]):
    """``(boxes raw [N, num_coords], its quant, scores raw [N, C], its quant)`` of the two outputs."""
    coords = config.ssd_decode.num_coords if config.ssd_decode else 4
    b, s = config.outputs or config_roles([np.asarray(o).shape for o in outputs], config) or (0, 1)
    box, score = np.asarray(outputs[b]), np.asarray(outputs[s])
    box = box.reshape(-1, coords)
    q = [quant[i] if i < len(quant) else None for i in (b, s)]
    return box, q[0], score.reshape(box.shape[0], -1), q[1]


def class_candidates(scores: np.ndarray, quant: Quant, config: DetectConfig) -> tuple[np.ndarray, ...]:
    """``(box indices, scores, classes)`` of ``[N, C]`` raw scores: the background column
    (``background_class``, or column 0 when there are nc + 1 columns, as the TF Object
    Detection API puts "no object" first) left out, activated, cut by the threshold."""
    background = config.background_class
    if background is None and config.num_classes and scores.shape[1] == config.num_classes + 1:
        background = 0
    if config.score_activation == "softmax":  # over every column, background included, then dropped
        scores, quant = softmax(real(scores, quant)), None
        config = replace(config, score_activation="none")
    if background is not None and background < scores.shape[1]:
        # the remaining columns are the labels in order (labels.txt has no background line)
        if background == 0:
            scores = scores[:, 1:]  # a view: no copy of the whole tensor
        elif background == scores.shape[1] - 1:
            scores = scores[:, :-1]
        else:
            scores = np.delete(scores, background, axis=1)
    idx, top, classes = best_class(scores, quant, config, axis=1, how=config.score_activation)
    return idx, top, classes


def decode_boxes(rel: np.ndarray, anchors: np.ndarray, scales: tuple[float, float, float, float]) -> np.ndarray:
    """``[M, 4]`` ``ty, tx, th, tw`` against ``[M, 4]`` anchors ``cy, cx, h, w`` -> normalised
    ``ymin, xmin, ymax, xmax`` (the TF Object Detection API decode, ``box_coder_scales`` y, x, h, w)."""
    return decode(rel, anchors, tf_od(scales))[0]


def candidates(outputs: list[np.ndarray], config: DetectConfig, quant: list[Quant]) -> Candidates:
    """Scores (activated, background column dropped) cut by threshold, then boxes (and keypoints) decoded."""
    box, qb, score, qs = pick(outputs, config, quant)
    anchors = anchors_for(config, box.shape[0])
    idx, top, classes = class_candidates(score, qs, config)
    yx, points = decode(real(box[idx], qb), anchors[idx], config.ssd_decode or tf_od(config.box_coder_scales))
    ok = valid(yx)
    w, h = config.input_size
    boxes = np.stack([yx[:, 1] * w, yx[:, 0] * h, yx[:, 3] * w, yx[:, 2] * h], axis=1).astype(np.float32)
    if points is not None:
        points = (points * np.float32([w, h]))[ok].astype(np.float32)
    return Candidates(boxes[ok], top[ok], classes[ok], keypoints=points)
