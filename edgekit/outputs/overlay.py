"""Draw a result on a frame: boxes with labels for a detector, a banner for a classifier, tinted
masks for a segmenter.

:func:`draw` is pure: it returns a new BGR image and never touches the frame it was given
(the pipeline may still hold it). Sizes follow the frame, so the text stays readable on
Vector's 184x96 face as on a 1080p recording: line width and font scale grow with the
shorter side. Each class keeps one colour across frames (a fixed palette indexed by the class
index), so a video does not flicker between colours.

OpenCV is imported on first use (:func:`edgekit.util.quiet.import_cv2`): a device install
without it can run models, and only drawing asks for it, with an install hint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.detect.boxes import Detections
from edgekit.heads.classify import Classification
from edgekit.heads.segment import Segmentation
from edgekit.util.quiet import import_cv2

# Colour-blind-safe first: Okabe & Ito's 7 colours (black left out: a box outline), then Paul Tol's
# "muted" scheme for classes 8-16 (https://personal.sron.nl/~pault/). Neighbouring indices
# differ in hue and in lightness, so two classes in one frame do not look alike.
_PALETTE_HEX = ("E69F00", "56B4E9", "009E73", "F0E442", "0072B2", "D55E00", "CC79A7",
                "332288", "DDCC77", "117733", "CC6677", "88CCEE", "882255", "44AA99", "999933", "AA4499")
PALETTE: tuple[tuple[int, int, int], ...] = tuple(
    (int(h[4:6], 16), int(h[2:4], 16), int(h[0:2], 16)) for h in _PALETTE_HEX
)
_FONT = 0  # cv2.FONT_HERSHEY_SIMPLEX, without importing cv2 here


def colour_for(index: int) -> tuple[int, int, int]:
    """The BGR colour of a class index (the same on every frame)."""
    return PALETTE[int(index) % len(PALETTE)]


def draw(frame: np.ndarray, result: Any, crop: Any = None) -> np.ndarray:
    """A copy of ``frame`` (uint8 gray, BGR or BGRA) as BGR with ``result`` drawn on it.

    :class:`~edgekit.detect.boxes.Detections`: a box per object with ``label score`` on a
    filled tab in the class colour (tabs placed so that none covers another), its keypoints (if
    any) as small dots; :class:`~edgekit.heads.classify.Classification`: the top label and score as a
    banner across the top, and with ``crop`` (the model input's crop, as
    :class:`~edgekit.imaging.image.InputSpec` holds it) the window the model saw outlined, the rest of
    the frame dimmed; :class:`~edgekit.heads.segment.Segmentation`: each mask tinted in its class
    colour and outlined, ``label area`` on a tab at its box; any other result: the frame unchanged.

    Raises:
        BackendUnavailable: OpenCV is not installed.
        ValueError: ``frame`` is not a uint8 image.
    """
    cv2 = import_cv2("drawing results on frames")
    image = _as_bgr(cv2, frame)
    if isinstance(result, Detections):
        _draw_detections(cv2, image, result)
    elif isinstance(result, Segmentation):
        _draw_segments(cv2, image, result)
    elif isinstance(getattr(result, "points", None), np.ndarray) and result.present:  # the landmarks head
        _points(cv2, image, result.points, PALETTE[0])
    elif isinstance(result, Classification) and result.predictions:
        top = result.top
        _window(cv2, image, crop, colour_for(top.index))
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
    boxes = [(int(round(d.box[0] * sx)), int(round(d.box[1] * sy)), int(round(d.box[2] * sx)) - 1,
              int(round(d.box[3] * sy)) - 1) for d in detections.detections]
    texts = [f"{d.label} {d.score:.2f}" + (f" {d.sub_label} {d.sub_label_score or 0:.2f}" if d.sub_label else "")
             for d in detections.detections]
    tabs = place_tabs(boxes, [_text_size(cv2, t, font_scale, thick) for t in texts], image.shape[:2])
    # worst first, so the best box ends up on top where boxes overlap; tabs after every box, so
    # no box line crosses a label
    for det, (x1, y1, x2, y2) in zip(reversed(detections.detections), reversed(boxes)):
        colour = colour_for(det.index)
        cv2.rectangle(image, (x1, y1), (x2, y2), colour, line, cv2.LINE_8)  # axis-aligned: crisp, exact colour
        _dots(cv2, image, [(x * sx, y * sy) for x, y in det.keypoints], colour, line)
        if det.region is not None:
            _region(cv2, image, det.region, (sx, sy), colour)
        if det.landmarks:
            _points(cv2, image, np.asarray(det.landmarks) * np.float32([sx, sy, 1.0]), colour)
    for det, text, tab in zip(reversed(detections.detections), reversed(texts), reversed(tabs)):
        _tab(cv2, image, text, tab, colour_for(det.index), font_scale, thick)


def _draw_segments(cv2: Any, image: np.ndarray, result: Segmentation) -> None:
    """Each class's mask tinted half-way to its colour and outlined, with its label and area on a tab."""
    line, font_scale, thick = _sizes(image)
    found = [(s, result.indices.index(s.index)) for s in result.segments]
    masks = [_mask_on(cv2, image.shape, result, k) for _, k in found]
    for (seg, _), mask in zip(found, masks):
        colour = np.array(colour_for(seg.index), np.uint16)
        image[mask] = ((image[mask].astype(np.uint16) + colour) // 2).astype(np.uint8)
        contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        cv2.drawContours(image, contours, -1, colour_for(seg.index), line, cv2.LINE_AA)
    h, w = image.shape[:2]
    sx, sy = w / result.grid.size[0], h / result.grid.size[1]
    boxes = [(int(s.box[0] * sx), int(s.box[1] * sy), int(s.box[2] * sx) - 1, int(s.box[3] * sy) - 1) for s, _ in found]
    texts = [f"{s.label} {s.area:.0%}" for s, _ in found]
    tabs = place_tabs(boxes, [_text_size(cv2, t, font_scale, thick) for t in texts], image.shape[:2])
    for (seg, _), text, tab in zip(found, texts, tabs):
        _tab(cv2, image, text, tab, colour_for(seg.index), font_scale, thick)


def _mask_on(cv2: Any, shape: tuple[int, ...], result: Segmentation, k: int) -> np.ndarray:
    """Mask ``k`` at the image's resolution, its grid warped bilinearly (smooth edges, not cells)
    and cut to the region the model saw: where it lies is :class:`~edgekit.heads.segment.GridMap`'s."""
    h, w = shape[:2]
    g = result.grid
    sx, sy = w / g.size[0], h / g.size[1]  # an image other than the frame decoded: scale over
    cx, cy, ox, oy = g.cell[0] * sx, g.cell[1] * sy, g.offset[0] * sx, g.offset[1] * sy
    # grid cell centre j + 0.5 lies at ox + (j + 0.5) * cx; OpenCV puts pixel centres on whole numbers
    warp = np.float32([[cx, 0, ox + 0.5 * cx - 0.5], [0, cy, oy + 0.5 * cy - 0.5]])
    soft = cv2.warpAffine(result.masks[k].astype(np.float32), warp, (w, h), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_REPLICATE)
    x1, y1, x2, y2 = (int(round(v)) for v in (g.bounds[0] * sx, g.bounds[1] * sy, g.bounds[2] * sx, g.bounds[3] * sy))
    inside = np.zeros((h, w), bool)
    inside[max(y1, 0):max(y2, 0), max(x1, 0):max(x2, 0)] = True
    return (soft >= 0.5) & inside


def _dots(cv2: Any, image: np.ndarray, points: list[tuple[float, float]], colour: tuple[int, int, int],
          line: int) -> None:
    """Keypoints as small filled dots in the class colour, ringed in the ink colour so they stay
    visible on a face or on the box line itself."""
    radius = line + 1
    for x, y in points:
        centre = (int(round(x)), int(round(y)))
        cv2.circle(image, centre, radius + 1, _ink(colour), -1, cv2.LINE_AA)
        cv2.circle(image, centre, radius, colour, -1, cv2.LINE_AA)


def _region(cv2: Any, image: np.ndarray, region: tuple[float, ...], scale: tuple[float, float],
            colour: tuple[int, int, int]) -> None:
    """A cascade's rotated region (cx, cy, w, h, degrees) as a thin outline: where the second model looked."""
    cx, cy, w, h, degrees = region[:5]
    corners = cv2.boxPoints(((cx, cy), (w, h), degrees)) * np.float32(scale)
    cv2.polylines(image, [np.round(corners).astype(np.int32)], True, colour, 1, cv2.LINE_AA)


def _points(cv2: Any, image: np.ndarray, points: np.ndarray, colour: tuple[int, int, int]) -> None:
    """Landmarks as 1-2 px dots (a face mesh has 468: rings would hide the face)."""
    radius = max(1, min(image.shape[:2]) // 400)
    for x, y in np.asarray(points, np.float64)[:, :2]:
        if abs(x) < 1e6 and abs(y) < 1e6:  # a NaN or absurd point is not drawn
            cv2.circle(image, (int(round(x)), int(round(y))), radius, colour, -1, cv2.LINE_AA)


def _text_size(cv2: Any, text: str, font_scale: float, thick: int) -> tuple[int, int]:
    """Width and height of ``text``'s filled tab, padding included."""
    (tw, th), base = cv2.getTextSize(text, _FONT, font_scale, thick)
    pad = max(1, th // 4)
    return tw + 2 * pad, th + base + 2 * pad


def place_tabs(boxes: list[tuple[int, int, int, int]], sizes: list[tuple[int, int]],
               shape: tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """Where each box's label tab goes (x1, y1, x2, y2), best box first: above its top-left
    corner, else inside the box's top, else below it, else moved down past the tabs already
    placed; always inside the image. Greedy, so the best-scoring box gets the natural spot."""
    height, width = shape
    placed: list[tuple[int, int, int, int]] = []
    for (x1, y1, _x2, y2), (tw, th) in zip(boxes, sizes):
        x = min(max(x1, 0), max(width - tw, 0))
        tries = [y1 - th, y1, y2 + 1]
        tab = None
        for top in [t for t in tries if 0 <= t <= height - th] or [min(max(y1, 0), max(height - th, 0))]:
            tab = (x, top, x + tw, top + th)
            while (below := _hits(tab, placed)) is not None and below + th <= height:
                tab = (x, below, x + tw, below + th)  # just under the lowest tab it touched
            if _hits(tab, placed) is None:
                break
        placed.append(tab)
    return placed


def _hits(tab: tuple[int, int, int, int], placed: list[tuple[int, int, int, int]]) -> int | None:
    """The lowest bottom edge of the placed tabs ``tab`` overlaps, or None."""
    bottoms = [p[3] for p in placed if tab[0] < p[2] and p[0] < tab[2] and tab[1] < p[3] and p[1] < tab[3]]
    return max(bottoms) if bottoms else None


def _tab(cv2: Any, image: np.ndarray, text: str, tab: tuple[int, int, int, int], colour: tuple[int, int, int],
         font_scale: float, thick: int) -> None:
    """``text`` on a filled tab in the class colour."""
    (tw, th), base = cv2.getTextSize(text, _FONT, font_scale, thick)
    pad = max(1, th // 4)
    cv2.rectangle(image, (tab[0], tab[1]), (tab[2] - 1, tab[3] - 1), colour, -1)
    cv2.putText(image, text, (tab[0] + pad, tab[1] + pad + th), _FONT, font_scale, _ink(colour), thick, cv2.LINE_AA)


def _window(cv2: Any, image: np.ndarray, crop: Any, colour: tuple[int, int, int]) -> None:
    """The crop window the model saw: outlined in the class colour, the frame around it dimmed."""
    if crop is None or crop == "none":
        return
    from edgekit.imaging.imgops import crop_window

    h, w = image.shape[:2]
    top, left, ch, cw = crop_window(h, w, crop)
    if (ch, cw) == (h, w):
        return
    inside = image[top : top + ch, left : left + cw].copy()
    image[:] = (image.astype(np.uint16) * 2 // 5).astype(np.uint8)
    image[top : top + ch, left : left + cw] = inside
    line = _sizes(image)[0]
    cv2.rectangle(image, (left, top), (left + cw - 1, top + ch - 1), colour, line, cv2.LINE_8)


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
