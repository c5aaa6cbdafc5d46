"""A deterministic moving test pattern: a source for tests and ``--synthetic`` benchmarks."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from edgekit.camera.base import MAX_FPS, MIN_FPS, CameraOptionError, parse_size
from edgekit.camera.files import EndOfStream, SequenceSource
from edgekit.errors import CameraError
from edgekit.util.optionspec import Option, OptionValueError

SYNTHETIC_SPEC = r"(?:(\d+)[xX](\d+))?(?:@(\d+(?:\.\d+)?))?"  # WxH, @FPS, both or neither
SYNTHETIC_FPS = Option("fps", "float", ge=MIN_FPS, le=MAX_FPS, help="pace (default: unpaced)")  # URI's @FPS too


def synthetic_frame(index: int, width: int = 640, height: int = 360) -> np.ndarray:
    """The synthetic source's frame ``index``: a deterministic BGR pattern (colour ramps, a
    scrolling checkerboard, a moving disc and the index as a binary strip along the top)."""
    return _SyntheticPattern(width, height).frame(index)


class _SyntheticPattern:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
        y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
        # Twice as wide as the frame so a window can scroll across it without wrapping costs.
        xx = np.arange(2 * width)[None, :]
        checker = (((xx // 32) + (np.arange(height)[:, None] // 32)) % 2 * 80).astype(np.uint8)
        self._checker = checker
        self._ramps = np.stack([np.broadcast_to(x, (height, width)), np.broadcast_to(y, (height, width))], -1)
        self._ramps = self._ramps.astype(np.uint8)
        self._yy, self._xx = np.ogrid[:height, :width]  # the disc is drawn with numpy: no OpenCV needed

    def frame(self, index: int) -> np.ndarray:
        w, h = self.width, self.height
        out = np.empty((h, w, 3), np.uint8)
        out[..., :2] = self._ramps
        shift = (index * 4) % w
        out[..., 2] = self._checker[:, shift : shift + w]
        t = index / 30.0
        cx = int(w / 2 + w / 3 * np.sin(2 * np.pi * 0.25 * t))
        cy = int(h / 2 + h / 3 * np.sin(2 * np.pi * 0.4 * t))
        r = max(min(w, h) // 8, 2)
        out[(self._xx - cx) ** 2 + (self._yy - cy) ** 2 <= r * r] = 255
        bit = max(w // 64, 1)
        for b in range(min(32, w // bit)):  # the index in binary, most significant bit first
            out[: max(h // 60, 1), b * bit : (b + 1) * bit] = 255 if (index >> (31 - b)) & 1 else 0
        return out


class _SyntheticReader:
    def __init__(self, width: int, height: int, frames: int | None):
        self._pattern = _SyntheticPattern(width, height)
        self._frames = frames
        self._pos = 0

    def _next(self) -> int:
        if self._frames is not None and self._pos >= self._frames:
            raise EndOfStream
        self._pos += 1
        return self._pos - 1

    def read(self) -> np.ndarray:
        return self._pattern.frame(self._next())

    def skip(self) -> bool:
        self._next()
        return True

    def rewind(self) -> None:
        self._pos = 0

    def release(self) -> None:
        pass


class SyntheticSource(SequenceSource):
    """An endless deterministic moving pattern (:func:`synthetic_frame`), for tests and
    ``--synthetic`` benchmarks: as fast as asked, or paced when ``fps`` is given.
    ``frames=N`` ends after N frames (``loop=True`` repeats them)."""

    kind = "synthetic"

    def __init__(self, size: Any = (640, 360), *, fps: float | None = None, frames: int | None = None,
                 loop: bool = False):  # fmt: skip
        width, height = parse_size(size) or (640, 360)
        super().__init__(
            _SyntheticReader(width, height, frames),
            name=f"synthetic:{width}x{height}" + (f"@{fps:g}" if fps else ""),
            fps=fps,
            pace=bool(fps),
            loop=loop,
        )
        self._info["size"] = (width, height)


def open_synthetic(spec: str, **options: Any) -> SyntheticSource:
    """Open ``synthetic``, ``synthetic:WxH`` or ``synthetic:WxH@FPS`` (``spec`` is what follows
    the colon); a size or rate in the URI gives way to an explicit ``size=``/``fps=``."""
    m = re.fullmatch(SYNTHETIC_SPEC, spec)
    if not m:
        raise CameraError(
            f"bad camera URI synthetic:{spec}", "write synthetic, synthetic:640x480 or synthetic:640x480@30"
        )
    if m.group(1):
        options.setdefault("size", (int(m.group(1)), int(m.group(2))))
    if m.group(3) and "fps" not in options:  # held to the fps= option's range (1e-05 waited a day a frame)
        try:
            options["fps"] = SYNTHETIC_FPS.coerce(m.group(3))
        except OptionValueError as exc:
            raise CameraOptionError(f"synthetic:{spec}: fps {m.group(3)} must be {exc.what}",
                                    SYNTHETIC_FPS.describe()) from None
    try:
        return SyntheticSource(**options)
    except CameraError as exc:  # name the camera: the size may have come from the URI
        raise CameraError(f"synthetic:{spec}: {exc.message}", exc.hint) from exc
