"""SSD-style raw outputs: box regressors ``[1, N, 4]`` and class scores ``[1, N, C]`` with N anchors.

Boxes are decoded with the TF Object Detection API's ``FasterRcnnBoxCoder`` convention
(``ty, tx, th, tw`` against anchors ``cy, cx, h, w`` normalised to [0, 1], divided by the
``box_coder_scales`` y, x, h, w, default 10, 10, 5, 5), as MediaPipe's TensorsToDetections
does. Anchors come from the ``anchors`` option (an ``[N, 4]`` list or a ``.npy`` path) or are
generated from the ``ssd_anchors`` options (:mod:`edgekit.detect.anchors`).
"""

from __future__ import annotations

import numpy as np

from edgekit.detect.head import Candidates, DetectConfig
from edgekit.detect.nms import top_candidates


def _roles(shapes: list[tuple[int, ...]], num_classes: int | None) -> tuple[int, int] | None:
    """``(boxes, scores)`` output indices from the shapes, or None."""
    if len(shapes) != 2 or not all(len(s) == 3 and s[0] == 1 for s in shapes):
        return None
    if shapes[0][1] != shapes[1][1]:
        return None
    boxes = [i for i, s in enumerate(shapes) if s[2] == 4]
    if not boxes:
        return None
    b = boxes[0]
    s = 1 - b
    width = shapes[s][2]
    if num_classes and width not in (num_classes, num_classes + 1):
        return None
    return b, s


def fits(shapes: list[tuple[int, ...]], num_classes: int | None) -> bool:
    """Two outputs ``[1, N, 4]`` and ``[1, N, C]`` (C = nc, or nc + 1 with a background column)."""
    return _roles(shapes, num_classes) is not None


def _activate(scores: np.ndarray, how: str) -> np.ndarray:
    if how == "auto":
        how = "none" if scores.size == 0 or (scores.min() >= 0.0 and scores.max() <= 1.0) else "sigmoid"
    if how == "sigmoid":
        return 1.0 / (1.0 + np.exp(-scores))
    if how == "softmax":
        z = np.exp(scores - scores.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)
    return scores


def decode_boxes(rel: np.ndarray, anchors: np.ndarray, scales: tuple[float, float, float, float]) -> np.ndarray:
    """``[M, 4]`` ``ty, tx, th, tw`` against ``[M, 4]`` anchors ``cy, cx, h, w`` -> normalised
    ``ymin, xmin, ymax, xmax``."""
    ys, xs, hs, ws = scales
    cy = rel[:, 0] / ys * anchors[:, 2] + anchors[:, 0]
    cx = rel[:, 1] / xs * anchors[:, 3] + anchors[:, 1]
    h = np.exp(rel[:, 2] / hs) * anchors[:, 2]
    w = np.exp(rel[:, 3] / ws) * anchors[:, 3]
    return np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)


def candidates(outputs: list[np.ndarray], config: DetectConfig) -> Candidates:
    """Scores (activated, background column dropped) cut by threshold, then boxes decoded."""
    from edgekit.detect.anchors import anchors_for

    b, s = config.outputs or _roles([np.asarray(o).shape for o in outputs], config.num_classes) or (0, 1)
    rel = np.asarray(outputs[b], np.float32).reshape(-1, 4)
    scores = _activate(np.asarray(outputs[s], np.float32).reshape(rel.shape[0], -1), config.score_activation)
    background = config.background_class
    if background is None and config.num_classes and scores.shape[1] == config.num_classes + 1:
        background = 0  # the TF Object Detection API puts "no object" first
    if background is not None:
        scores = np.delete(scores, background, axis=1)
    classes = scores.argmax(axis=1)
    best = scores[np.arange(len(classes)), classes]
    keep = top_candidates(best, config.score_threshold, config.max_candidates)
    anchors = anchors_for(config, rel.shape[0])
    yx = decode_boxes(rel[keep], anchors[keep], config.box_coder_scales)
    w, h = config.input_size
    boxes = np.stack([yx[:, 1] * w, yx[:, 0] * h, yx[:, 3] * w, yx[:, 2] * h], axis=1).astype(np.float32)
    return Candidates(boxes, best[keep].astype(np.float32), classes[keep].astype(np.int64))
