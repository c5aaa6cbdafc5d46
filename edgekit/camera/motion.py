"""Motion gating: infer a frame only when something in the scene moved (``--motion``).

A cheap frame difference decides, in the spirit of Frigate's motion detector. Each frame is cut
into a small grid of blocks (``width`` blocks across, rows by aspect: the small grey copy), and
each block is read as ``k x k`` evenly spaced grey samples (``k`` up to 3). A block counts as
changed when its samples differ, on average, by more than ``threshold`` grey levels from a
running-average background (updated with ``alpha`` every frame), from the previous frame or from
the last wanted frame; when the changed fraction of the grid exceeds ``min_area`` the frame is
wanted. A still scene is still wanted once every ``refresh_s`` seconds of frame time
(``Frame.t_capture_ns``), so a result never goes stale; the first frame, and the first after the
frame size changes, are always wanted.

Why the mean *absolute* difference of a block's samples rather than the difference of block means
(an area-averaged copy): averaging first turns a textured background into mid-grey, and an object
moving over it at a similar mean brightness then vanishes; averaging the absolute differences
keeps that contrast, while the averaging of several samples is the light blur that keeps sensor
and compression noise (a few grey levels) far below any useful threshold.

Device side: numpy and the standard library only (the lean install has no OpenCV); about 0.2 ms
per 640x480 BGR frame on one core, whatever the frame size, since only the samples are read.

Use::

    gate = motion_gate_from({"threshold": 30})
    for frame in motion_gated(camera, gate):
        ...  # only frames with motion, and a refresh now and then
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from edgekit.camera.base import Frame
from edgekit.errors import CameraError, UnknownOptionError, UsageError
from edgekit.util.optionspec import Option, OptionValueError, by_name, defaults, did_you_mean

MOTION_OPTIONS: tuple[Option, ...] = (
    Option("threshold", "int", 25, ge=1, le=255,
           help="grey levels a block of the small copy must change by, on average, to count as moving"),
    Option("min_area", "float", 0.005, ge=0, le=1,
           help="fraction of the small copy's blocks that must move for a frame to be inferred"),
    Option("refresh_s", "float", 5.0, ge=0, le=86400.0,
           help="infer a still scene at least this often, in seconds of frame time (0: only on motion)"),
    Option("width", "int", 64, ge=16, le=640, help="blocks across the small grey copy the difference is taken on"),
    Option("alpha", "float", 0.1, gt=0, le=1, help="how fast the background absorbs a change (1: previous frame)"),
)
"""The options of :class:`MotionGate`, by the names :func:`motion_gate_from` takes."""

_DEFAULTS = defaults(MOTION_OPTIONS)
_SAMPLES = 3  # samples per block side: 9 per block average noise down 3x; 16 cost ~2x for no measured gain
_BGR_TO_GREY = np.array([0.114, 0.587, 0.299], np.float32)  # ITU-R BT.601, as cv2.cvtColor


class MotionGate:
    """Decides, frame by frame, whether a frame is worth inferring.

    Args:
        threshold: grey levels (1..255) a block's samples must differ by, on average, to count
            as changed.
        min_area: fraction (0..1) of the small copy's blocks that must change to count as motion.
        refresh_s: a still scene is still wanted once this many seconds of frame time have passed
            since the last wanted frame; 0 turns the refresh off (then only motion, the first
            frame and a size change are wanted).
        width: blocks across the small grey copy (16..640; a narrower frame has one per pixel).
        alpha: weight of the newest frame in the running-average background (0 < alpha <= 1);
            smaller keeps a slow or stopped object in view longer (Frigate uses 0.01).

    Raises UsageError (one line and its fix) for a value out of range or of the wrong type.
    Attributes after each :meth:`wants`: ``last_motion``, the changed fraction of that frame (0.0
    for a first frame), and ``last_reason``, why it was wanted or not (``first``, ``resized``,
    ``motion``, ``refresh``, ``still``). Not thread-safe: one gate per frame stream. The gate
    keeps no reference to a frame's array.
    """

    def __init__(self, threshold: int = _DEFAULTS["threshold"], min_area: float = _DEFAULTS["min_area"],
                 refresh_s: float = _DEFAULTS["refresh_s"], width: int = _DEFAULTS["width"],
                 alpha: float = _DEFAULTS["alpha"]):
        given = {"threshold": threshold, "min_area": min_area, "refresh_s": refresh_s, "width": width, "alpha": alpha}
        checked = {name: _checked(option, given[name], text=False) for name, option in by_name(MOTION_OPTIONS).items()}
        self.threshold: int = checked["threshold"]
        self.min_area: float = checked["min_area"]
        self.refresh_s: float = checked["refresh_s"]
        self.width: int = checked["width"]
        self.alpha: float = checked["alpha"]
        # at least 1 ns when on: a tiny refresh_s must not round down to "off"
        self._refresh_ns = max(1, round(self.refresh_s * 1e9)) if self.refresh_s > 0 else 0
        self.last_motion = 0.0
        self.last_reason = ""
        self._seen = self._inferred = 0
        self._grid: _SampleGrid | None = None
        self._background: np.ndarray | None = None  # float32 grey samples, the running average
        self._previous: np.ndarray | None = None  # the previous frame's grey samples
        self._reference: np.ndarray | None = None  # the last wanted frame's: what the model last saw
        self._last_wanted_ns: int | None = None

    def wants(self, frame: Frame) -> bool:
        """True when ``frame`` should be inferred: the first frame, the first after a size change,
        one with motion, or a still one once ``refresh_s`` of frame time passed since the last
        wanted frame (or when frame time went backwards: a restarted clock). Updates the
        background, the counts, ``last_motion`` and ``last_reason``.

        Raises CameraError for an array that is not gray (HxW or HxWx1), BGR or BGRA.
        """
        grid, samples = self._samples(frame.array)
        t_ns = int(frame.t_capture_ns)
        if self._background is None or self._previous is None or self._reference is None:
            reason, self.last_motion = ("resized" if self._seen else "first"), 0.0
            self._background = samples.copy()
        else:
            compared = (self._background, self._previous, self._reference)
            self.last_motion = _changed_fraction(grid, samples, compared, self.threshold)
            # the running average the next frame is compared with (cv2.accumulateWeighted's rule)
            self._background += np.float32(self.alpha) * (samples - self._background)
            reason = "motion" if self.last_motion > self.min_area else self._still_reason(t_ns)
        self._previous = samples
        self.last_reason = reason
        self._seen += 1
        wanted = reason != "still"
        if wanted:
            self._reference = samples
            self._inferred += 1
            self._last_wanted_ns = t_ns
        return wanted

    def counts(self) -> dict[str, int]:
        """``{"seen": n, "inferred": n, "gated": n}`` so far (seen = inferred + gated)."""
        return {"seen": self._seen, "inferred": self._inferred, "gated": self._seen - self._inferred}

    def _still_reason(self, t_ns: int) -> str:
        """``refresh`` when a still frame is due anyway, else ``still``."""
        last = self._last_wanted_ns
        if not self._refresh_ns or last is None:
            return "still"
        return "refresh" if t_ns - last >= self._refresh_ns or t_ns < last else "still"

    def _samples(self, array: np.ndarray) -> tuple[_SampleGrid, np.ndarray]:
        """The grid for ``array``'s shape and its grey samples; a new frame size starts afresh."""
        shape = _checked_shape(array)
        grid = self._grid
        if grid is None or shape != grid.shape:
            # a new size (a reconnected camera, a different clip) cannot be compared with the old background
            grid = self._grid = _SampleGrid(shape, self.width)
            self._background = self._previous = self._reference = None
        return grid, grid.samples(array)


def motion_gated(frames: Iterable[Frame], gate: MotionGate) -> Iterator[Frame]:
    """The frames of ``frames`` that ``gate`` wants, in order; the others are only counted
    (``gate.counts()``). Lazy: a frame is pulled from ``frames`` only when the next one is asked for.

    Args:
        frames: a camera source or any iterable of :class:`~edgekit.camera.base.Frame`.
        gate: the :class:`MotionGate` that decides (and keeps the counts).

    Returns:
        An iterator of the wanted frames.
    """
    for frame in frames:
        if gate.wants(frame):
            yield frame


def motion_gate_from(options: Mapping[str, Any], *, text: bool = True) -> MotionGate:
    """A :class:`MotionGate` from option names and values (a ``[camera]`` table, command-line
    ``KEY=VALUE`` pairs); a missing key or a None value takes the option's default.

    Args:
        options: keys from :data:`MOTION_OPTIONS` (``threshold``, ``min_area``, ``refresh_s``,
            ``width``, ``alpha``).
        text: numbers may arrive as text (``"30"``), as from a command line; pass False for a typed
            source (TOML, JSON), where ``threshold = "30"`` is then refused.

    Returns:
        A new gate.

    Raises:
        UsageError: an unknown key (an UnknownOptionError, with a did-you-mean) or a bad value.
    """
    declared = by_name(MOTION_OPTIONS)
    unknown = sorted(map(str, set(options) - set(declared)))
    if unknown:
        key = unknown[0]
        fix = did_you_mean(key, declared)
        raise UnknownOptionError(f"no motion option {key!r}", fix if fix.startswith("did you mean")
                                 else f"motion options: {', '.join(declared)}", key=key)
    values = {key: _checked(declared[key], value, text) for key, value in options.items() if value is not None}
    return MotionGate(**values)


def _checked(option: Option, value: Any, text: bool) -> Any:
    """``value`` coerced and range-checked by ``option``; UsageError ``motion NAME must be ...``."""
    try:
        out = option.coerce(value, text)
    except OptionValueError as exc:
        raise UsageError(f"motion {option.name} must be {exc.what}, not {value!r}",
                         f"{option.help}, e.g. {option.name}={option.default:g}") from None
    return option.default if out is None else out


def _changed_fraction(grid: _SampleGrid, samples: np.ndarray, compared: tuple[np.ndarray, ...],
                      threshold: int) -> float:
    """The fraction of blocks whose samples differ, on average, by more than ``threshold`` from any
    of ``compared``: the background (what moves now), the previous frame (a sudden change the
    background has half absorbed when alpha is large) and the last wanted frame (a slow change the
    background absorbs as it happens, so that a gated frame never strays far from an inferred one)."""
    limit = threshold * grid.per_block  # compare sums: one multiply fewer per block
    changed = np.zeros((grid.h, grid.w), bool)
    for other in compared:
        changed |= grid.block_sums(np.abs(samples - other)) > limit
    return float(np.count_nonzero(changed)) / changed.size


def _checked_shape(array: Any) -> tuple[int, ...]:
    shape = tuple(getattr(array, "shape", ()))
    if not (len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3, 4))) or 0 in shape:
        raise CameraError(f"motion gate: a frame of shape {shape} is not gray, BGR or BGRA",
                          "give uint8 frames shaped HxW, HxWx3 or HxWx4")
    return shape


class _SampleGrid:
    """Which pixels of a frame of one shape are read, and how they sum into blocks.

    The frame is cut into ``w x h`` blocks (``w = min(small_width, width)``, ``h`` by aspect); each
    block gives ``ky x kx`` samples at evenly spaced centres, so a block of any size (a 1920-wide
    frame's 30 pixels, a 500-wide frame's 7.8) costs the same and no edge is dropped. The indices
    are offset-major (every block's first sample, then every block's second, ...), so one offset's
    samples form a contiguous slab and a block sum is a few whole-array additions.
    """

    def __init__(self, shape: tuple[int, ...], small_width: int):
        self.shape = shape
        height, width = shape[:2]
        stride = shape[2] if len(shape) == 3 else 1
        self.channels = min(stride, 3)  # BGRA's alpha is never read
        self.w = min(small_width, width)
        self.h = max(1, min(height, round(height * self.w / width)))
        self.rows, self.ky = _axis_samples(height, self.h)
        cols, self.kx = _axis_samples(width, self.w)
        self.per_block = self.ky * self.kx
        # gathering whole BGR triplets from the flattened rows is ~2x faster than a take along axis 1
        self.flat_cols = (cols[:, None] * stride + np.arange(self.channels)).ravel()

    def samples(self, array: np.ndarray) -> np.ndarray:
        """The grey samples of ``array``, float32, shaped ``(ky * h, kx * w)``."""
        picked = array.take(self.rows, axis=0).reshape(self.rows.size, -1)[:, self.flat_cols]
        if self.channels == 3:
            return picked.reshape(self.rows.size, -1, 3) @ _BGR_TO_GREY
        return picked.astype(np.float32)

    def block_sums(self, values: np.ndarray) -> np.ndarray:
        """``values`` (shaped like :meth:`samples`) summed over each block: ``(h, w)``."""
        by_row_offset = values.reshape(self.ky, self.h * self.kx * self.w).sum(axis=0)
        return by_row_offset.reshape(self.h, self.kx, self.w).sum(axis=1)


def _axis_samples(size: int, blocks: int) -> tuple[np.ndarray, int]:
    """Offset-major sample indices along an axis of ``size`` pixels cut into ``blocks``, and samples per block."""
    step = size / blocks
    k = int(min(_SAMPLES, max(1, step)))
    centres = (np.arange(blocks)[None, :] + (np.arange(k)[:, None] + 0.5) / k) * step
    return np.minimum(centres.astype(np.intp).ravel(), size - 1), k
