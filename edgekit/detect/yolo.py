"""YOLO-style single-output layouts: anchor-free ``[1, 4+nc, N]`` / ``[1, N, 4+nc]`` (YOLOv8/v11
exports) and ``[1, N, 5+nc]`` with objectness (YOLOv5).

Boxes are ``cx, cy, w, h`` (``box_format=xyxy`` for exports that decode corners), in input
pixels or normalised to [0, 1] (TFLite exports normalise: see :mod:`edgekit.detect.head`,
``box_units``). Everything is vectorised over the N anchors; only those above the score
threshold are turned into boxes.
"""

from __future__ import annotations

import numpy as np

from edgekit.detect.head import Candidates, DetectConfig
from edgekit.detect.nms import top_candidates

NORMALISED_LIMIT = 1.5
"""``box_units=auto``: boxes whose coordinates are all <= this are taken as normalised to [0, 1]."""


def _dims(shapes: list[tuple[int, ...]]) -> tuple[int, int] | None:
    """The two non-batch dimensions of a single 3-D (batch 1) or 2-D output, else None."""
    if len(shapes) != 1:
        return None
    s = shapes[0]
    if len(s) == 3 and s[0] == 1:
        return s[1], s[2]
    if len(s) == 2:
        return s[0], s[1]
    return None


def _fits(shapes: list[tuple[int, ...]], num_classes: int | None, extra: int) -> bool:
    dims = _dims(shapes)
    if dims is None:
        return False
    if num_classes:
        return extra + num_classes in dims
    return min(dims) > extra and max(dims) > min(dims)


def fits(shapes: list[tuple[int, ...]], num_classes: int | None) -> bool:
    """One output with a dimension of ``4 + nc`` (any ``>= 5`` when the classes are unknown)."""
    return _fits(shapes, num_classes, 4)


def fits_objectness(shapes: list[tuple[int, ...]], num_classes: int | None) -> bool:
    """One output with a dimension of ``5 + nc``; the class count must be known (labels), since
    ``[N, 85]`` is also an anchor-free model with 81 classes."""
    return bool(num_classes) and _fits(shapes, num_classes, 5)


def channels_first(output: np.ndarray, width: int | None) -> np.ndarray:
    """The output as ``[K, N]`` (a view where possible): K box+score values per anchor.

    ``width`` is K when known (from the labels); otherwise the smaller dimension is K, since
    exports have far more anchors than values per anchor.
    """
    arr = np.asarray(output)
    arr = arr[0] if arr.ndim == 3 else arr
    a, b = arr.shape
    if width is not None:
        return arr if a == width and b != width else arr.T if b == width else arr
    return arr if a <= b else arr.T


def to_xyxy(raw: np.ndarray, config: DetectConfig, fmt: str = "cxcywh") -> np.ndarray:
    """``[M, 4]`` boxes in ``fmt`` (input pixels or normalised) -> xyxy input pixels."""
    boxes = np.asarray(raw, np.float32)
    fmt = fmt if config.box_format == "auto" else config.box_format
    if fmt == "cxcywh":
        half = boxes[:, 2:] / 2
        boxes = np.concatenate([boxes[:, :2] - half, boxes[:, :2] + half], axis=1)
    units = config.box_units
    if units == "auto":
        units = "normalized" if boxes.size and float(np.abs(boxes).max()) <= NORMALISED_LIMIT else "pixels"
    if units == "normalized":
        w, h = config.input_size
        boxes = boxes * np.array([w, h, w, h], np.float32)
    return boxes


def _decode(output: np.ndarray, config: DetectConfig, extra: int) -> Candidates:
    width = extra + config.num_classes if config.num_classes else None
    rows = channels_first(output, width)  # [K, N]
    class_scores = rows[extra:]
    if extra == 5:
        class_scores = class_scores * rows[4]  # YOLOv5: confidence = objectness x class probability
    classes = class_scores.argmax(axis=0)
    scores = np.take_along_axis(class_scores, classes[None], axis=0)[0]
    keep = top_candidates(scores, config.score_threshold, config.max_candidates)
    boxes = to_xyxy(rows[:4, keep].T, config)
    return Candidates(boxes, scores[keep].astype(np.float32), classes[keep].astype(np.int64))


def candidates(outputs: list[np.ndarray], config: DetectConfig) -> Candidates:
    """Anchor-free YOLO (v8/v11): per anchor ``cx, cy, w, h`` then one score per class."""
    return _decode(outputs[0], config, 4)


def objectness(outputs: list[np.ndarray], config: DetectConfig) -> Candidates:
    """YOLOv5: per anchor ``cx, cy, w, h, objectness`` then class probabilities."""
    return _decode(outputs[0], config, 5)
