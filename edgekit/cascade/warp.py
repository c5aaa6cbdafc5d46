"""The crop a second model reads: an affine warp of the full frame, and the way back to frame pixels.

A :class:`~edgekit.cascade.region.Region` maps onto a model input of ``width x height`` pixels so that
its corners land on the input's corners (as MediaPipe's ImageToTensorCalculator maps a rotated rect):
input pixel ``(u, v)`` comes from frame pixel ``A @ (u, v) + t`` with ``A = R(rotation) @ diag(w / W,
h / H)``. :func:`crop` samples the frame there bilinearly with the border replicated, through OpenCV's
``warpAffine`` when OpenCV is loaded and in numpy otherwise (the lean install runs cascades too; the two
agree within a grey level or two: OpenCV interpolates in 1/32-pixel steps). :func:`to_frame` sends
points the other way: a landmark model's points, in input pixels, to the frame.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from edgekit.cascade.region import Region


def frame_from_input(region: Region, width: int, height: int) -> np.ndarray:
    """The 2x3 matrix taking input pixels ``(u, v, 1)`` of a ``width x height`` input to frame pixels."""
    cos, sin = math.cos(region.rotation), math.sin(region.rotation)
    a = np.array([[cos, -sin], [sin, cos]]) @ np.diag([region.width / width, region.height / height])
    t = np.array([region.cx, region.cy]) - a @ np.array([width / 2.0, height / 2.0])
    return np.hstack([a, t[:, None]])


def to_frame(points: np.ndarray, region: Region, width: int, height: int) -> np.ndarray:
    """``[N, 2+]`` points in input pixels -> frame pixels (x, y); a third column (z, in input pixels
    scaled like x) is scaled to frame pixels by the region's width. Returns float32 ``[N, 3]``."""
    p = np.asarray(points, np.float64).reshape(len(points), -1)
    m = frame_from_input(region, width, height)
    out = np.zeros((len(p), 3), np.float64)
    out[:, :2] = p[:, :2] @ m[:, :2].T + m[:, 2]
    if p.shape[1] > 2:
        out[:, 2] = p[:, 2] * region.width / width
    return out.astype(np.float32)


def crop(frame: np.ndarray, region: Region, width: int, height: int, use_opencv: bool | None = None) -> np.ndarray:
    """``frame`` (uint8 HxW or HxWxC) sampled over ``region`` into a ``height x width`` image of the same
    channels: bilinear, border replicated. ``use_opencv`` None: OpenCV when it is already imported."""
    m = frame_from_input(region, width, height)
    cv2 = sys.modules.get("cv2") if use_opencv is None else (_cv2() if use_opencv else None)
    if cv2 is not None and hasattr(cv2, "warpAffine"):
        out = cv2.warpAffine(frame, m, (width, height), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                             borderMode=cv2.BORDER_REPLICATE)
        return out[..., None] if frame.ndim == 3 and out.ndim == 2 else out
    return warp_numpy(frame, m, width, height)


def _cv2():
    import cv2

    return cv2


def warp_numpy(frame: np.ndarray, m: np.ndarray, width: int, height: int) -> np.ndarray:
    """OpenCV's ``warpAffine(..., INTER_LINEAR | WARP_INVERSE_MAP, BORDER_REPLICATE)`` in numpy:
    output pixel ``(u, v)`` is the frame bilinearly sampled at ``m @ (u, v, 1)``, coordinates outside
    clamped to the edge pixels."""
    h, w = frame.shape[:2]
    v, u = np.mgrid[0:height, 0:width].astype(np.float32)
    x = m[0, 0] * u + m[0, 1] * v + m[0, 2]
    y = m[1, 0] * u + m[1, 1] * v + m[1, 2]
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    x0i, y0i = x0.astype(np.int64), y0.astype(np.int64)
    xa, xb = np.clip(x0i, 0, w - 1), np.clip(x0i + 1, 0, w - 1)
    ya, yb = np.clip(y0i, 0, h - 1), np.clip(y0i + 1, 0, h - 1)
    src = frame.reshape(h, w, -1).astype(np.float32)
    top = src[ya, xa] * (1 - fx) + src[ya, xb] * fx
    bottom = src[yb, xa] * (1 - fx) + src[yb, xb] * fx
    out = np.clip(np.rint(top * (1 - fy) + bottom * fy), 0, 255).astype(np.uint8)
    return out.reshape(height, width) if frame.ndim == 2 else out
