"""Two outputs of already-decoded boxes and class scores: ``[1, N, 4]`` + ``[1, N, C]``.

Many ONNX exports end this way (YOLO-NAS, RT-DETR-style heads, YOLO exports split into boxes
and scores so int8 keeps the scores' resolution): the boxes need no anchors, only their
format and units. ``box_format=auto`` reads them as ``x1, y1, x2, y2`` when every candidate
box has ``x2 >= x1`` and ``y2 >= y1``, else as ``cx, cy, w, h`` (a real centre-size box reads
as a valid corner box only when it sticks out past the top-left corner by half its size);
``box_units=auto`` as normalised when every coordinate is <= 1.5. A bundle should state
both (``box_format``, ``box_units``) rather than rely on the guess.

SSD raw outputs have the same shapes; :data:`edgekit.detect.head.LAYOUTS` tries SSD first,
and SSD fits only when anchors are configured.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgekit.detect.config import Candidates, DetectConfig
from edgekit.detect.scores import Quant, real
from edgekit.detect.ssd import class_candidates, pick, roles
from edgekit.detect.yolo import to_xyxy


def fits(shapes: list[tuple[int, ...]], config: DetectConfig) -> bool:
    """Two outputs ``[1, N, 4]`` (boxes) and ``[1, N, C]`` (C = nc, or nc + 1 with a background column)."""
    return roles(shapes, config.num_classes) is not None


def _format(raw: np.ndarray) -> str:
    if raw.size == 0:
        return "xyxy"
    ordered = (raw[:, 2] >= raw[:, 0]) & (raw[:, 3] >= raw[:, 1])
    return "xyxy" if bool(ordered.all()) else "cxcywh"


def candidates(outputs: list[np.ndarray], config: DetectConfig, quant: list[Quant]) -> Candidates:
    """Scores cut by the threshold first, then only those boxes converted to xyxy input pixels."""
    box, qb, score, qs = pick(outputs, config, quant)
    idx, top, classes = class_candidates(score, qs, config)
    raw = real(box[idx], qb)
    if config.box_format == "auto":
        config = replace(config, box_format=_format(raw))
    return Candidates(to_xyxy(raw, config), top, classes)
