"""Draw a result on a frame: boxes with labels for a detector, a banner for a classifier.

:func:`draw` is pure: it returns a new BGR image and never touches the frame it was given
(the pipeline may still hold it). Sizes follow the frame, so the text stays readable on
Vector's 184x96 face as on a 1080p recording: line width and font scale grow with the
shorter side. Each class keeps one colour across frames (a fixed palette indexed by the class
index), so a video does not flicker between colours.

OpenCV is imported on first use (:func:`edgekit.quiet.import_cv2`): a device install
without it can run models, and only drawing asks for it, with an install hint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.detect.boxes import Detections
from edgekit.quiet import import_cv2
from edgekit.results import Classification

# Ultralytics' 20-colour palette (BGR): distinct hues that stay readable under white text
_PALETTE_HEX = ("FF3838", "FF9D97", "FF701F", "FFB21D", "CFD231", "48F90A", "92CC17", "3DDB86", "1A9334", "00D4BB",
                "2C99A8", "00C2FF", "344593", "6473FF", "0018EC", "8438FF", "520085", "CB38FF", "FF95C8", "FF37C7")
PALETTE: tuple[tuple[int, int, int], ...] = tuple(
    (int(h[4:6], 16), int(h[2:4], 16), int(h[0:2], 16)) for h in _PALETTE_HEX
)
_FONT = 0  # cv2.FONT_HERSHEY_SIMPLEX, without importing cv2 here


def colour_for(index: int) -> tuple[int, int, int]:
    """The BGR colour of a class index (the same on every frame)."""
    return PALETTE[int(index) % len(PALETTE)]


def draw(frame: np.ndarray, result: Any) -> np.ndarray:
    """A copy of ``frame`` (uint8 gray, BGR or BGRA) as BGR with ``result`` drawn on it.

    :class:`~edgekit.detect.boxes.Detections`: a box per object with ``label score`` on a
    filled tab in the class colour, its keypoints (if any) as small dots;
    :class:`~edgekit.results.Classification`: the top label and score as a banner across the
    top; any other result: the frame unchanged.

    Raises:
        BackendUnavailable: OpenCV is not installed.
        ValueError: ``frame`` is not a uint8 image.
    """
    cv2 = import_cv2("drawing results on frames")
    image = _as_bgr(cv2, frame)
    if isinstance(result, Detections):
        _draw_detections(cv2, image, result)
    elif isinstance(result, Classification) and result.predictions:
        top = result.top
        _banner(cv2, image, f"{top.label} {top.score:.2f}", colour_for(top.index))
    return image


def _as_bgr(cv2: Any, frame: np.ndarray) -> np.ndarray:
    a = np.asarray(frame)
    if a.dtype != np.uint8 or a.size == 0 or not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (1, 3, 4))):
        raise ValueError(f"can only draw on uint8 gray/BGR/BGRA images, not {a.dtype} {a.shape}")
    if a.ndim == 2 or a.shape[2] == 1:
        return cv2.cvtColor(a.reshape(a.shape[:2]), cv2.COLOR_GRAY2BGR)
    if a.shape[2] == 4:
        return cv2.cvtColor(a, cv2.COLOR_BGRA2BGR)
    return a.copy()


def _sizes(image: np.ndarray) -> tuple[int, float, int]:
    """Line width, font scale and text thickness for an image, from the shorter side (a 2 px box at 360p),
    never below 1 px and a 0.3 font (8 px tall letters, the smallest that stays legible)."""
    side = min(image.shape[:2])
    return max(1, round(side / 240)), max(0.3, side / 900), max(1, round(side / 600))


def _draw_detections(cv2: Any, image: np.ndarray, detections: Detections) -> None:
    h, w = image.shape[:2]
    # boxes in another image's pixels (a decoder not given the frame's shape): scale them over
    sx, sy = (w / detections.size[0], h / detections.size[1]) if detections.size else (1.0, 1.0)
    line, font_scale, thick = _sizes(image)
    # worst first, so the best box and its label end up on top where boxes overlap
    for det in reversed(detections.detections):
        x1, y1, x2, y2 = det.box
        p1 = (int(round(x1 * sx)), int(round(y1 * sy)))
        p2 = (int(round(x2 * sx)) - 1, int(round(y2 * sy)) - 1)
        colour = colour_for(det.index)
        cv2.rectangle(image, p1, p2, colour, line, cv2.LINE_8)  # axis-aligned: crisp, exact colour
        _dots(cv2, image, [(x * sx, y * sy) for x, y in det.keypoints], colour, line)
        _tab(cv2, image, f"{det.label} {det.score:.2f}", p1, colour, font_scale, thick)


def _dots(cv2: Any, image: np.ndarray, points: list[tuple[float, float]], colour: tuple[int, int, int],
          line: int) -> None:
    """Keypoints as small filled dots in the class colour, ringed in the ink colour so they stay
    visible on a face or on the box line itself."""
    radius = line + 1
    for x, y in points:
        centre = (int(round(x)), int(round(y)))
        cv2.circle(image, centre, radius + 1, _ink(colour), -1, cv2.LINE_AA)
        cv2.circle(image, centre, radius, colour, -1, cv2.LINE_AA)


def _tab(cv2: Any, image: np.ndarray, text: str, corner: tuple[int, int], colour: tuple[int, int, int],
         font_scale: float, thick: int) -> None:
    """``text`` on a filled tab above the box corner (inside the box when there is no room above)."""
    (tw, th), base = cv2.getTextSize(text, _FONT, font_scale, thick)
    pad = max(1, th // 4)
    x = min(max(corner[0], 0), max(image.shape[1] - tw - 2 * pad, 0))
    top = corner[1] - th - base - 2 * pad
    if top < 0:
        top = max(corner[1], 0)
    cv2.rectangle(image, (x, top), (x + tw + 2 * pad, top + th + base + 2 * pad), colour, -1)
    cv2.putText(image, text, (x + pad, top + pad + th), _FONT, font_scale, _ink(colour), thick, cv2.LINE_AA)


def _banner(cv2: Any, image: np.ndarray, text: str, colour: tuple[int, int, int]) -> None:
    """``text`` on a dark strip across the top, a bar in the class colour at its left."""
    _, font_scale, thick = _sizes(image)
    font_scale *= 1.3
    (tw, th), base = cv2.getTextSize(text, _FONT, font_scale, thick)
    height = th + base + 2 * max(2, th // 3)
    strip = image[:height]
    strip[:] = (strip.astype(np.uint16) * 2 // 5).astype(np.uint8)  # darken, keep the scene visible
    bar = max(3, height // 4)
    cv2.rectangle(image, (0, 0), (bar - 1, height - 1), colour, -1)
    cv2.putText(image, text, (bar + max(2, th // 3), height - base - max(2, th // 3)), _FONT, font_scale,
                (255, 255, 255), thick, cv2.LINE_AA)


def _ink(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black text on light tabs, white on dark ones (Rec. 601 luma of the BGR colour)."""
    b, g, r = colour
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)
