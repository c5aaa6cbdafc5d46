"""Where a second model looks: a detection -> a rotated region of the frame, as MediaPipe builds it.

The option names and the arithmetic are MediaPipe's (checked against mediapipe v0.10.14):
``DetectionsToRectsCalculator`` (mediapipe/calculators/util/detections_to_rects_calculator.cc) takes the
box's centre and size and the rotation ``target - atan2(-(y1 - y0), x1 - x0)`` from keypoint
``rotation_vector_start_keypoint_index`` to ``rotation_vector_end_keypoint_index`` (in pixels, image y
down), and ``RectTransformationCalculator`` (rect_transformation_calculator.cc) shifts the centre along
the rotated axes, squares the region (``square_long``/``square_short``) and scales it. With
``alignment_points`` the centre is the start keypoint and the side twice its distance to the end
keypoint, as ``AlignmentPointsRectsCalculator`` does for the pose detector. Everything here is in frame
pixels, so a non-square frame needs none of MediaPipe's normalised-coordinate corrections.

A positive rotation turns the region clockwise on the screen: the region's own x axis points along
``(cos r, sin r)`` in the frame.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.errors import UsageError
from edgekit.util.optionspec import Option, OptionValueError, by_name, did_you_mean

ROI_OPTIONS = (
    Option("rotation_vector_start_keypoint_index", "int", None, "keypoint the rotation vector starts at",
           ge=0, le=4096),
    Option("rotation_vector_end_keypoint_index", "int", None, "keypoint the rotation vector ends at", ge=0, le=4096),
    Option("rotation_vector_target_angle_degrees", "float", None, "angle the vector should have (degrees)",
           ge=-360.0, le=360.0),
    Option("rotation_vector_target_angle", "float", None, "the same in radians", ge=-7.0, le=7.0),
    Option("rotation_degrees", "float", 0.0, "a further rotation of every region", ge=-360.0, le=360.0),
    Option("scale_x", "float", 1.0, "region width = this x box width", gt=0.0, le=100.0),
    Option("scale_y", "float", 1.0, "region height = this x box height", gt=0.0, le=100.0),
    Option("shift_x", "float", 0.0, "centre moves this x width along the region's x axis", ge=-100.0, le=100.0),
    Option("shift_y", "float", 0.0, "centre moves this x height along the region's y axis", ge=-100.0, le=100.0),
    Option("square_long", "bool", False, "make the region square on its longer side"),
    Option("square_short", "bool", False, "make the region square on its shorter side"),
    Option("alignment_points", "bool", False, "centre at the start keypoint, side 2 x its distance to the end one "
           "(MediaPipe AlignmentPointsRectsCalculator)"),
    Option("max_regions", "int", 4, "second-stage runs per frame at most (best detections first)", ge=1, le=64),
)
"""``--roi`` / ``[[stage]] roi``: MediaPipe's option names, edgekit's ranges."""

_DOCS = "see the region options in docs/pipelines.md (MediaPipe DetectionsToRects/RectTransformation names)"


@dataclass(frozen=True)
class Region:
    """A rotated rectangle in frame pixels: centre, size and rotation (radians, clockwise on screen)."""

    cx: float
    cy: float
    width: float
    height: float
    rotation: float = 0.0

    def to_list(self) -> list[float]:
        """``[cx, cy, width, height, rotation in degrees]``, rounded: what a result records."""
        return [round(self.cx, 2), round(self.cy, 2), round(self.width, 2), round(self.height, 2),
                round(math.degrees(self.rotation), 2)]


@dataclass(frozen=True)
class RoiOptions:
    """The region options checked (see :data:`ROI_OPTIONS`)."""

    start: int | None = None
    end: int | None = None
    target: float = 0.0  # radians
    extra_rotation: float = 0.0  # radians
    scale_x: float = 1.0
    scale_y: float = 1.0
    shift_x: float = 0.0
    shift_y: float = 0.0
    square_long: bool = False
    square_short: bool = False
    alignment_points: bool = False
    max_regions: int = 4

    @property
    def rotates(self) -> bool:
        return self.start is not None and self.end is not None


def parse_roi(value: str | Mapping[str, Any] | None, flag: str = "--roi") -> RoiOptions:
    """``--roi`` JSON text (or a mapping from serve.toml) -> :class:`RoiOptions`; UsageError, one line
    naming ``flag``."""
    if value is None:
        return RoiOptions()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise UsageError(f"{flag} is not JSON: {exc.msg} at character {exc.pos}",
                             "e.g. --roi '{\"scale_x\": 1.5, \"scale_y\": 1.5, \"square_long\": true}'") from None
    if not isinstance(value, Mapping):
        raise UsageError(f"{flag} must be a JSON object of region options, not {value!r}", _DOCS)
    declared = by_name(ROI_OPTIONS)
    unknown = sorted(set(value) - set(declared))
    if unknown:
        raise UsageError(f"{flag} has no option {unknown[0]!r}", did_you_mean(unknown[0], declared))
    got: dict[str, Any] = {o.name: o.default for o in ROI_OPTIONS}
    for key, raw in value.items():
        try:
            got[key] = declared[key].coerce(raw, text=False)
        except OptionValueError as exc:
            raise UsageError(f"{flag} {key} must be {exc.what}, not {raw!r}", _DOCS) from None
    return _checked(got, flag)


def _checked(got: dict[str, Any], flag: str) -> RoiOptions:
    start, end = got["rotation_vector_start_keypoint_index"], got["rotation_vector_end_keypoint_index"]
    if (start is None) != (end is None):
        raise UsageError(f"{flag} needs both rotation_vector_start_keypoint_index and ..._end_keypoint_index",
                         "give both keypoint indices, or neither (no rotation)")
    if got["alignment_points"] and start is None:
        raise UsageError(f"{flag} alignment_points needs the two keypoint indices",
                         "give rotation_vector_start_keypoint_index and rotation_vector_end_keypoint_index")
    if got["square_long"] and got["square_short"]:
        raise UsageError(f"{flag} square_long and square_short cannot both be true", "keep one")
    degrees, radians = got["rotation_vector_target_angle_degrees"], got["rotation_vector_target_angle"]
    if degrees is not None and radians is not None:
        raise UsageError(f"{flag} gives the target angle twice", "keep rotation_vector_target_angle_degrees")
    target = math.radians(degrees) if degrees is not None else (radians or 0.0)
    return RoiOptions(start, end, target, math.radians(got["rotation_degrees"]), got["scale_x"], got["scale_y"],
                      got["shift_x"], got["shift_y"], got["square_long"], got["square_short"],
                      got["alignment_points"], got["max_regions"])


def normalize_radians(angle: float) -> float:
    """``angle`` in [-pi, pi), as MediaPipe's NormalizeRadians."""
    return angle - 2 * math.pi * math.floor((angle + math.pi) / (2 * math.pi))


def _keypoint(keypoints: Sequence[Sequence[float]], index: int) -> tuple[float, float]:
    if index >= len(keypoints):
        raise UsageError(f"the region options name keypoint {index}, but there are {len(keypoints)} keypoints",
                         "use keypoint indices the detector has (its ssd_decode num_keypoints), or no rotation")
    return float(keypoints[index][0]), float(keypoints[index][1])


def region_for(box: Sequence[float], keypoints: Sequence[Sequence[float]], roi: RoiOptions) -> Region:
    """The region of one detection: ``box`` ``(x1, y1, x2, y2)`` and ``keypoints`` ``((x, y), ...)`` in
    frame pixels -> :class:`Region` in frame pixels, after ``roi``'s rotation, shift, square and scale."""
    x1, y1, x2, y2 = (float(v) for v in box)
    cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
    rotation = 0.0
    if roi.rotates:
        (sx, sy), (ex, ey) = _keypoint(keypoints, roi.start), _keypoint(keypoints, roi.end)
        rotation = normalize_radians(roi.target - math.atan2(-(ey - sy), ex - sx))
        if roi.alignment_points:
            cx, cy = sx, sy
            w = h = 2 * math.hypot(ex - sx, ey - sy)
    return transform(Region(cx, cy, w, h, rotation), roi)


def transform(region: Region, roi: RoiOptions) -> Region:
    """RectTransformationCalculator in pixels: rotate further, shift along the region's axes, square, scale."""
    rotation = normalize_radians(region.rotation + roi.extra_rotation)
    w, h = region.width, region.height
    cos, sin = math.cos(rotation), math.sin(rotation)
    dx, dy = w * roi.shift_x, h * roi.shift_y
    cx = region.cx + dx * cos - dy * sin
    cy = region.cy + dx * sin + dy * cos
    if roi.square_long:
        w = h = max(w, h)
    elif roi.square_short:
        w = h = min(w, h)
    return Region(cx, cy, w * roi.scale_x, h * roi.scale_y, rotation)
