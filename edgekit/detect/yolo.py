"""YOLO-style single-output layouts: anchor-free ``[1, 4+nc, N]`` / ``[1, N, 4+nc]`` (YOLOv8/v11
exports) and ``[1, N, 5+nc]`` with objectness (YOLOv5).

Boxes are ``cx, cy, w, h`` (``box_format=xyxy`` for exports that decode corners), in input
pixels or normalised to [0, 1] (TFLite exports normalise: see :mod:`edgekit.detect.head`,
``box_units``). Everything is vectorised over the N anchors and works on the raw output (no
transpose, no full dequantisation: :mod:`edgekit.detect.scores`); only the boxes above the
score threshold are dequantised and turned into boxes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.detect.config import Candidates, DetectConfig
from edgekit.detect.scores import Quant, above, best_class, real

NORMALISED_LIMIT = 1.5
"""``box_units=auto``: boxes whose coordinates are all <= this are taken as normalised to [0, 1]."""
QUANTISED_NORMALISED_RANGE = 8.0
"""``box_units=auto`` on a quantised output: when its whole integer range spans at most this, its
boxes are normalised (pixel boxes of any input of 32 px or more need a wider range; edgekit's int8
build normalises a YOLO output's pixel boxes in the graph: builders/graph/yolo.py). Decided once
per output, not per frame from the boxes that pass, which a badly placed box could tip."""


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


def fits(shapes: list[tuple[int, ...]], config: DetectConfig) -> bool:
    """One output with a dimension of ``4 + nc`` (any ``>= 5`` when the classes are unknown)."""
    return _fits(shapes, config.num_classes, 4)


def fits_objectness(shapes: list[tuple[int, ...]], config: DetectConfig) -> bool:
    """One output with a dimension of ``5 + nc``; the class count must be known (labels), since
    ``[N, 85]`` is also an anchor-free model with 81 classes."""
    return bool(config.num_classes) and _fits(shapes, config.num_classes, 5)


def channels_first(output: np.ndarray, width: int | None) -> np.ndarray:
    """The output as ``[K, N]`` (a view, never a copy): K box+score values per anchor.

    ``width`` is K when known (from the labels); otherwise the smaller dimension is K, since
    exports have far more anchors than values per anchor.
    """
    arr = np.asarray(output)
    arr = arr[0] if arr.ndim == 3 else arr
    a, b = arr.shape
    if width is not None:
        return arr.T if b == width and a != width else arr  # square: channels first, as Ultralytics exports
    return arr if a <= b else arr.T


def quantised_units(config: DetectConfig, quant: Quant, dtype: np.dtype) -> str | None:
    """``box_units=auto`` of a quantised output, from its range (:data:`QUANTISED_NORMALISED_RANGE`);
    None for a float output or units the configuration gives."""
    if config.box_units != "auto" or not quant or not quant[0] or not np.issubdtype(dtype, np.integer):
        return None
    info = np.iinfo(dtype)
    return "normalized" if quant[0] * (int(info.max) - int(info.min)) <= QUANTISED_NORMALISED_RANGE else "pixels"


def to_xyxy(raw: np.ndarray, config: DetectConfig, fmt: str = "cxcywh", units: str | None = None) -> np.ndarray:
    """``[M, 4]`` boxes in ``fmt`` (input pixels or normalised) -> xyxy input pixels; ``units``
    overrides ``config.box_units`` (:func:`quantised_units`)."""
    boxes = np.asarray(raw, np.float32)
    fmt = fmt if config.box_format == "auto" else config.box_format
    if fmt == "cxcywh":
        half = boxes[:, 2:] / 2
        boxes = np.concatenate([boxes[:, :2] - half, boxes[:, :2] + half], axis=1)
    units = units or config.box_units
    if units == "auto":
        units = "normalized" if boxes.size and float(np.abs(boxes).max()) <= NORMALISED_LIMIT else "pixels"
    if units == "normalized":
        w, h = config.input_size
        boxes = boxes * np.array([w, h, w, h], np.float32)
    return boxes


def _rows(outputs: list[np.ndarray], config: DetectConfig, quant: list[Quant], extra: int) -> tuple[Any, Quant]:
    index = config.outputs[0] if config.outputs else 0
    width = extra + config.num_classes if config.num_classes else None
    return channels_first(outputs[index], width), (quant[index] if index < len(quant) else None)


def candidates(outputs: list[np.ndarray], config: DetectConfig, quant: list[Quant]) -> Candidates:
    """Anchor-free YOLO (v8/v11): per anchor ``cx, cy, w, h`` then one score per class."""
    rows, q = _rows(outputs, config, quant, 4)  # [4 + nc, N]
    idx, scores, classes = best_class(rows[4:], q, config, axis=0, how=config.score_activation)
    boxes = to_xyxy(real(rows[:4, idx], q).T, config, units=quantised_units(config, q, rows.dtype))
    return Candidates(boxes, scores, classes)


def objectness(outputs: list[np.ndarray], config: DetectConfig, quant: list[Quant]) -> Candidates:
    """YOLOv5: per anchor ``cx, cy, w, h, objectness`` then class probabilities; the score is
    objectness x class probability.

    Class probabilities are at most 1, so a box whose objectness is under the threshold cannot
    pass: the cut on objectness (in the raw domain) comes first, the products only for the rest.
    """
    rows, q = _rows(outputs, config, quant, 5)  # [5 + nc, N]
    idx = above(rows[4], q, config.score_threshold)
    products = real(rows[5:, idx], q) * real(rows[4, idx], q)
    classes = products.argmax(axis=0) if len(idx) else np.zeros(0, np.int64)
    scores = products[classes, np.arange(len(idx))] if len(idx) else np.zeros(0, np.float32)
    keep = np.flatnonzero(scores > config.score_threshold)
    if len(keep) > config.max_candidates:
        keep = keep[np.argpartition(-scores[keep], config.max_candidates - 1)[: config.max_candidates]]
    boxes = to_xyxy(real(rows[:4, idx[keep]], q).T, config, units=quantised_units(config, q, rows.dtype))
    return Candidates(boxes, scores[keep].astype(np.float32), classes[keep].astype(np.int64))
