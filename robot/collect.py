"""Collect sign images from Vector's camera: press a label's key to save the current frame.

    python -m robot.collect --serial 00e20100 --out data/signs
    python -m robot.collect --serial 00e20100 --out data/signs --labels a,b,c,background --rotate-augment
    python -m robot.collect --fake frames/ --out data/try < keys.txt          # keys from a pipe

Each key press saves the centre crop of the newest frame (gray, 200x200 by default, as the
seed's demo sees it) to ``OUT/<label>/<label>_<n>.png``: the ImageFolder layout that
``robot.train`` and ``edgekit build`` read. Existing files are never overwritten;
numbering continues. Keys: a single-character label is its own key; longer labels
("background") take their first free character, else a digit. Esc, Ctrl-C or Ctrl-D
(end of input) stops.

Keys come from a :class:`KeySource`; the terminal one puts the tty in cbreak mode, any
other stdin (a pipe, a file) is read character by character, and tests pass
:class:`ScriptedKeys`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import string
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import cv2
import numpy as np

from edgekit.errors import EdgekitError, UsageError, print_error
from edgekit.imaging.image import convert_colour, crop_center
from robot.cli import add_json, emit_json, parse, script_parser

SEED_LABELS = [*string.ascii_lowercase, "background"]
ROTATIONS = (-10.0, -5.0, 5.0, 10.0)  # degrees; small turns of the hand, as the seed augments
STOP_KEYS = {"\x1b", "\x03", "\x04"}  # Esc, Ctrl-C, Ctrl-D


class KeySource(Protocol):
    """Where key presses come from."""

    def read_key(self, timeout_s: float) -> str | None:
        """The next key, None when none arrived within ``timeout_s``, "" at end of input."""
        ...


class ScriptedKeys:
    """Keys from a sequence, one per call (None entries mean "no key this time"); "" after the end."""

    def __init__(self, keys: Iterable[str | None]):
        self._keys = iter(keys)

    def read_key(self, timeout_s: float) -> str | None:
        """The next scripted key; "" once the script is used up."""
        return next(self._keys, "")


class StreamKeys:
    """Keys read one character at a time from a text stream (a pipe or file on stdin)."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def read_key(self, timeout_s: float) -> str | None:
        """See :meth:`KeySource.read_key`."""
        fd = _fileno(self._stream)
        if fd is not None:
            ready, _, _ = select.select([fd], [], [], timeout_s)
            if not ready:
                return None
        return self._stream.read(1)


class TerminalKeys:
    """Single key presses from a terminal (cbreak mode: no Enter needed, no echo).

    A context manager; the terminal is restored on exit, also after an exception.
    """

    def __init__(self, stream: TextIO | None = None):
        self._stream = stream or sys.stdin
        self._saved: Any = None

    def __enter__(self) -> TerminalKeys:
        import termios
        import tty

        fd = self._stream.fileno()
        self._saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        import termios

        if self._saved is not None:
            termios.tcsetattr(self._stream.fileno(), termios.TCSADRAIN, self._saved)

    def read_key(self, timeout_s: float) -> str | None:
        """See :meth:`KeySource.read_key`."""
        fd = self._stream.fileno()
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            return None
        return os.read(fd, 1).decode("utf-8", errors="replace")


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def assign_keys(labels: Sequence[str]) -> dict[str, str]:
    """Key -> label: single-character labels are their own key; longer ones take their first
    character not yet used, else the first free digit."""
    keys: dict[str, str] = {}
    for label in labels:
        if len(label) == 1:
            if label in keys:
                raise UsageError(f"label {label!r} given twice")
            keys[label] = label
    for label in labels:
        if len(label) == 1:
            continue
        free = [c for c in label.lower() + "0123456789" if c not in keys and c.isprintable() and c not in STOP_KEYS]
        if not free:
            raise UsageError(f"no free key for label {label!r}", "use fewer labels or single-character ones")
        keys[free[0]] = label
    return keys


def crop_for_dataset(frame: np.ndarray, crop: int, colour: str = "gray") -> np.ndarray:
    """The seed's view of a frame: a centred ``crop x crop`` window, gray by default."""
    if not 0 < crop <= min(frame.shape[:2]):
        raise UsageError(f"--crop {crop} does not fit a {frame.shape[1]}x{frame.shape[0]} frame",
                         f"use 1..{min(frame.shape[:2])} (the seed used 200 on Vector's 640x360)")
    window = crop_center(frame, (crop, crop))
    return np.ascontiguousarray(convert_colour(window, "gray" if colour == "gray" else "bgr"))


def rotations(image: np.ndarray, angles: Sequence[float] = ROTATIONS) -> list[tuple[float, np.ndarray]]:
    """The image turned about its centre by each angle; borders reflect, so no black corners
    teach the model that rotated hands come with black triangles."""
    h, w = image.shape[:2]
    out = []
    for angle in angles:
        m = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 1.0)
        out.append((angle, cv2.warpAffine(image, m, (w, h), borderMode=cv2.BORDER_REFLECT_101)))
    return out


class DatasetWriter:
    """Saves images as ``OUT/<label>/<label>_<n>.png`` with n continuing after existing files."""

    _NUMBER = re.compile(r"_(\d+)(?:_r-?[\d.]+)?\.png$")

    def __init__(self, out: str | Path, labels: Sequence[str]):
        self.out = Path(out)
        self._next: dict[str, int] = {}
        for label in labels:
            d = self.out / label
            numbers = [int(m.group(1)) for p in d.glob("*.png") if (m := self._NUMBER.search(p.name))]
            self._next[label] = max(numbers, default=-1) + 1

    def save(self, label: str, image: np.ndarray, augment: bool = False) -> list[Path]:
        """Write one image (plus rotated copies with ``augment``); returns the paths written."""
        d = self.out / label
        d.mkdir(parents=True, exist_ok=True)
        n = self._next[label]
        self._next[label] = n + 1
        items = [(f"{label}_{n}.png", image)]
        if augment:
            items += [(f"{label}_{n}_r{angle:g}.png", img) for angle, img in rotations(image)]
        paths = []
        for name, img in items:
            path = d / name
            if not cv2.imwrite(str(path), img):
                raise UsageError(f"cannot write {path}", "check the --out directory is writable")
            paths.append(path)
        return paths


def collect(
    source: Any,
    keys: KeySource,
    out: str | Path,
    labels: Sequence[str] = SEED_LABELS,
    crop: int = 200,
    colour: str = "gray",
    augment: bool = False,
    log: TextIO | None = None,
    key_timeout_s: float = 0.0,
) -> Counter:
    """Save a crop of the newest frame for every key press until a stop key or end of input.

    Keys are polled between frames (``key_timeout_s`` each, 0 = do not wait), so the image
    saved is the one the camera showed when the key was read. Returns images saved per
    label (originals, not augmented copies). The caller closes ``source``.
    """
    keymap = assign_keys(labels)
    writer = DatasetWriter(out, labels)
    saved: Counter = Counter()
    if log is not None:
        listing = "  ".join(f"{k if k != ' ' else 'space'}={v}" for k, v in keymap.items() if len(v) > 1)
        print(f"keys: each letter saves that label; {listing}; Esc or Ctrl-D stops", file=log, flush=True)
    for frame in source:
        key = keys.read_key(key_timeout_s)
        if key is None:
            continue
        if key == "" or key in STOP_KEYS:
            break
        label = keymap.get(key)
        if label is None:
            continue  # a stray key (newline from a pipe, a typo): ignore it
        paths = writer.save(label, crop_for_dataset(frame.array, crop, colour), augment)
        saved[label] += 1
        if log is not None:
            print(f"{label}: {saved[label]} saved ({paths[0]})", file=log, flush=True)
    return saved


EXAMPLES = [
    "python -m robot.collect --serial 00e20100 --out data/signs",
    "python -m robot.collect --camera v4l2:0 --out data/signs --labels a,b,c,background --json",
]
"""Real command lines, shown at the end of --help (tests/test_cli_grammar.py parses each)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m robot.collect`` argument parser."""
    p = script_parser("collect", __doc__, EXAMPLES)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--serial", help="the robot's serial")
    src.add_argument("--fake", metavar="FRAMES", help="a loopback FakeVector showing this folder or video")
    src.add_argument("--camera", metavar="URI", help="any edgekit camera (v4l2:0, file:clip.mp4, ...)")
    p.add_argument("--out", required=True, help="dataset directory (ImageFolder layout)")
    p.add_argument("--labels", help="comma-separated labels (default: a-z and background, the seed's 27)")
    p.add_argument("--crop", type=int, default=200, help="side of the centred square saved (default 200)")
    p.add_argument("--colour", choices=["gray", "bgr"], default="gray", help="saved colour (default gray)")
    p.add_argument("--rotate-augment", action="store_true",
                   help=f"also save copies rotated by {', '.join(f'{a:g}' for a in ROTATIONS)} degrees")
    p.add_argument("--fps", type=float, default=15.0, help="FakeVector frame rate (--fake)")
    add_json(p, "the count saved per label")
    return p


def main(argv: Sequence[str] | None = None, keys: KeySource | None = None, log: TextIO | None = None) -> int:
    """Entry point; ``keys`` replaces the terminal/stdin key reader (tests)."""
    args = parse(build_parser(), argv)
    log = log or sys.stderr
    labels = [s.strip() for s in args.labels.split(",") if s.strip()] if args.labels else SEED_LABELS
    try:
        with contextlib.ExitStack() as stack:
            source = _open_source(args, stack)
            if keys is None:
                keys = stack.enter_context(TerminalKeys()) if sys.stdin.isatty() else StreamKeys(sys.stdin)
            timeout = 0.0 if not sys.stdin.isatty() else 0.01
            saved = collect(source, keys, args.out, labels, args.crop, args.colour, args.rotate_augment,
                            log=log, key_timeout_s=timeout)
    except EdgekitError as exc:
        return print_error("robot.collect", exc)
    except KeyboardInterrupt:
        return 130
    total = sum(saved.values())
    emit_json(args, {"out": str(args.out), "saved": dict(sorted(saved.items())), "total": total})
    print(f"saved {total} images to {args.out}: " + ", ".join(f"{k} {v}" for k, v in sorted(saved.items())),
          file=log)
    return 0


def _open_source(args: argparse.Namespace, stack: contextlib.ExitStack) -> Any:
    if args.camera:
        from edgekit.camera import open_camera

        source = open_camera(args.camera)
    else:
        from edgekit.vector.camera import VectorSource

        serial, home = args.serial, None
        if args.fake:
            from edgekit.vector.fake import FakeVector

            fake = stack.enter_context(FakeVector(args.fake, fps=args.fps))
            serial, home = fake.serial, fake.home
        # with behaviour control Vector holds still, so the camera stays pointed at the signer
        source = VectorSource(serial, config_home=home)
    stack.callback(source.close)
    return source


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
