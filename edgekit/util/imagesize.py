"""An image file's width and height from its header, and the pixel cap checked before decoding.

A PNG of a few kB can declare 20000 x 20000 pixels (1-bit rows of zeros compress a thousandfold)
and decode to 1.2 GB as BGR; Pillow raises its ``DecompressionBombError`` past 179 M pixels and
OpenCV tries to allocate up to 1 G pixels. Every image edgekit decodes for a user (calibration
and evaluation sets, COCO and YOLO sizes, fake camera frames) is measured here first, from the
header alone, and refused past :data:`MAX_PIXELS` with one line naming the file.

PNG, JPEG, GIF, BMP and WebP headers are read here (no library); other formats (TIFF) through
Pillow's lazy ``Image.open`` where Pillow is installed, else they are left to the decoder.
"""

from __future__ import annotations

import io
import struct
import warnings
from pathlib import Path

from edgekit.errors import EdgekitError

MAX_PIXELS = 1 << 27
"""The most pixels an image may have (134 M: 11585 x 11585, or a 108 MP phone photo; 0.4 GB as BGR).
A model input is at most 16384 x 16384 (image.MAX_SIDE) but a camera frame is far smaller."""
HEAD_BYTES = 1 << 20
"""How much of a file is read for its size: a JPEG's frame header follows its EXIF/ICC segments."""

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


class ImageTooLarge(EdgekitError):
    """An image file whose header declares more than :data:`MAX_PIXELS` pixels."""

    def __init__(self, path: str | Path, size: tuple[int, int] | None, pixels: int):
        shape = f"{size[0]}x{size[1]} pixels" if size else f"{pixels} pixels"
        super().__init__(f"{path}: {shape}, more than edgekit decodes ({MAX_PIXELS / 1e6:.0f} million pixels)",
                         "downscale the image (it is resized to the model's input anyway), or remove it from the set")
        self.path, self.size, self.pixels = Path(path), size, pixels


def _jpeg(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xDA)):  # markers without a length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF and i + 9 <= len(data):
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return w, h
        i += 2 + length
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(data[24:27], "little") + 1
        return w, int.from_bytes(data[27:30], "little") + 1
    if chunk == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def header_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` declared by the header of PNG, JPEG, GIF, BMP or WebP bytes; None
    for another format or a header too short to tell."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"\xff\xd8":
        return _jpeg(data)
    if data[:4] == b"GIF8" and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:2] == b"BM" and len(data) >= 26:
        w, h = struct.unpack("<ii", data[18:26])
        return abs(w), abs(h)  # a negative height is a top-down BMP
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    return None


def _pillow_size(path: str | Path, data: bytes) -> tuple[int, int] | None:
    """Pillow's reading of the header (lazy: nothing is decoded); None when Pillow cannot tell."""
    try:
        from PIL import Image
    except ImportError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the cap here is ours
        try:
            with Image.open(io.BytesIO(data)) as im:
                return int(im.size[0]), int(im.size[1])
        except Image.DecompressionBombError as exc:  # past twice Pillow's own limit
            raise ImageTooLarge(path, None, 2 * (Image.MAX_IMAGE_PIXELS or 0) + 1) from exc
        except Exception:  # not an image Pillow knows: the decoder reports it
            return None


def check_pixels(path: str | Path, data: bytes) -> tuple[int, int] | None:
    """The declared ``(width, height)`` of image ``data`` (None when unknown); raises
    :class:`ImageTooLarge` naming ``path`` past :data:`MAX_PIXELS`."""
    size = header_size(data)
    if size is None:
        size = _pillow_size(path, data)
    if size is not None and size[0] * size[1] > MAX_PIXELS:
        raise ImageTooLarge(path, size, size[0] * size[1])
    return size


def file_size(path: str | Path) -> tuple[int, int] | None:
    """:func:`check_pixels` of a file, reading only its first :data:`HEAD_BYTES`."""
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    return check_pixels(path, head)
