"""Preprocessing: frame -> model input tensor. The ONE copy of this code.

Calibration on the host and inference on the device both call :class:`Preprocessor`, so
an int8 model is calibrated on exactly the tensors it will later be fed.

Frames follow OpenCV's convention: ``uint8`` arrays, 2-D for gray, ``HxWx3`` in B,G,R order
for colour (``HxWx4`` BGRA: alpha dropped).

OpenCV is optional: it does the resizing, colour conversion and table lookup when installed;
without it :mod:`edgekit.imaging.imgops` does them in numpy as OpenCV defines them, and Pillow decodes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import BackendUnavailable, EdgekitError, first_line
from edgekit.imaging import imgops
from edgekit.util.imagesize import HEAD_BYTES, check_pixels
from edgekit.util.quiet import optional_cv2

_INT_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-32768, 32767)}
_CHOICES = {"dtype": ("float32", "float16", *_INT_RANGES), "layout": ("NHWC", "NCHW"),
            "colour": ("gray", "rgb", "bgr"), "resize": ("stretch", "letterbox"),
            "interpolation": imgops.INTERPOLATIONS}
MAX_SIDE = 16384
"""The largest input or crop side accepted (one 16384 x 16384 x 3 float32 tensor is 3 GiB)."""


class InputSpecError(EdgekitError, ValueError):
    """An input description or preprocessing that cannot work (a bundle's ``input``, a build's flags)."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message, hint or "rebuild the bundle, or fix the preprocessing given to edgekit build")


@dataclass(frozen=True)
class InputSpec:
    """Everything needed to turn a camera frame into the model's input tensor.

    ``shape`` includes the batch dimension. ``mean``/``std`` are in pixel units (0-255):
    ``x = (pixel - mean) / std``; for a quantised input ``q = round(x / scale) + zero_point``.
    ``crop`` is ``None`` (whole frame), ``"square"`` (largest centred square), ``[h, w]`` (a
    centred window of that many pixels, clamped to the frame) or ``"h:w"`` (the largest centred
    window of that aspect ratio: ``--resize crop`` stores the input's own, e.g. ``"480:640"``).
    ``pad_value`` (0-255) fills a letterbox's borders (Ultralytics pads with 114).
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    layout: str = "NHWC"
    scale: float | None = None
    zero_point: int | None = None
    colour: str = "rgb"
    crop: Any = None
    resize: str = "stretch"
    interpolation: str = "area"
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (255.0,)
    name: str = ""
    pad_value: int = 0  # bundles before it padded black: the default keeps them as built
    extra: dict = field(default_factory=dict)

    @property
    def height(self) -> int:
        return self.shape[1] if self.layout == "NHWC" else self.shape[2]

    @property
    def width(self) -> int:
        return self.shape[2] if self.layout == "NHWC" else self.shape[3]

    @property
    def channels(self) -> int:
        return self.shape[3] if self.layout == "NHWC" else self.shape[1]

    @property
    def quantized(self) -> bool:
        return self.dtype in _INT_RANGES

    def to_dict(self) -> dict:
        """A JSON-ready dict (the ``input`` section of edgekit.json)."""
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        d["crop"] = list(self.crop) if isinstance(self.crop, (list, tuple)) else self.crop
        return d

    @classmethod
    def from_dict(cls, d: dict) -> InputSpec:
        """Inverse of :meth:`to_dict`; unknown keys are kept in ``extra``.

        The dict is untrusted (a bundle's edgekit.json): anything that cannot describe an image
        input raises InputSpecError (see :meth:`check`).
        """
        if not isinstance(d, dict):
            raise InputSpecError(f"input is {type(d).__name__}, not an object")
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known and k != "extra"}
        try:
            kw["shape"] = tuple(_whole(s) for s in kw["shape"])
            for key in ("mean", "std"):
                if key in kw:
                    kw[key] = tuple(float(v) for v in kw[key])
            extra = dict(d.get("extra", {}))
        except KeyError as exc:
            raise InputSpecError(f"input has no {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise InputSpecError(f"input is malformed: {exc}") from exc
        if isinstance(kw.get("crop"), list):
            kw["crop"] = tuple(kw["crop"])
        extra.update({k: v for k, v in d.items() if k not in known})
        return cls(**kw, extra=extra).check()

    def check(self) -> InputSpec:
        """This spec if a frame can be turned into its tensor; else InputSpecError saying why."""
        why = _spec_problem(self)
        if why:
            raise InputSpecError(f"input {why}"[:300])
        return self

    def with_quantization(self, dtype: str, scale: float | None, zero_point: int | None) -> InputSpec:
        """The same preprocessing feeding a tensor of another dtype/quantisation."""
        d = self.to_dict()
        d.update(dtype=dtype, scale=scale, zero_point=zero_point)
        return InputSpec.from_dict(d)


def _whole(value: Any) -> int:
    """An int from JSON (2, not 2.5, True or "2")."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number")
    return value


def _spec_problem(s: InputSpec) -> str | None:
    """Why ``s`` cannot describe an image input, or None."""
    for key, allowed in _CHOICES.items():
        if getattr(s, key) not in allowed:
            return f"{key} {getattr(s, key)!r} is not one of {', '.join(allowed)}"
    shape = s.shape
    if len(shape) != 4 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
        return f"shape {list(shape)} is not a batch of images (N, H, W, C or N, C, H, W; every size >= 1)"
    if max(s.height, s.width) > MAX_SIDE or s.channels not in (1, 3) or shape[0] > 64:
        return f"shape {list(shape)} is not an image batch edgekit feeds (1 or 3 channels, sides <= {MAX_SIDE})"
    if why := imgops.crop_problem(s.crop, MAX_SIDE):
        return why
    if not isinstance(s.pad_value, int) or isinstance(s.pad_value, bool) or not 0 <= s.pad_value <= 255:
        return f"pad_value {s.pad_value!r} must be a whole number from 0 to 255 (a letterbox's border)"
    for key in ("mean", "std"):
        values = getattr(s, key)
        if not isinstance(values, (list, tuple)) or len(values) not in (1, s.channels) or not all(
                isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            return f"{key} {values!r} must be 1 or {s.channels} finite numbers"
    if any(v == 0 for v in s.std):
        return f"std {list(s.std)} has a zero (pixel = (value - mean) / std)"
    if not all(1e-3 <= v <= 1e6 for v in s.std) or not all(abs(v) <= 1e4 for v in s.mean):  # else inf/NaN tensors
        return f"mean {list(s.mean)} / std {list(s.std)} must be within +-1e4 / 0.001..1e6 (pixel units)"
    if s.quantized and not (isinstance(s.scale, (int, float)) and math.isfinite(s.scale) and s.scale > 0):
        return f"dtype {s.dtype} needs a positive quantisation scale, not {s.scale!r}"
    lo, hi = _INT_RANGES.get(s.dtype, (None, None))
    if lo is not None and s.zero_point is not None and not (isinstance(s.zero_point, int) and lo <= s.zero_point <= hi):
        return f"zero_point {s.zero_point!r} does not fit {s.dtype}"
    return None


def crop_center(frame: np.ndarray, crop: Any) -> np.ndarray:
    """Return a centred view of ``frame`` (no copy). See :class:`InputSpec` for ``crop``."""
    if crop is None or crop == "none":
        return frame
    top, left, ch, cw = imgops.crop_window(frame.shape[0], frame.shape[1], crop)
    return frame[top : top + ch, left : left + cw]


def convert_colour(frame: np.ndarray, colour: str) -> np.ndarray:
    """Convert an OpenCV-convention frame (gray, BGR or BGRA) to ``gray``, ``rgb`` or ``bgr``."""
    if frame.ndim == 3 and frame.shape[2] == 1:
        frame = frame[:, :, 0]
    if frame.ndim == 3 and frame.shape[2] not in (3, 4):
        raise ValueError(f"frames have 1, 3 or 4 channels, not {frame.shape[2]}")
    cv2 = optional_cv2()
    if cv2 is None:
        return imgops.convert_colour(frame, colour)
    if frame.ndim == 2:
        if colour == "gray":
            return frame
        return cv2.cvtColor(frame, cv2.COLOR_GRAY2RGB if colour == "rgb" else cv2.COLOR_GRAY2BGR)
    if frame.shape[2] == 4:
        code = {"gray": cv2.COLOR_BGRA2GRAY, "rgb": cv2.COLOR_BGRA2RGB, "bgr": cv2.COLOR_BGRA2BGR}[colour]
        return cv2.cvtColor(frame, code)
    if colour == "bgr":
        return frame
    return cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY if colour == "gray" else cv2.COLOR_BGR2RGB)


def resize(frame: np.ndarray, height: int, width: int, mode: str = "stretch", interpolation: str = "area",
           pad_value: int = 0):
    """Resize to ``height x width``; ``letterbox`` keeps the aspect ratio and pads with ``pad_value``.

    ``interpolation``: ``area``, ``linear``, ``nearest`` or ``cubic`` (OpenCV's, or
    :mod:`edgekit.imaging.imgops`).
    """
    if interpolation not in imgops.INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; use {', '.join(imgops.INTERPOLATIONS)}")
    h, w = frame.shape[:2]
    if (h, w) == (height, width):
        return frame
    if mode == "stretch":
        return _resize(frame, height, width, interpolation)
    top, left, nh, nw = imgops.letterbox_window(h, w, height, width)
    return imgops.pad(_resize(frame, nh, nw, interpolation), height, width, top, left, pad_value)


def _resize(frame: np.ndarray, height: int, width: int, interpolation: str) -> np.ndarray:
    cv2 = optional_cv2()
    if cv2 is None:
        return imgops.resize(frame, height, width, interpolation)
    if interpolation == "area" and imgops.area_shrink_matches_opencv(frame.shape[:2], (height, width)):
        return imgops.area_shrink(frame, height, width)  # OpenCV's numbers, 2-6x sooner at odd ratios
    inter = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST,
             "cubic": cv2.INTER_CUBIC}[interpolation]
    return cv2.resize(frame, (width, height), interpolation=inter)


def pixel_lut(spec: InputSpec) -> np.ndarray:
    """A ``(channels, 256)`` table mapping a uint8 pixel straight to the input value.

    Normalisation and quantisation are per-pixel functions of an 8-bit value, so they
    fold into one table lookup: this is what makes preprocessing cheap on a Pi.
    """
    pixels = np.arange(256, dtype=np.float64)
    channels = spec.channels
    mean = np.broadcast_to(np.asarray(spec.mean, dtype=np.float64), (channels,))
    std = np.broadcast_to(np.asarray(spec.std, dtype=np.float64), (channels,))
    x = (pixels[None, :] - mean[:, None]) / std[:, None]
    if spec.quantized:
        if not spec.scale:
            raise ValueError(f"input dtype {spec.dtype} needs a quantisation scale")
        lo, hi = _INT_RANGES[spec.dtype]
        q = np.round(x / spec.scale) + (spec.zero_point or 0)
        return np.clip(q, lo, hi).astype(spec.dtype)
    return x.astype(spec.dtype)


class Preprocessor:
    """Turns frames into input tensors for one :class:`InputSpec`.

    Build it once per model: it precomputes the pixel lookup table. Calling it returns a
    new array with the batch dimension, owned by the caller. It holds no mutable state, so
    one instance may be shared between threads.
    """

    def __init__(self, spec: InputSpec):
        self.spec = spec.check()  # a crop of -5 pixels fails here, not on the first frame
        self._lut = pixel_lut(spec)
        self._lut_1d = self._lut[0] if spec.channels == 1 or np.all(self._lut == self._lut[0]) else None
        # cv2.LUT maps uint8 images through a 256-entry table of most dtypes (not float16);
        # a 3-channel table is passed as 1x256x3. Without OpenCV, numpy indexing does it.
        self._cv2 = optional_cv2()
        lut_for_cv = self._lut_1d if self._lut_1d is not None else self._lut.T.reshape(1, 256, spec.channels)
        usable = self._cv2 is not None and self._lut.dtype != np.float16
        self._cv_lut = np.ascontiguousarray(lut_for_cv) if usable else None

    def shaped(self, frame: np.ndarray) -> np.ndarray:
        """Crop, colour-convert and resize a frame to ``H x W (x C)`` uint8 (no normalisation).

        Raises ValueError for a frame that cannot be one (wrong dtype, rank or channel count,
        empty), whichever library does the work.
        """
        s = self.spec
        if frame.dtype != np.uint8:
            raise ValueError(f"frames must be uint8, got {frame.dtype}")
        if frame.ndim not in (2, 3) or 0 in frame.shape:
            raise ValueError(f"frames must be HxW or HxWxC with pixels, got shape {frame.shape}")
        img = crop_center(frame, s.crop)
        try:
            img = convert_colour(img, "gray" if s.channels == 1 else s.colour)
            return resize(img, s.height, s.width, s.resize, s.interpolation, s.pad_value)
        except Exception as exc:
            if self._cv2 is not None and isinstance(exc, self._cv2.error):
                raise ValueError(f"unusable frame {frame.shape}: {first_line(exc)}") from exc
            raise

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        return self.finish(self.shaped(frame))

    def finish(self, img: np.ndarray) -> np.ndarray:
        """Normalise/quantise an image already returned by :meth:`shaped` into a batch of one."""
        if self._cv_lut is not None:
            out = self._cv2.LUT(img, self._cv_lut)  # ~4x faster than numpy fancy indexing (benchmarks/preprocess.py)
        elif self._lut_1d is not None:
            out = self._lut_1d[img]
        else:
            out = np.stack([self._lut[c][img[..., c]] for c in range(self.spec.channels)], axis=-1)
        if out.ndim == 2:
            out = out[:, :, None]
        if self.spec.layout == "NCHW":
            out = out.transpose(2, 0, 1)
        return np.ascontiguousarray(out[None])


def preprocess(frame: np.ndarray, spec: InputSpec) -> np.ndarray:
    """One-off convenience: ``Preprocessor(spec)(frame)``. Build a Preprocessor in loops."""
    return Preprocessor(spec)(frame)


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")


class ImageReadError(ValueError):
    """A file that is not a readable image (wrong format or truncated)."""


IMAGES_HINT = "pip install 'edgekit-vision[images]' (Pillow, small) or 'edgekit-vision[opencv]'"


def require_image_decoder(what: str) -> None:
    """Refuse now, before any work, when neither OpenCV nor Pillow is there to decode images.

    Raises:
        BackendUnavailable: ``what`` needs one of them; the hint names the ``[images]`` extra.
    """
    import importlib.util

    if optional_cv2() is None and importlib.util.find_spec("PIL") is None:
        raise BackendUnavailable(f"{what} needs Pillow or OpenCV to decode images, and neither is installed",
                                 IMAGES_HINT)


def read_image(path: str | Path) -> np.ndarray:
    """Read an image file as an OpenCV-convention uint8 frame (gray, BGR).

    Decoded by OpenCV when it is installed, else by Pillow. Raises ImageReadError for files
    that cannot be decoded, including truncated ones; ImageTooLarge (an EdgekitError, not
    skipped as unreadable) for one declaring more than imagesize.MAX_PIXELS; BackendUnavailable
    when neither library is installed. 16-bit images are scaled to 8 bits; alpha is dropped.
    """
    data = np.fromfile(str(path), dtype=np.uint8)
    check_pixels(path, data[:HEAD_BYTES].tobytes())  # ImageTooLarge before a byte is decoded
    if data[:2].tobytes() == b"\xff\xd8" and b"\xff\xd9" not in data[-64:].tobytes():
        # libjpeg decodes a cut-off JPEG with only a warning and grey fill: refuse it.
        raise ImageReadError(f"{path}: truncated JPEG")
    cv2 = optional_cv2()
    img = _decode_opencv(cv2, data) if cv2 is not None else _decode_pillow(path, data)
    if img is None:
        raise ImageReadError(f"{path}: not a readable image")
    if img.dtype == np.uint16:
        img = (img >> 8).astype(np.uint8)
    elif img.dtype != np.uint8:
        lo, hi = float(img.min()), float(img.max())
        img = ((img.astype(np.float64) - lo) * (255.0 / (hi - lo or 1.0))).round().astype(np.uint8)
    if img.ndim == 3 and img.shape[2] == 4:
        img = np.ascontiguousarray(img[:, :, :3])
    return img


def _decode_opencv(cv2, data: np.ndarray) -> np.ndarray | None:
    try:
        return cv2.imdecode(data, cv2.IMREAD_UNCHANGED) if data.size else None
    except cv2.error:  # e.g. past OpenCV's own pixel limit in a format whose header is not read here
        return None


def _decode_pillow(path: str | Path, data: np.ndarray) -> np.ndarray | None:
    """Pillow's decode, turned into OpenCV's convention (gray 2-D or B,G,R)."""
    import io

    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as exc:
        raise BackendUnavailable(
            f"reading {Path(path).name} needs Pillow or OpenCV, and neither is installed", IMAGES_HINT
        ) from exc
    try:
        with Image.open(io.BytesIO(data.tobytes())) as im:
            im.load()  # decodes now: a truncated file raises here (OSError)
            if im.mode in ("I;16", "I;16B", "I;16L"):
                return np.asarray(im, dtype=np.uint16)
            if im.mode == "I" and im.format == "PPM":  # a 16-bit PGM, widened to 32 bits by Pillow
                return np.asarray(im).clip(0, 65535).astype(np.uint16)
            if im.mode in ("I", "F"):
                return np.asarray(im)
            gray = im.mode in ("L", "1", "LA") or (im.mode == "P" and _palette_is_gray(im))
            arr = np.asarray(im.convert("L" if gray else "RGB"))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return None
    return arr if arr.ndim == 2 else np.ascontiguousarray(arr[:, :, ::-1])


def _palette_is_gray(im) -> bool:
    rgb = np.asarray(im.convert("RGB"))
    return bool((rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all())
