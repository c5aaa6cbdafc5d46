"""Non-maximum suppression with OpenCV's ``cv2.dnn.NMSBoxes`` / ``NMSBoxesBatched``.

Class-aware by default (a person box never suppresses an overlapping dog box), class-agnostic
on request. Candidates are cut by score in numpy first and capped at ``max_candidates``
(highest scores kept), as Ultralytics caps at ``max_nms``: NMS time grows with the square of
the boxes that survive the threshold, and a flood of low-confidence boxes must not stall a
camera loop.
"""

from __future__ import annotations

import numpy as np

from edgekit.errors import BackendUnavailable


def _cv2():
    try:
        import cv2
    except ImportError as exc:  # the device install may leave OpenCV out
        raise BackendUnavailable("the detect task needs OpenCV for non-maximum suppression",
                                 "pip install opencv-python-headless (or edgekit-vision[opencv])") from exc
    return cv2


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou_threshold: float,
        max_detections: int, class_agnostic: bool = False) -> np.ndarray:
    """Indices of the boxes kept, best score first.

    ``boxes``: ``[M, 4]`` xyxy; ``scores``: ``[M]`` (already above the score threshold);
    ``classes``: ``[M]`` integer class ids.
    """
    if len(scores) == 0:
        return np.zeros(0, np.int64)
    cv2 = _cv2()
    b = np.asarray(boxes, np.float32)
    xywh = np.concatenate([b[:, :2], np.maximum(b[:, 2:] - b[:, :2], 0.0)], axis=1)
    s = np.asarray(scores, np.float32)
    # OpenCV filters by score itself; the caller has, so pass a threshold every score meets.
    floor = float(s.min()) - 1.0
    if class_agnostic:
        kept = cv2.dnn.NMSBoxes(xywh, s, floor, float(iou_threshold), top_k=int(max_detections))
    else:
        kept = cv2.dnn.NMSBoxesBatched(xywh, s, np.asarray(classes, np.int32), floor, float(iou_threshold),
                                       1.0, int(max_detections))
    kept = np.asarray(kept, np.int64).reshape(-1)
    return kept[np.argsort(-s[kept], kind="stable")]


def top_candidates(scores: np.ndarray, threshold: float, limit: int) -> np.ndarray:
    """Indices of the scores above ``threshold``, at most ``limit`` of them (the highest)."""
    idx = np.flatnonzero(scores > threshold)
    if len(idx) > limit:
        idx = idx[np.argpartition(-scores[idx], limit - 1)[:limit]]
    return idx
