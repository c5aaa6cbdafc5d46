"""The ``detect`` head's options (one list, read by the head table and the head) and what a layout reads.

:data:`OPTIONS` is the one spec of the detect options: :data:`edgekit.heads.table.TASK_HEADS` lists it
and :func:`edgekit.detect.head.detect_config` checks a bundle's or a caller's options against it;
:class:`DetectConfig` takes its defaults from it. The layout modules (``yolo``, ``ssd``, ``decoded``,
``postprocess``) import :class:`DetectConfig` and :class:`Candidates` from here, not from the head
whose layout table names them, so that table is no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.detect.ssd_decode import SsdDecode
from edgekit.util.optionspec import Option, defaults

OPTIONS = (
    Option("layout", "str", "auto", "the output layout (auto: the first of edgekit.detect.head.LAYOUTS that fits)"),
    Option("score_threshold", "float", 0.25, "boxes scoring less are dropped", ge=0.0, le=1.0),
    Option("iou_threshold", "float", 0.45, "NMS overlap above which the weaker box goes", ge=0.0, le=1.0),
    Option("max_detections", "int", 100, "boxes kept after NMS", ge=1, le=10000),
    Option("max_candidates", "int", 3000, "boxes going into NMS", ge=1, le=1_000_000),
    Option("class_agnostic", "bool", False, "NMS across classes"),
    Option("box_format", "str", "auto", "the layout's usual, cxcywh or xyxy", choices=("auto", "cxcywh", "xyxy")),
    Option("box_units", "str", "auto", "auto (normalised when every coordinate <= 1.5), pixels or normalized",
           choices=("auto", "pixels", "normalized")),
    Option("anchors", "any", None, "SSD: [[cy, cx, h, w], ...] or an absolute .npy path (edgekit.detect.anchors)"),
    Option("ssd_anchors", "table", None, "SSD: anchor generation options (MediaPipe SsdAnchorsCalculator names)"),
    Option("box_coder_scales", "floats", (10.0, 10.0, 5.0, 5.0), "SSD: y, x, h, w scales", ge=1e-6, le=1e6),
    Option("background_class", "int", None, "a score column that is \"no object\" (SSD: often 0)", ge=0, le=100000),
    Option("outputs", "ints", None, "runtime output index per layout output", ge=0, le=63),
    Option("score_activation", "str", "auto", "SSD scores: auto (sigmoid unless in [0, 1]), none, sigmoid, softmax",
           choices=("auto", "none", "sigmoid", "softmax")),
    Option("ssd_decode", "table", None, "SSD: MediaPipe-named decode options (edgekit.detect.ssd_decode)"),
    Option("preset", "str", None, "a published detector's options (edgekit.detect.presets: mediapipe_face_short, "
           "mediapipe_face_full, mediapipe_palm, mediapipe_pose); options given win; preprocessing is the model "
           "input's: give it as flags (docs/detection.md)"),
)
"""The ``detect`` head's options: names, types, ranges and defaults, written once."""
_DEFAULT = defaults(OPTIONS)


@dataclass(frozen=True)
class Candidates:
    """Boxes before NMS: ``boxes`` ``[M, 4]`` xyxy in model-input pixels, ``scores`` ``[M]``,
    ``classes`` ``[M]``; ``final`` when the model did NMS itself; ``keypoints`` ``[M, K, 2]``
    x, y in model-input pixels when the model regresses them (SSD ``ssd_decode``), else None."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    final: bool = False
    keypoints: np.ndarray | None = None


@dataclass(frozen=True)
class DetectConfig:
    """What a layout's ``candidates`` needs to know (the head's options, checked)."""

    input_size: tuple[int, int]  # (width, height) of the model input
    num_classes: int | None
    score_threshold: float = _DEFAULT["score_threshold"]
    iou_threshold: float = _DEFAULT["iou_threshold"]
    max_detections: int = _DEFAULT["max_detections"]
    max_candidates: int = _DEFAULT["max_candidates"]
    class_agnostic: bool = _DEFAULT["class_agnostic"]
    box_format: str = _DEFAULT["box_format"]  # auto (the layout's usual), cxcywh, xyxy
    box_units: str = _DEFAULT["box_units"]  # auto (normalised when every coordinate <= 1.5), pixels, normalized
    anchors: np.ndarray | None = None  # SSD: [N, 4] (cy, cx, h, w) normalised (edgekit.detect.anchors)
    ssd_anchors: tuple[tuple[str, Any], ...] = ()  # SSD: anchor generation options, checked (sorted items)
    box_coder_scales: tuple[float, float, float, float] = _DEFAULT["box_coder_scales"]
    background_class: int | None = None  # a score column that is "no object" (SSD: often 0)
    outputs: tuple[int, ...] | None = None  # runtime output index per layout output
    score_activation: str = _DEFAULT["score_activation"]  # SSD: auto (sigmoid unless in [0, 1]), none, sigmoid, softmax
    ssd_decode: SsdDecode | None = None  # SSD: MediaPipe-named decode options (None: TF-OD, box_coder_scales)
    score_clipping_thresh: float | None = None  # sigmoid scores: logits clipped to +- this first (MediaPipe)

