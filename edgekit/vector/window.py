"""Vector frames prepared the fast way: only the model's window, already gray, from the JPEG bytes.

The SDK hands over each camera image as a PIL image opened lazily on the JPEG it received
(``Image.open`` reads only the header). Converting the whole 640x360 frame to a numpy BGR
array and then cropping 200x200 of it costs more than the seed's naive PIL pipeline
(benchmarks/preprocess.py). Instead, :func:`model_window` decodes the JPEG bytes with
``cv2.imdecode`` straight to gray for a gray model (libjpeg then skips the colour planes and
the colour conversion; its gray is the JPEG's own luma, within a grey level of OpenCV's
BGR->gray of the colour decode), then cuts the model's crop window out of that.

The result is what :class:`edgekit.imaging.image.Preprocessor` would crop anyway: feeding it the
window gives the same region (its centre crop is clamped to the window, so it is a no-op),
with the resize and normalisation still done by the one preprocessing code, so the tensor
is the one a host computes from the same frame.

Not done, measured: decoding at 1/2 or 1/4 scale (``IMREAD_REDUCED_GRAYSCALE_2/4``, libjpeg's
DCT-domain scaling) saves 0.05-0.09 ms of 0.6 ms, but it is not an area average: on 260 photo
frames (JPEG q90, 32x32 model, 200x200 window) the tensor moved by up to 13 grey levels at 1/2
(median of the per-frame maxima 5) and 32 at 1/4, against 1 at full scale. Whole-frame entropy
decoding (~0.45 ms for this frame) is the floor either way.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.util.quiet import optional_cv2

if TYPE_CHECKING:
    from edgekit.imaging.image import InputSpec


def model_window(image: Any, spec: InputSpec) -> np.ndarray:
    """The model's crop window of one SDK camera image, gray 2-D or BGR (OpenCV convention).

    Args:
        image: the PIL image from the SDK (``CameraImage.raw_image``), or a numpy BGR/gray
            frame (cropped and converted only, for sources that are not lazy JPEGs).
        spec: the model's input spec (its ``crop``, size and channels are used).

    Returns a new array owned by the caller, at full resolution (the Preprocessor resizes it).
    An image already decoded (no JPEG bytes left behind it) is cropped as a PIL image first,
    then converted: still no full-frame copy.
    """
    from edgekit.imaging.image import convert_colour, crop_center

    if isinstance(image, np.ndarray):
        return np.ascontiguousarray(convert_colour(crop_center(image, spec.crop),
                                                   "gray" if spec.channels == 1 else "bgr"))
    cv2 = optional_cv2()
    data = _jpeg_bytes(image) if cv2 is not None else None
    if data is not None:
        flag = cv2.IMREAD_GRAYSCALE if spec.channels == 1 else cv2.IMREAD_COLOR
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
        if decoded is not None:
            return np.ascontiguousarray(crop_center(decoded, spec.crop))
    return _pil_window(image, spec)


def _jpeg_bytes(image: Any) -> bytes | None:
    """The JPEG behind a lazily opened PIL image (the SDK opens one on a BytesIO), or None."""
    if getattr(image, "format", None) != "JPEG":
        return None
    fp = getattr(image, "fp", None)  # PIL drops it once the image is loaded
    return fp.getvalue() if isinstance(fp, io.BytesIO) else None


def _pil_window(image: Any, spec: InputSpec) -> np.ndarray:
    """Crop with PIL first, then convert only the window: no OpenCV needed (the SDK does not
    install it). A JPEG not decoded yet is decoded straight to its luma for a gray model
    (Pillow's ``draft``: the same numbers as OpenCV's gray decode); an image already decoded is
    converted by PIL's L, the same BT.601 weights as OpenCV rounded in 16 rather than 15 bits
    (within a grey level)."""
    from edgekit.imaging.imgops import crop_window

    gray = spec.channels == 1
    data = _jpeg_bytes(image) if gray else None
    if data is not None:  # a copy of our own: draft() changes the image it is called on
        from PIL import Image

        image = Image.open(io.BytesIO(data))
        image.draft("L", image.size)
    width, height = image.size
    top, left, ch, cw = crop_window(height, width, spec.crop)
    window = image.crop((left, top, left + cw, top + ch))
    if gray:
        return np.asarray(window.convert("L")).copy()
    return np.ascontiguousarray(np.asarray(window.convert("RGB"))[:, :, ::-1])  # BGR, OpenCV's order
