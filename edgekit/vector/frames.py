"""Turning the SDK's camera images into arrays, and surviving the ones it cannot open.

Helpers of :class:`~edgekit.vector.camera.VectorSource`: the SDK hands over each image as a
lazily opened PIL image; these convert it to OpenCV's BGR convention, bring it to Vector's
nominal width, and keep an image the SDK cannot open from ending its camera feed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.errors import first_line


def skip_undecodable(camera: Any, report: Any) -> None:
    """Make the SDK's camera skip an image it cannot open instead of ending its feed.

    wirepod_vector_sdk 0.8.1 opens every CameraFeed image with ``Image.open`` whatever its
    ``image_encoding`` (CameraComponent._unpack_image); one that is not a JPEG/PNG raises in
    the feed task, which then ends for good. ``report(detail)`` is called for each such image.
    """
    unpack = camera._unpack_image

    def guarded(msg: Any) -> None:
        try:
            unpack(msg)
        except (OSError, ValueError, SyntaxError) as exc:  # PIL.UnidentifiedImageError is an OSError
            report(f"image {getattr(msg, 'image_id', '?')}, {_encoding_name(msg)}, {len(msg.data)} bytes: "
                   f"{first_line(exc).split(' <')[0]}")

    camera._unpack_image = guarded


def _encoding_name(msg: Any) -> str:
    """The ImageChunk encoding of a CameraFeedResponse by name (its number if unknown)."""
    try:
        from anki_vector.messaging import protocol

        return protocol.ImageChunk.ImageEncoding.Name(msg.image_encoding)
    except (ImportError, ValueError, AttributeError):
        return f"encoding {getattr(msg, 'image_encoding', '?')}"


def to_width(array: np.ndarray, width: int) -> np.ndarray:
    """``array`` resized to ``width`` columns, aspect kept (area average when shrinking)."""
    import cv2

    height = max(1, round(array.shape[0] * width / array.shape[1]))
    shrink = width < array.shape[1]
    return cv2.resize(array, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def to_bgr(image: Any) -> np.ndarray:
    """A PIL image from the SDK -> an OpenCV-convention array (gray stays 2-D)."""
    import cv2

    array = np.asarray(image)
    if array.ndim == 2:
        return np.ascontiguousarray(array)
    return cv2.cvtColor(array, cv2.COLOR_RGBA2BGR if array.shape[2] == 4 else cv2.COLOR_RGB2BGR)
