"""Vector frames prepared the fast way: only the model's window, already gray, from the JPEG bytes.

The SDK hands over each camera image as a PIL image opened lazily on the JPEG it received
(``Image.open`` reads only the header). Converting the whole 640x360 frame to a numpy BGR
array and then cropping 200x200 of it costs more than the seed's naive PIL pipeline
(benchmarks/preprocess.py). Instead, :func:`model_window` decodes the JPEG bytes with
``cv2.imdecode`` at the smallest scale the model's input allows (libjpeg scales by 1/2, 1/4
or 1/8 inside the inverse DCT, and decodes the luma plane alone for gray models), then cuts
the model's crop window out of that. A 32x32 gray model gets a 100x100 gray window decoded at
1/2 scale; a 200x200 model gets the full-resolution window.

The result is what :class:`edgekit.image.Preprocessor` would crop anyway: feeding it the
window gives the same region (its centre crop is clamped to the window, so it is a no-op),
with the resize and normalisation still done by the one preprocessing code.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from edgekit.image import InputSpec

# cv2.imdecode flags by scale-down factor (names, so cv2 is imported only when a frame is decoded)
_GRAY = {1: "IMREAD_GRAYSCALE", 2: "IMREAD_REDUCED_GRAYSCALE_2", 4: "IMREAD_REDUCED_GRAYSCALE_4",
         8: "IMREAD_REDUCED_GRAYSCALE_8"}
_COLOUR = {1: "IMREAD_COLOR", 2: "IMREAD_REDUCED_COLOR_2", 4: "IMREAD_REDUCED_COLOR_4", 8: "IMREAD_REDUCED_COLOR_8"}


def crop_size(spec: InputSpec, width: int, height: int) -> tuple[int, int]:
    """``(h, w)`` of the window ``spec.crop`` takes from a ``width x height`` frame (as crop_center does)."""
    crop = spec.crop
    if crop is None or crop == "none":
        return height, width
    if crop == "square":
        side = min(height, width)
        return side, side
    return min(int(crop[0]), height), min(int(crop[1]), width)


def reduction(spec: InputSpec, width: int, height: int) -> int:
    """The largest scale-down (1, 2, 4 or 8) after which the crop window is still at least twice
    the model input: what is left to the area resize is then a shrink by 2 or more, and the
    tensor stays within about half a grey level of the full-size path (DCT-domain scaling
    right down to the model size drifts by 2 or more)."""
    ch, cw = crop_size(spec, width, height)
    for factor in (8, 4, 2):
        if ch // factor >= 2 * spec.height and cw // factor >= 2 * spec.width:
            return factor
    return 1


def model_window(image: Any, spec: InputSpec) -> np.ndarray:
    """The model's crop window of one SDK camera image, gray 2-D or BGR (OpenCV convention).

    Args:
        image: the PIL image from the SDK (``CameraImage.raw_image``), or a numpy BGR/gray
            frame (cropped and converted only, for sources that are not lazy JPEGs).
        spec: the model's input spec (its ``crop``, size and channels are used).

    Returns a new array owned by the caller. An image already decoded (no JPEG bytes left
    behind it) is cropped as a PIL image first, then converted: still no full-frame copy.
    """
    import cv2

    if isinstance(image, np.ndarray):
        from edgekit.image import convert_colour, crop_center

        return np.ascontiguousarray(convert_colour(crop_center(image, spec.crop),
                                                   "gray" if spec.channels == 1 else "bgr"))
    width, height = image.size
    factor = reduction(spec, width, height)
    data = _jpeg_bytes(image)
    if data is not None:
        flag = getattr(cv2, (_GRAY if spec.channels == 1 else _COLOUR)[factor])
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
        if decoded is not None:
            # libjpeg rounds a scaled size up: take the window's centre at that scale
            ch, cw = crop_size(spec, width, height)
            ch, cw = min(-(-ch // factor), decoded.shape[0]), min(-(-cw // factor), decoded.shape[1])
            top, left = (decoded.shape[0] - ch) // 2, (decoded.shape[1] - cw) // 2
            return np.ascontiguousarray(decoded[top : top + ch, left : left + cw])
    return _pil_window(image, spec, width, height, factor)


def _jpeg_bytes(image: Any) -> bytes | None:
    """The JPEG behind a lazily opened PIL image (the SDK opens one on a BytesIO), or None."""
    if getattr(image, "format", None) != "JPEG":
        return None
    fp = getattr(image, "fp", None)  # PIL drops it once the image is loaded
    return fp.getvalue() if isinstance(fp, io.BytesIO) else None


def _pil_window(image: Any, spec: InputSpec, width: int, height: int, factor: int) -> np.ndarray:
    """Crop (and box-shrink by ``factor``) with PIL first, then convert only the window (PIL's
    L uses the same BT.601 weights as OpenCV)."""
    ch, cw = crop_size(spec, width, height)
    top, left = (height - ch) // 2, (width - cw) // 2
    box = (left, top, left + cw, top + ch)
    window = image.reduce(factor, box) if factor > 1 else image.crop(box)
    if spec.channels == 1:
        return np.asarray(window.convert("L")).copy()
    import cv2

    return cv2.cvtColor(np.asarray(window.convert("RGB")), cv2.COLOR_RGB2BGR)
