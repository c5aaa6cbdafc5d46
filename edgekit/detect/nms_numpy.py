"""Greedy non-maximum suppression in numpy that decides every box as OpenCV's ``cv2.dnn.NMSBoxes``
does, for installs without OpenCV (a Pi's or a Coral board's ``[litert]``).

OpenCV's rules (``dnn/src/nms.inl.hpp``, ``core/types.hpp``; checked against opencv-python-headless
5.0 by tests/detect/test_nms_numpy.py), all kept here:

- only scores > 0 take part (the score threshold :mod:`edgekit.detect.nms` passes), visited best
  score first, equal scores in index order (a stable sort);
- a box is kept when its overlap with every box kept before it is <= the IoU threshold, so an IoU
  exactly at the threshold keeps it;
- the overlap is taken on ``x, y, width, height`` in double precision: per axis
  ``min(x + w) - max(x)``, no intersection unless both are > 0, ``IoU = inter / (area_a + area_b -
  inter)``; two boxes whose areas sum to <= DBL_EPSILON (two points) count as the same box; then
  ``1.f - float(1 - IoU)`` in single precision is compared with the threshold as a float.

The work goes in chunks of the visit order: a chunk's boxes are first tested against every box
kept so far (one matrix), the few left against each other (a second, small matrix), and a Python
loop walks only the rows that suppress something. Chunks stop once ``limit`` boxes are kept (greedy
NMS decides a box from the better boxes only, so the first ``limit`` kept are final), and grow
when most boxes are being suppressed (a crowded scene), so both a scattered scene (most kept) and
a crowded one cost a handful of numpy calls per chunk rather than one per kept box. Each pair
costs about ten numpy element operations: the float rounding at the end is folded into one double
(:func:`ratio_limit`) that ``inter / union`` is compared with.
"""

from __future__ import annotations

import functools
import threading
from typing import NamedTuple

import numpy as np

DBL_EPSILON = float(np.finfo(np.float64).eps)
FIRST_CHUNK = 64
"""Boxes in the first chunk; later chunks are sized from the share kept so far."""
MATRIX = 12_000
"""Box pairs in one matrix against the kept boxes, at most (when more than ``FIRST_CHUNK`` boxes)."""
WITHIN = 96
"""Most boxes compared with each other in one chunk (a matrix of their pairs, then a Python loop)."""


_SCRATCH = threading.local()
_UPPER = np.triu(np.ones((WITHIN, WITHIN), bool), 1)


def _keeps(q: float, threshold: np.float32) -> bool:
    """OpenCV's decision for ``q = inter / union`` (double): ``1.f - float(1.0 - q) <= threshold``."""
    with np.errstate(over="ignore"):
        return bool(np.float32(1.0) - np.float32(1.0 - np.float64(q)) <= threshold)


@functools.lru_cache(maxsize=64)
def ratio_limit(iou_threshold: float) -> float:
    """The largest double ``q = inter / union`` OpenCV keeps a box at for this threshold.

    Every step of OpenCV's decision (``1.0 - q`` in double, rounded to float, ``1.f -`` that,
    ``<=`` the threshold as a float) is monotone in ``q``, so comparing ``q`` with this one number
    decides as it does, rounding included, with 3 numpy calls per pair fewer. Found by bisection
    over the bit patterns of the non-negative doubles (ordered as integers).
    """
    threshold = np.float32(iou_threshold)
    lo, hi = 0, 0x7FF0000000000000  # 0.0 and +inf
    if not _keeps(0.0, threshold):
        return -np.inf  # a negative threshold (OpenCV refuses one): even disjoint boxes suppress
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _keeps(np.int64(mid).view(np.float64), threshold):
            lo = mid
        else:
            hi = mid
    return float(np.int64(lo).view(np.float64))


class Rule(NamedTuple):
    """How one call decides: :func:`ratio_limit` of its threshold; whether any box is a point (an
    area <= DBL_EPSILON), and whether a point then suppresses a later point (overlap 1 > threshold)."""

    limit: float
    points: bool
    point_suppresses: bool


def _suppressed(a: np.ndarray, b: np.ndarray, a_cls: np.ndarray | None, b_cls: np.ndarray | None,
                rule: Rule) -> np.ndarray:
    """``[m, k]`` bool: box ``a[:, i]`` suppresses box ``b[:, j]`` (same class, OpenCV's overlap > threshold).

    ``a``, ``b``: ``[5, n]`` float64 rows ``x, y, x + w, y + h, w * h``, the sums and the area as
    OpenCV's ``Rect2d`` computes them. Without points every union is > 0, so no ratio is NaN.
    """
    m, k = a.shape[1], b.shape[1]
    wh, lo = _scratch(2 * m * k)[:, : 2 * m * k].reshape(2, 2, m, k)
    np.minimum(a[2:4, :, None], b[2:4, None, :], out=wh)  # x and y at once: right and bottom edges
    wh -= np.maximum(a[:2, :, None], b[:2, None, :], out=lo)
    np.maximum(wh, 0.0, out=wh)  # Rect2d's &=: no intersection unless both sides > 0
    inter = np.multiply(wh[0], wh[1], out=lo[0])
    union = np.add(a[4][:, None], b[4][None, :], out=lo[1])
    if not rule.points:
        union -= inter
        return _same_class(np.divide(inter, union, out=inter) > rule.limit, a_cls, b_cls)
    same = union <= DBL_EPSILON  # jaccardDistance: two boxes of no area are one box
    union -= inter
    out = ~(np.divide(inter, union, out=inter) <= rule.limit)  # NaN (0 / 0) suppresses, as in OpenCV
    out[same] = rule.point_suppresses
    return _same_class(out, a_cls, b_cls)


def _scratch(size: int) -> np.ndarray:
    """``[2, >= size]`` float64 work space, kept per thread: the overlap matrices reuse it, because
    freshly allocated ones over ~128 KiB cost page faults every call (glibc returns them to the OS)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.shape[1] < size:
        buf = _SCRATCH.buf = np.empty((2, max(size, 2 * MATRIX)))
    return buf


def _same_class(out: np.ndarray, a_cls: np.ndarray | None, b_cls: np.ndarray | None) -> np.ndarray:
    """``out`` where the two boxes' classes match (class-aware), else False."""
    if a_cls is not None:
        out &= a_cls[:, None] == b_cls[None, :]
    return out


def _greedy_within(boxes: np.ndarray, cls: np.ndarray | None, rule: Rule) -> np.ndarray:
    """Positions kept by greedy NMS among ``boxes`` alone (``[5, m]``, in visit order)."""
    m = boxes.shape[1]
    if m < 2:
        return np.arange(m)
    hits = _suppressed(boxes, boxes, cls, cls, rule)
    hits &= _UPPER[:m, :m]  # only a better box suppresses a worse one
    removed = np.zeros(m, bool)
    # rows that suppress nothing cannot change the outcome; the rest in visit order, the removed skipped
    for i in np.flatnonzero(hits.any(axis=1)).tolist():
        if not removed[i]:
            removed |= hits[i]
    return np.flatnonzero(~removed)


def _next_chunk(seen: int, kept: int, limit: int, left: int) -> int:
    """The next chunk's size: enough boxes to reach ``limit`` at the share kept so far (+25 %),
    within :data:`MATRIX` pairs against the kept boxes."""
    want = 4 * seen if kept == 0 else int((limit - kept) * seen / kept * 1.25)
    return min(left, max(FIRST_CHUNK, min(want, MATRIX // max(kept, 1))))


def greedy_nms(xywh: np.ndarray, scores: np.ndarray, classes: np.ndarray | None, iou_threshold: float,
               limit: int) -> np.ndarray:
    """Indices of the first ``limit`` boxes greedy NMS keeps, in the order it keeps them.

    Args:
        xywh: ``[M, 4]`` float64 ``x, y, width, height`` (finite; widths and heights >= 0).
        scores: ``[M]`` float32; only scores > 0 take part, as in OpenCV with score threshold 0.
        classes: ``[M]`` integer class ids (boxes suppress only their own class), or None: agnostic.
        iou_threshold: a box overlapping a kept one by more than this is suppressed.
        limit: stop after this many boxes are kept.

    Returns:
        ``[K]`` int64 indices into the inputs, best score first (equal scores: lower index first).
    """
    live = np.flatnonzero(scores > 0)
    order = live[np.argsort(-scores[live], kind="stable")]
    picked = np.asarray(xywh, np.float64)[order]
    boxes = np.empty((5, len(order)))
    boxes[:4] = picked.T
    boxes[2:4] += boxes[:2]  # x + w, y + h as Rect2d adds them
    np.multiply(picked[:, 2], picked[:, 3], out=boxes[4])
    cls = None if classes is None else np.asarray(classes)[order]
    rule = Rule(ratio_limit(float(iou_threshold)), bool((boxes[4] <= DBL_EPSILON).any()),
                not np.float32(1.0) <= np.float32(iou_threshold))
    # overflow, inf - inf, 0 / 0 only with absurd boxes or points, decided as OpenCV decides them
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        positions = _walk(boxes, cls, rule, limit)
    return order[positions].astype(np.int64)


def _walk(boxes: np.ndarray, cls: np.ndarray | None, rule: Rule, limit: int) -> np.ndarray:
    """Positions (in visit order) of the first ``limit`` boxes kept, chunk by chunk (module docstring)."""
    n, start, size = boxes.shape[1], 0, min(boxes.shape[1], FIRST_CHUNK)
    chosen: list[np.ndarray] = [np.zeros(0, np.int64)]
    kept, kept_cls = boxes[:, :0], None if cls is None else cls[:0]
    while start < n and kept.shape[1] < limit:
        stop = start + size
        chunk, chunk_cls = boxes[:, start:stop], None if cls is None else cls[start:stop]
        alive = np.arange(stop - start)
        if kept.shape[1]:
            alive = np.flatnonzero(~_suppressed(kept, chunk, kept_cls, chunk_cls, rule).any(axis=0))
        if len(alive) > WITHIN:  # the rest of the chunk waits for the next one (kept boxes first)
            stop, alive = start + alive[WITHIN], alive[:WITHIN]
        alive = alive[_greedy_within(chunk[:, alive], None if cls is None else chunk_cls[alive], rule)]
        chosen.append(start + alive)
        if stop >= n:
            break
        kept = np.concatenate([kept, chunk[:, alive]], axis=1)
        if cls is not None:
            kept_cls = np.concatenate([kept_cls, chunk_cls[alive]])
        start = stop
        size = _next_chunk(start, kept.shape[1], limit, n - start)
    return np.concatenate(chosen)[:limit]
