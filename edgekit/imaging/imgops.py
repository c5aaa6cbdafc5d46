"""numpy versions of the few OpenCV operations preprocessing needs, for devices without OpenCV.

OpenCV is an extra (about 150 MB installed); a Pi with picamera2, a folder of images or the
synthetic source needs none of it. :mod:`edgekit.imaging.image` uses OpenCV when it is importable
(faster on large frames) and these functions otherwise. They follow OpenCV's definitions so a
model calibrated on a host with OpenCV sees the same tensors on a device without it:

- ``bgr_to_gray``: OpenCV's fixed-point BT.601 weights (identical output, tests check it);
- ``resize`` ``area`` when shrinking: each output pixel is the area-weighted mean of the input
  pixels it covers (OpenCV's ``INTER_AREA``; within 1 grey level, float rounding);
- ``linear`` (half-pixel centres, edge clamped), ``nearest`` (``floor(dst * scale)``), and
  ``area`` when enlarging (OpenCV's area-mode linear weights): within 1 grey level;
- ``cubic``: Keys' kernel with a = -0.75 over 4x4 pixels, half-pixel centres, edge replicated
  (OpenCV's ``INTER_CUBIC``; within 1 grey level: OpenCV rounds its weights to 11 bits), no
  averaging when shrinking, as OpenCV's;
- a resize that enlarges one axis and shrinks the other differs from OpenCV (approximate):
  preprocessing crops and shrinks, so this case is rare.

Resizing is two small matrix products (rows, then columns), with the weight matrices cached.
An area shrink repeats every ``src / gcd(src, dst)`` input pixels, so it is done block by
block with one small matrix (:func:`area_shrink`): for 200 -> 32 that is a 4x25 matrix applied
to 8 blocks, a few multiply-adds per pixel. That is also faster than OpenCV's ``INTER_AREA``
at most non-integer ratios, and where it provably rounds as OpenCV does
(:func:`area_shrink_matches_opencv`) :mod:`edgekit.imaging.image` uses it even with OpenCV installed.
"""

from __future__ import annotations

from functools import lru_cache
from math import gcd
from typing import Any

import numpy as np

INTERPOLATIONS = ("area", "linear", "nearest", "cubic")

# OpenCV's RGB->gray for 8-bit images: BT.601 weights in 15-bit fixed point, rounded.
_GRAY_SHIFT = 15
_GRAY_B, _GRAY_G, _GRAY_R = 3735, 19235, 9798


def bgr_to_gray(frame: np.ndarray) -> np.ndarray:
    """B,G,R(,A) uint8 -> gray uint8, bit-identical to ``cv2.cvtColor(..., COLOR_BGR2GRAY)``."""
    b, g, r = (frame[..., i].astype(np.uint32) for i in range(3))
    y = b * _GRAY_B + g * _GRAY_G + r * _GRAY_R + (1 << (_GRAY_SHIFT - 1))
    return (y >> _GRAY_SHIFT).astype(np.uint8)


def convert_colour(frame: np.ndarray, colour: str) -> np.ndarray:
    """A gray, BGR or BGRA uint8 frame as ``gray``, ``rgb`` or ``bgr`` (a new array or a view)."""
    if frame.ndim == 2:
        if colour == "gray":
            return frame
        return np.repeat(frame[:, :, None], 3, axis=2)
    if colour == "gray":
        return bgr_to_gray(frame)
    bgr = frame[:, :, :3]
    return np.ascontiguousarray(bgr[:, :, ::-1] if colour == "rgb" else bgr)


@lru_cache(maxsize=64)
def _weights(src: int, dst: int, mode: str, area_both: bool) -> np.ndarray:
    """The ``dst x src`` matrix mapping one axis of the input to the output."""
    scale = src / dst
    w = np.zeros((dst, src), dtype=np.float32)
    rows = np.arange(dst)
    if mode == "nearest":
        w[rows, np.minimum(np.floor(rows * scale).astype(int), src - 1)] = 1.0
        return w
    if mode == "area" and area_both:
        # Box filter: output i covers input [i*scale, (i+1)*scale); weight = overlap / scale.
        for i in range(dst):
            lo, hi = i * scale, (i + 1) * scale
            for j in range(int(np.floor(lo)), min(int(np.ceil(hi)), src)):
                w[i, j] = (min(hi, j + 1) - max(lo, j)) / scale
        return w
    if mode == "cubic":
        return _cubic_weights(src, dst)
    if mode == "area":  # OpenCV enlarging with INTER_AREA: linear with area-mode coefficients
        sx = np.floor(rows * scale).astype(int)
        fx = (rows + 1) - (sx + 1) / scale
        fx = np.where(fx <= 0, 0.0, fx - np.floor(fx))
    else:  # linear, half-pixel centres
        pos = (rows + 0.5) * scale - 0.5
        sx = np.floor(pos).astype(int)
        fx = pos - sx
    fx = np.where(sx < 0, 0.0, fx)
    sx = np.maximum(sx, 0)
    fx = np.where(sx >= src - 1, 0.0, fx)
    sx = np.minimum(sx, src - 1)
    w[rows, sx] += 1.0 - fx
    w[rows, np.minimum(sx + 1, src - 1)] += fx
    return w


CUBIC_A = -0.75  # OpenCV's interpolateCubic (PIL and Pillow use -0.5)


def _cubic_weights(src: int, dst: int) -> np.ndarray:
    """The ``dst x src`` matrix of OpenCV's INTER_CUBIC: four taps around each half-pixel centre,
    indices past an edge clamped to it (BORDER_REPLICATE)."""
    rows = np.arange(dst)
    pos = (rows + 0.5) * (src / dst) - 0.5
    base = np.floor(pos).astype(int)
    t = pos - base
    w = np.zeros((dst, src), dtype=np.float32)
    for k in range(-1, 3):
        d = np.abs(t - k)  # distance of tap base + k from the sample point
        weight = np.where(d <= 1, ((CUBIC_A + 2) * d - (CUBIC_A + 3)) * d * d + 1,
                          np.where(d < 2, ((CUBIC_A * d - 5 * CUBIC_A) * d + 8 * CUBIC_A) * d - 4 * CUBIC_A, 0.0))
        np.add.at(w, (rows, np.clip(base + k, 0, src - 1)), weight)
    return w


@lru_cache(maxsize=64)
def _block(src: int, dst: int) -> tuple[int, np.ndarray]:
    """``(blocks, weights)`` of an area shrink ``src -> dst``: the input splits into ``blocks``
    runs of ``src / blocks`` pixels, each mapped to ``dst / blocks`` outputs by ``weights``
    (output boundaries fall on run boundaries, so every run uses the same matrix)."""
    blocks = gcd(src, dst)
    return blocks, _weights(src // blocks, dst // blocks, "area", True)


@lru_cache(maxsize=64)
def area_shrink_matches_opencv(src: tuple[int, int], dst: tuple[int, int]) -> bool:
    """Whether :func:`area_shrink` of ``src -> dst`` (``(h, w)``) gives OpenCV's numbers and beats it.

    Exactly OpenCV's: the output is ``S / (py * px)`` with ``S`` an integer and ``py``, ``px``
    the input run lengths per block, and both libraries compute it in float32 and round once.
    When ``py * px`` is odd no output can be an exact tie (``k + 1/2``): with ``py * px <= 1024``
    the nearest is at least 1/2048 away, while float32's rounding error on these sums of 8-bit
    values is typically about 1e-5, so both round the same way (tests/imaging/test_image.py compares
    exactly, on a photo and on noise). With an even product ties occur and float error decides
    them: up to one grey level apart, so OpenCV is used there.
    Faster: OpenCV has a fixed-point path for whole ratios (2x, 3x...), which wins; elsewhere its
    generic path costs about 1 ns per input pixel, and the blocks win while they need at most
    16 multiply-adds per pixel and channel (benchmarks/preprocess.py; 200x200 -> 32x32 gray:
    about 20 us against 45 us).
    """
    (h, w), (height, width) = src, dst
    if height > h or width > w or (h % height == 0 and w % width == 0):
        return False
    py, px = h // gcd(h, height), w // gcd(w, width)
    cost = height // gcd(h, height) + width // gcd(w, width)
    return (py * px) % 2 == 1 and py * px <= 1024 and cost <= 16


def area_shrink(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Area-average a uint8 ``HxW`` or ``HxWxC`` image down to ``height x width`` (no axis may
    grow): OpenCV's ``INTER_AREA``, computed block by block (see the module notes)."""
    h, w = frame.shape[:2]
    if height > h or width > w:
        raise ValueError(f"area_shrink cannot grow {h}x{w} to {height}x{width}")
    (gy, wy), (gx, wx) = _block(h, height), _block(w, width)
    img = frame.astype(np.float32).reshape(gy, h // gy, -1)  # (row blocks, rows per block, w*c)
    rows = np.matmul(wy, img)  # (row blocks, rows out per block, w*c)
    if frame.ndim == 2:  # columns: (height, column blocks, cols per block) @ weights.T
        out = np.matmul(rows.reshape(height, gx, w // gx), wx.T)
    else:  # (qx, px) @ (height, column blocks, px, c): the channel axis stays last
        out = np.matmul(wx, rows.reshape(height, gx, w // gx, frame.shape[2]))
    out = np.rint(out, out=out).reshape((height, width) + frame.shape[2:])
    return out.astype(np.uint8)  # weights sum to 1: already within 0..255


def resize(frame: np.ndarray, height: int, width: int, interpolation: str = "area") -> np.ndarray:
    """Resize a uint8 ``HxW`` or ``HxWxC`` image to ``height x width`` (see the module notes)."""
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; use {', '.join(INTERPOLATIONS)}")
    h, w = frame.shape[:2]
    if interpolation == "nearest":  # indexing: exact and cheaper than a product
        ys = np.minimum(np.floor(np.arange(height) * (h / height)).astype(int), h - 1)
        xs = np.minimum(np.floor(np.arange(width) * (w / width)).astype(int), w - 1)
        return np.ascontiguousarray(frame[ys[:, None], xs[None, :]])
    shrink = h >= height and w >= width  # OpenCV uses the box filter only when no axis grows
    if interpolation == "area" and shrink:
        return area_shrink(frame, height, width)
    wy = _weights(h, height, interpolation, shrink)
    wx = _weights(w, width, interpolation, shrink)
    img = frame.astype(np.float32)
    out = np.tensordot(wy, img, axes=(1, 0))  # rows: (height, w[, c])
    out = np.tensordot(wx, out, axes=(1, 1))  # columns: (width, height[, c])
    out = np.swapaxes(out, 0, 1)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)



def aspect(crop: Any) -> tuple[int, int] | None:
    """``(h, w)`` of an aspect-ratio crop ``"h:w"`` (``--resize crop``), else None."""
    if not isinstance(crop, str) or crop.count(":") != 1:
        return None
    h, _, w = crop.partition(":")
    if not (h.isdigit() and w.isdigit() and 0 < len(h) <= 5 and 0 < len(w) <= 5):
        return None
    return (int(h), int(w)) if int(h) and int(w) else None


def crop_problem(crop: Any, max_side: int) -> str | None:
    """Why ``crop`` is not a crop :func:`crop_window` cuts (None when it is)."""
    if crop in (None, "none", "square") or aspect(crop) is not None:
        return None
    if isinstance(crop, (list, tuple)) and len(crop) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= max_side for v in crop):
        return None
    return f"crop {crop!r} must be null, 'square', [height, width] in pixels (1 to {max_side}) or an aspect 'h:w'"


def crop_window(height: int, width: int, crop: Any) -> tuple[int, int, int, int]:
    """``(top, left, crop_height, crop_width)`` of the centred crop of a ``height x width`` frame.

    The one place the crop is worked out: :func:`edgekit.imaging.image.crop_center` cuts it, and
    detection maps boxes back through it (:mod:`edgekit.detect.boxes`). ``crop`` is None,
    ``"square"``, ``[h, w]`` pixels or ``"h:w"``: the largest centred window of that aspect ratio.
    """
    if crop is None or crop == "none":
        return 0, 0, height, width
    ratio = (1, 1) if crop == "square" else aspect(crop)
    if ratio is not None:
        # the side that limits: a 480x640 frame cropped to 1:2 keeps 320x640, to 2:1 keeps 480x240
        scale = min(height / ratio[0], width / ratio[1])
        ch, cw = max(1, min(height, round(ratio[0] * scale))), max(1, min(width, round(ratio[1] * scale)))
    else:
        ch, cw = min(int(crop[0]), height), min(int(crop[1]), width)
    return (height - ch) // 2, (width - cw) // 2, ch, cw


def letterbox_window(h: int, w: int, height: int, width: int) -> tuple[int, int, int, int]:
    """``(top, left, inner_height, inner_width)``: where an ``h x w`` image lands when letterboxed
    into ``height x width`` (aspect ratio kept, centred, the rest padded)."""
    scale = min(height / h, width / w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    return (height - nh) // 2, (width - nw) // 2, nh, nw


def pad(inner: np.ndarray, height: int, width: int, top: int, left: int, value: int = 0) -> np.ndarray:
    """``inner`` placed at ``(top, left)`` of a ``height x width`` image filled with ``value``
    (a letterbox's border: black by default, Ultralytics' grey 114 for its models)."""
    out = np.full((height, width) + inner.shape[2:], value, dtype=inner.dtype)
    out[top : top + inner.shape[0], left : left + inner.shape[1]] = inner
    return out
