"""numpy versions of the few OpenCV operations preprocessing needs, for devices without OpenCV.

OpenCV is an extra (about 150 MB installed); a Pi with picamera2, a folder of images or the
synthetic source needs none of it. :mod:`edgekit.image` uses OpenCV when it is importable
(faster on large frames) and these functions otherwise. They follow OpenCV's definitions so a
model calibrated on a host with OpenCV sees the same tensors on a device without it:

- ``bgr_to_gray``: OpenCV's fixed-point BT.601 weights (identical output, tests check it);
- ``resize`` ``area`` when shrinking: each output pixel is the area-weighted mean of the input
  pixels it covers (OpenCV's ``INTER_AREA``; within 1 grey level, float rounding);
- ``linear`` (half-pixel centres, edge clamped), ``nearest`` (``floor(dst * scale)``), and
  ``area`` when enlarging (OpenCV's area-mode linear weights): within 1 grey level;
- a resize that enlarges one axis and shrinks the other differs from OpenCV (approximate):
  preprocessing crops and shrinks, so this case is rare.

Resizing is two small matrix products (rows, then columns), with the weight matrices cached.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

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


def resize(frame: np.ndarray, height: int, width: int, interpolation: str = "area") -> np.ndarray:
    """Resize a uint8 ``HxW`` or ``HxWxC`` image to ``height x width`` (see the module notes)."""
    if interpolation not in ("area", "linear", "nearest"):
        raise ValueError(f"unknown interpolation {interpolation!r}; use area, linear or nearest")
    h, w = frame.shape[:2]
    if interpolation == "nearest":  # indexing: exact and cheaper than a product
        ys = np.minimum(np.floor(np.arange(height) * (h / height)).astype(int), h - 1)
        xs = np.minimum(np.floor(np.arange(width) * (w / width)).astype(int), w - 1)
        return np.ascontiguousarray(frame[ys[:, None], xs[None, :]])
    shrink = h >= height and w >= width  # OpenCV uses the box filter only when no axis grows
    wy = _weights(h, height, interpolation, shrink)
    wx = _weights(w, width, interpolation, shrink)
    img = frame.astype(np.float32)
    out = np.tensordot(wy, img, axes=(1, 0))  # rows: (height, w[, c])
    out = np.tensordot(wx, out, axes=(1, 1))  # columns: (width, height[, c])
    out = np.swapaxes(out, 0, 1)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)

