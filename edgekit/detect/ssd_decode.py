"""How an SSD's regressors become boxes and keypoints: the ``ssd_decode`` options.

The option names and their meaning are MediaPipe's ``TensorsToDetectionsCalculatorOptions``
(mediapipe/calculators/tensor/tensors_to_detections_calculator.proto and ``DecodeBoxes`` in
the .cc), so a user copies the numbers from a model's MediaPipe graph. Per anchor ``(cy, cx,
h, w)`` and row of ``num_coords`` values, the box is the 4 values at ``box_coord_offset``:
``y, x, h, w`` (``box_format`` YXHW, the default), ``x, y, w, h`` (XYWH, or
``reverse_output_order: true``), or the distances to the left, top, right, bottom (XYXY);
``cx = x / x_scale * anchor_w + anchor_cx`` (y alike); ``w = w / w_scale * anchor_w`` (h
alike), or ``exp(w / w_scale) * anchor_w`` with ``apply_exponential_on_box_size``. Keypoint
``k`` is the 2 values at ``keypoint_coord_offset + k * num_values_per_keypoint`` (x then y,
except YXHW: y then x), decoded like the centre. ``sigmoid_score`` applies the logistic to the
scores after clipping them to +-``score_clipping_thresh``; ``min_score_thresh`` is the score
threshold. A box of negative or NaN width or height is dropped, as MediaPipe drops it.

Inside ``ssd_decode`` an option left out means what it means in MediaPipe (no exponential,
YXHW order, no keypoints), except the four scales, whose MediaPipe default 0 divides by zero:
they must be given. Without ``ssd_decode`` the TF Object Detection API convention applies (YXHW,
``exp`` sizes, ``box_coder_scales`` y, x, h, w = 10, 10, 5, 5): :func:`tf_od`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.detect.anchors import sub_option
from edgekit.errors import UsageError
from edgekit.util.optionspec import Option, by_name, did_you_mean

BOX_FORMATS = ("UNSPECIFIED", "YXHW", "XYWH", "XYXY")
"""MediaPipe's ``BoxFormat`` names (UNSPECIFIED: YXHW, or XYWH with ``reverse_output_order``)."""

MAX_COORDS = 4096
"""The widest regressor row accepted (palm: 18; a 133-keypoint whole-body model: 270)."""

_OPTIONS = (
    Option("num_classes", "int", ge=1, le=100_000),
    Option("num_boxes", "int", ge=1, le=1_000_000),
    Option("num_coords", "int", ge=4, le=MAX_COORDS),
    Option("box_coord_offset", "int", ge=0, le=MAX_COORDS),
    Option("keypoint_coord_offset", "int", ge=0, le=MAX_COORDS),
    Option("num_keypoints", "int", ge=0, le=MAX_COORDS // 2),
    Option("num_values_per_keypoint", "int", ge=2, le=16),
    Option("x_scale", "float", ge=1e-6, le=1e6),
    Option("y_scale", "float", ge=1e-6, le=1e6),
    Option("w_scale", "float", ge=1e-6, le=1e6),
    Option("h_scale", "float", ge=1e-6, le=1e6),
    Option("apply_exponential_on_box_size", "bool"),
    Option("reverse_output_order", "bool"),
    Option("box_format", "str", choices=BOX_FORMATS),
    Option("sigmoid_score", "bool"),
    Option("score_clipping_thresh", "float", ge=1e-6, le=1e6),
    Option("min_score_thresh", "float", ge=0.0, le=1.0),
)
"""The ``ssd_decode`` options (MediaPipe ``TensorsToDetectionsCalculatorOptions`` names) and their ranges;
the defaults are MediaPipe's (:class:`SsdDecode`)."""
_BY_NAME = by_name(_OPTIONS)
_DOCS = "see the SSD decode options in docs/detection.md (MediaPipe TensorsToDetectionsCalculator names)"

_REQUIRED = ("x_scale", "y_scale", "w_scale", "h_scale")


@dataclass(frozen=True)
class SsdDecode:
    """Checked decode options; ``box_format`` is resolved (YXHW, XYWH or XYXY). ``sigmoid_score``,
    ``score_clipping_thresh``, ``min_score_thresh``, ``num_classes`` and ``num_boxes`` are None
    when not given (then the detect head's own options decide, and the model's shapes are not checked)."""

    x_scale: float
    y_scale: float
    w_scale: float
    h_scale: float
    num_coords: int = 4
    box_coord_offset: int = 0
    keypoint_coord_offset: int = 0
    num_keypoints: int = 0
    num_values_per_keypoint: int = 2
    box_format: str = "YXHW"
    apply_exponential_on_box_size: bool = False
    sigmoid_score: bool | None = None
    score_clipping_thresh: float | None = None
    min_score_thresh: float | None = None
    num_classes: int | None = None
    num_boxes: int | None = None


def tf_od(scales: tuple[float, float, float, float]) -> SsdDecode:
    """The TF Object Detection API decode (``FasterRcnnBoxCoder``) with ``box_coder_scales`` y, x, h, w."""
    ys, xs, hs, ws = scales
    return SsdDecode(x_scale=xs, y_scale=ys, w_scale=ws, h_scale=hs, apply_exponential_on_box_size=True)


def check_ssd_decode(options: Any) -> SsdDecode:
    """The ``ssd_decode`` table checked (untrusted: it may come from a bundle) into an :class:`SsdDecode`.

    Raises UsageError (one line, with a fix) for a table that is not one, an unknown option, a
    value out of range, a missing scale, or box and keypoint columns that do not fit ``num_coords``.
    """
    if not isinstance(options, dict):
        raise UsageError(f"detect ssd_decode must be a table of decode options, not {options!r}",
                         'e.g. -T \'ssd_decode={"num_coords": 16, "x_scale": 128, ...}\'')
    unknown = sorted(set(options) - set(_BY_NAME))
    if unknown:
        raise UsageError(f"detect ssd_decode has no option {unknown[0]!r}", did_you_mean(unknown[0], _BY_NAME))
    missing = [name for name in _REQUIRED if name not in options]
    if missing:
        raise UsageError(f"detect ssd_decode needs {', '.join(missing)}",
                         "copy x_scale, y_scale, w_scale and h_scale from the model's MediaPipe graph "
                         "(BlazeFace: 128; TF Object Detection API models: x 10, y 10, w 5, h 5)")
    o = {name: sub_option("ssd_decode", _BY_NAME[name], value, _DOCS) for name, value in options.items()}
    fmt = o.pop("box_format", "UNSPECIFIED")
    reverse = o.pop("reverse_output_order", False)
    if fmt == "UNSPECIFIED":  # MediaPipe's GetBoxFormat: box_format, else reverse_output_order picks XYWH
        fmt = "XYWH" if reverse else "YXHW"
    o.setdefault("num_coords", 4 + o.get("num_keypoints", 0) * o.get("num_values_per_keypoint", 2))
    decode = SsdDecode(box_format=fmt, **o)
    _check_columns(decode)
    if decode.score_clipping_thresh is not None and decode.sigmoid_score is not True:
        raise UsageError("detect ssd_decode.score_clipping_thresh applies only with sigmoid_score true",
                         "add sigmoid_score: true, or leave score_clipping_thresh out")
    return decode


def _check_columns(d: SsdDecode) -> None:
    """The box and the keypoints must lie inside a row of ``num_coords`` values and not overlap."""
    if d.box_coord_offset + 4 > d.num_coords:
        raise UsageError(f"detect ssd_decode: the box at box_coord_offset {d.box_coord_offset} runs past "
                         f"num_coords {d.num_coords}", "num_coords is the width of the model's box output")
    if not d.num_keypoints:
        return
    end = d.keypoint_coord_offset + d.num_keypoints * d.num_values_per_keypoint
    if end > d.num_coords:
        raise UsageError(f"detect ssd_decode: {d.num_keypoints} keypoints of {d.num_values_per_keypoint} values "
                         f"from keypoint_coord_offset {d.keypoint_coord_offset} need {end} coordinates, "
                         f"num_coords is {d.num_coords}", "check num_keypoints, keypoint_coord_offset and num_coords")
    if d.keypoint_coord_offset < d.box_coord_offset + 4 and end > d.box_coord_offset:
        raise UsageError(f"detect ssd_decode: the keypoints (from keypoint_coord_offset {d.keypoint_coord_offset}) "
                         f"overlap the box (box_coord_offset {d.box_coord_offset})",
                         "MediaPipe models put the keypoints after the box: keypoint_coord_offset 4")


def decode(rows: np.ndarray, anchors: np.ndarray, d: SsdDecode) -> tuple[np.ndarray, np.ndarray | None]:
    """Decode ``[M, num_coords]`` real regressor rows against ``[M, 4]`` anchors ``(cy, cx, h, w)``.

    Returns ``(boxes, keypoints)``: boxes ``[M, 4]`` ``ymin, xmin, ymax, xmax`` and keypoints
    ``[M, num_keypoints, 2]`` ``x, y`` (None without keypoints), both normalised to the input.
    """
    rows = np.asarray(rows, np.float32)
    a = np.asarray(anchors, np.float32)
    b = rows[:, d.box_coord_offset: d.box_coord_offset + 4]
    if d.box_format == "YXHW":
        y, x, h, w = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    elif d.box_format == "XYWH":
        x, y, w, h = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    else:  # XYXY: distances from the anchor to the left, top, right and bottom edges (MediaPipe's formula)
        x, y = (b[:, 2] - b[:, 0]) / 2, (b[:, 3] - b[:, 1]) / 2
        w, h = b[:, 2] + b[:, 0], b[:, 3] + b[:, 1]
    cx = x / d.x_scale * a[:, 3] + a[:, 1]
    cy = y / d.y_scale * a[:, 2] + a[:, 0]
    if d.apply_exponential_on_box_size:
        h, w = np.exp(h / d.h_scale) * a[:, 2], np.exp(w / d.w_scale) * a[:, 3]
    else:
        h, w = h / d.h_scale * a[:, 2], w / d.w_scale * a[:, 3]
    boxes = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)
    if not d.num_keypoints:
        return boxes, None
    start, step = d.keypoint_coord_offset, d.num_values_per_keypoint
    kp = rows[:, start: start + d.num_keypoints * step].reshape(len(rows), d.num_keypoints, step)[:, :, :2]
    if d.box_format == "YXHW":
        kp = kp[:, :, ::-1]  # y, x as stored -> x, y
    points = np.empty_like(kp)
    points[:, :, 0] = kp[:, :, 0] / d.x_scale * a[:, 3:4] + a[:, 1:2]
    points[:, :, 1] = kp[:, :, 1] / d.y_scale * a[:, 2:3] + a[:, 0:1]
    return boxes, points


def valid(boxes: np.ndarray) -> np.ndarray:
    """Rows of ``[M, 4]`` ``ymin, xmin, ymax, xmax`` with a width and height >= 0 (NaN: not),
    as MediaPipe keeps them (linear sizes can come out negative)."""
    return (boxes[:, 2] - boxes[:, 0] >= 0) & (boxes[:, 3] - boxes[:, 1] >= 0)
