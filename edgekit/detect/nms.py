"""Non-maximum suppression with OpenCV's ``cv2.dnn.NMSBoxes`` / ``NMSBoxesBatched``.

Class-aware by default (a person box never suppresses an overlapping dog box), class-agnostic
on request. Candidates are cut by score first and capped at ``max_candidates`` (highest
scores kept), as Ultralytics caps at ``max_nms``.

OpenCV's ``top_k`` cuts the *candidates* to the ``top_k`` best before suppressing (checked:
200 copies of one box and one distant box, ``top_k=5``, keep only the first box), so it
cannot stand for ``max_detections``; and greedy NMS costs candidates x kept IoU tests (10 ms
for 1,500 scattered boxes over 10 classes here). What keeps it cheap and exact: greedy NMS
decides each box from the higher-scoring boxes only, so NMS over the best T candidates keeps
exactly the first boxes the full run keeps. Run it on the best ``2 x max_detections``; when
that keeps ``max_detections`` boxes they are the answer, else grow T until every candidate
took part (or, when the kept share says a third of the candidates or more will be needed, run
them all at once).

Without OpenCV (a ``[litert]`` device install) the same decisions come from numpy
(:mod:`edgekit.detect.nms_numpy`, identical kept boxes); ``backend`` picks one explicitly.
Boxes with a coordinate that is not finite never take part (a NaN box cannot be drawn, and
OpenCV would let it suppress every later box of its class).
"""

from __future__ import annotations

import numpy as np

from edgekit.detect.nms_numpy import DBL_EPSILON, greedy_nms
from edgekit.errors import UsageError
from edgekit.util.quiet import import_cv2, optional_cv2

FIRST_ROUND = 2
"""The first round's candidates, as a multiple of ``max_detections``."""

CALL_NS, PAIR_NS = 12_000, 4
"""Rough costs measured here (OpenCV 5.0, one core): one NMS call from Python, and one box pair
compared (n boxes cost ~n^2 pairs). Class-aware NMS runs once per class when that is cheaper
than one batched call over every box (boxes of different classes never suppress each other,
yet NMSBoxesBatched compares them all)."""


BACKENDS = ("auto", "opencv", "numpy")
"""``auto``: OpenCV when it is installed, else numpy (the same boxes kept either way)."""


def _opencv(backend: str):
    """OpenCV for ``backend``, or None where numpy does the work."""
    if backend == "auto":
        return optional_cv2()
    if backend == "opencv":
        return import_cv2("NMS with backend 'opencv'")
    if backend == "numpy":
        return None
    raise UsageError(f"unknown NMS backend {backend!r}", f"choose one of {', '.join(BACKENDS)}")


def _suppress(cv2, xywh: np.ndarray, scores: np.ndarray, classes: np.ndarray | None, iou: float) -> np.ndarray:
    """Indices kept by one greedy NMS over these boxes (class-aware when ``classes`` is given)."""
    # OpenCV filters by score itself (keeping scores > threshold, and NMSBoxes asserts threshold >= 0);
    # every candidate is already above the head's score threshold >= 0, so 0 lets them all through.
    if classes is None:
        return np.asarray(cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), 0.0, iou), np.int64).reshape(-1)
    counts = np.bincount(classes)
    present = np.flatnonzero(counts)
    per_class = len(present) * CALL_NS + PAIR_NS * int((counts.astype(np.int64) ** 2).sum())
    if len(present) == 1:
        return np.asarray(cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), 0.0, iou), np.int64).reshape(-1)
    # NMSBoxesBatched shifts each class by class x (largest coordinate + 1): that keeps classes
    # apart only when no coordinate is negative (checked: a class-1 box at -25 was suppressed by a
    # class-0 box at -20; boxes past the input's top or left edge are common before clipping), and
    # when no two boxes are points (OpenCV counts two boxes of no area as one box, wherever they are)
    if (per_class >= CALL_NS + PAIR_NS * len(scores) ** 2 and xywh[:, :2].min() >= 0
            and np.count_nonzero(xywh[:, 2] * xywh[:, 3] <= DBL_EPSILON) < 2):
        found = cv2.dnn.NMSBoxesBatched(xywh.tolist(), scores.tolist(), classes.tolist(), 0.0, iou)
        return np.asarray(found, np.int64).reshape(-1)
    by_class = np.argsort(classes, kind="stable")
    kept = []
    for members in np.split(by_class, np.cumsum(counts[present])[:-1]):
        found = cv2.dnn.NMSBoxes(xywh[members].tolist(), scores[members].tolist(), 0.0, iou)
        kept.append(members[np.asarray(found, np.int64).reshape(-1)])
    return np.concatenate(kept)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou_threshold: float,
        max_detections: int, class_agnostic: bool = False, backend: str = "auto") -> np.ndarray:
    """Indices of the boxes kept (at most ``max_detections``), best score first.

    ``boxes``: ``[M, 4]`` xyxy; ``scores``: ``[M]`` (already above the score threshold);
    ``classes``: ``[M]`` integer class ids; ``backend``: one of :data:`BACKENDS`.
    """
    cv2 = _opencv(backend)
    if len(scores) == 0:
        return np.zeros(0, np.int64)
    # OpenCV's binding converts every box to a Rect2d one by one (~0.3 us each, most of NMS's time
    # when few boxes are kept): from a list of Python floats is cheapest (float32 arrays: 3x slower)
    b = np.asarray(boxes, np.float64)
    xywh = np.concatenate([b[:, :2], np.maximum(b[:, 2:] - b[:, :2], 0.0)], axis=1)
    s = np.asarray(scores, np.float32)
    if not np.isfinite(xywh).all():  # a score of 0 takes no part in either backend
        bad = ~np.isfinite(xywh).all(axis=1)
        s, xywh = np.where(bad, np.float32(0), s), np.where(bad[:, None], 0.0, xywh)
    c = None if class_agnostic else np.asarray(classes, np.int32)
    if cv2 is None:
        return greedy_nms(xywh, s, c, iou_threshold, max_detections)
    return _opencv_rounds(cv2, xywh, s, c, iou_threshold, max_detections)


def _opencv_rounds(cv2, xywh: np.ndarray, s: np.ndarray, c: np.ndarray | None, iou_threshold: float,
                   max_detections: int) -> np.ndarray:
    """OpenCV's NMS over growing shares of the best candidates (module docstring), best first."""
    order = np.argsort(-s, kind="stable")  # the order greedy NMS visits the boxes in
    take = max(FIRST_ROUND * max_detections, 64)
    while True:
        subset = order[:take]
        kept = subset[_suppress(cv2, xywh[subset], s[subset], None if c is None else c[subset], iou_threshold)]
        if len(kept) >= max_detections or take >= len(order):
            break
        # boxes kept per box tried so far, extrapolated: crowded scenes (most boxes suppressed) go
        # straight to the full run instead of paying for many growing rounds
        guess = int(take * max_detections / max(len(kept), 1) * 1.25)  # none kept (all scores 0): go big
        take = len(order) if guess >= len(order) // 3 else max(guess, 2 * take)
    kept = kept[np.lexsort((kept, -s[kept]))]  # best first, ties by index whichever path ran
    return kept[:max_detections]
