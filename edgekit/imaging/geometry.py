"""Where a model input's pixels lie in the frame they were cut from: the crop window, the letterbox or
stretch, and the map back (:class:`BoxMap`). Every head that answers in frame pixels (boxes,
landmarks, masks) maps through it, so all of them follow the preprocessing the same way."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgekit.imaging.image import InputSpec
from edgekit.imaging.imgops import crop_window, letterbox_window


@dataclass(frozen=True)
class BoxMap:
    """An affine map ``frame = input * scale + offset`` per axis, then a clip to ``bounds``
    (``x1, y1, x2, y2`` of the frame region the model saw)."""

    scale: tuple[float, float]
    offset: tuple[float, float]
    bounds: tuple[float, float, float, float]
    size: tuple[int, int]

    def __call__(self, boxes: np.ndarray) -> np.ndarray:
        """Map ``[M, 4]`` xyxy boxes (input pixels) to frame pixels."""
        b = np.asarray(boxes, np.float32).reshape(-1, 4)
        mul = np.array([self.scale[0], self.scale[1]] * 2, np.float32)
        add = np.array([self.offset[0], self.offset[1]] * 2, np.float32)
        out = b * mul + add
        x1, y1, x2, y2 = self.bounds
        np.clip(out[:, 0::2], x1, x2, out=out[:, 0::2])
        np.clip(out[:, 1::2], y1, y2, out=out[:, 1::2])
        return out

    def points(self, points: np.ndarray) -> np.ndarray:
        """Map ``[..., 2]`` x, y points (input pixels) to frame pixels, not clipped: a keypoint outside
        the frame is where the model put it (MediaPipe's pose detector puts the hip centre below an
        image that shows no legs, and the body region built from it needs it there)."""
        p = np.asarray(points, np.float32)
        return p * np.float32(self.scale) + np.float32(self.offset)


def box_map(spec: InputSpec, frame_shape: tuple[int, ...]) -> BoxMap:
    """The map from ``spec``'s input pixels to the pixels of a frame of ``frame_shape`` (H, W, ...)."""
    h, w = int(frame_shape[0]), int(frame_shape[1])
    top, left, ch, cw = crop_window(h, w, spec.crop)
    if spec.resize == "letterbox":
        pad_top, pad_left, nh, nw = letterbox_window(ch, cw, spec.height, spec.width)
    else:
        pad_top, pad_left, nh, nw = 0, 0, spec.height, spec.width
    sx, sy = cw / nw, ch / nh
    return BoxMap(scale=(sx, sy), offset=(left - pad_left * sx, top - pad_top * sy),
                  bounds=(float(left), float(top), float(left + cw), float(top + ch)), size=(w, h))


def identity_map(spec: InputSpec) -> BoxMap:
    """Boxes left in input pixels (clipped to the input): for callers without a frame."""
    return BoxMap((1.0, 1.0), (0.0, 0.0), (0.0, 0.0, float(spec.width), float(spec.height)),
                  (spec.width, spec.height))
