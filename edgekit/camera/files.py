"""Sources read on the consumer's thread: video files and image folders, and the
:class:`SequenceSource` clock they (and the synthetic pattern) share.

When paced, frame ``k`` is "captured" at ``start + k / fps``, and frames whose time has
already passed are skipped (not decoded), so a slow consumer gets the newest frame.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgekit.camera.base import Frame, SourceBase
from edgekit.errors import CameraError, CameraUnavailable
from edgekit.imaging.image import IMAGE_SUFFIXES, ImageReadError, read_image, require_image_decoder

VIDEO_SUFFIXES = (
    ".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".mjpeg", ".mjpg",
    ".ts", ".wmv", ".flv", ".h264", ".264", ".y4m",
)  # fmt: skip


class EndOfStream(Exception):
    """Raised by a reader that has no more frames in this pass."""


class _Reader(Protocol):
    """Frames in order: ``read()`` -> array, or None for an unreadable frame;
    ``skip()`` -> advance one frame without decoding (False if it failed);
    both raise EndOfStream at the end; ``rewind()`` starts the next pass. ``frame_source``,
    when a reader has it, names the frame ``read()`` returned last (an image's path)."""

    def read(self) -> np.ndarray | None: ...

    def skip(self) -> bool: ...

    def rewind(self) -> None: ...

    def release(self) -> None: ...


class SequenceSource(SourceBase):
    """Frames from a :class:`_Reader`, either as fast as the consumer asks (``pace=False``)
    or paced to ``fps`` with newest-frame semantics (``pace=True``).

    Paced, frame ``k`` is due at ``start + k/fps`` (``start`` = the first ``next()``), and
    its ``t_capture_ns`` is that due time, so latency measured from capture includes the
    time a frame waited, as with a live camera. A consumer ahead of the clock sleeps until
    the next frame is due; one behind it gets the newest due frame, and the frames it
    overtook are skipped without decoding and counted. ``index`` is the frame's position in
    the timeline (the file's frame number on the first pass; it keeps counting across loops).
    Unreadable frames are counted in ``read_errors`` and skipped. Without ``loop`` the
    iteration ends normally at the end of the sequence.
    """

    kind = "sequence"

    def __init__(self, reader: _Reader, *, name: str, fps: float | None, pace: bool, loop: bool):
        super().__init__(name)
        if pace and not (fps and fps > 0):
            reader.release()
            raise CameraError(f"{name}: pacing needs a frame rate", "pass fps=, or pace=False")
        self._reader = reader
        self._pace = bool(pace)
        self._loop = bool(loop)
        self._fps = float(fps) if fps else None
        self._t0_ns: int | None = None
        self._k = 0  # timeline index of the frame the reader produces next
        self._pass_frames = self._pass_reads = self._pass_good = 0
        self._lock = threading.RLock()  # reentrant: reaching the end closes from inside a read
        self._wake = threading.Event()
        self._released = False
        self._info.update({"nominal_fps": self._fps, "paced": self._pace, "loop": self._loop})

    def _due_ns(self, k: int) -> int:
        return self._t0_ns + int(k * 1e9 / self._fps)

    def __next__(self) -> Frame:
        while True:
            if self._pace:
                self._wait_until_due()
            # The lock only guards reader calls, so close() from another thread (a signal
            # handler, a daemon's stop) waits for at most one decode, never for a paced wait.
            with self._lock:
                if self._closed:
                    raise StopIteration
                if self._pace:
                    self._skip_passed()
                k = self._k
                array = self._advance(self._reader.read)
                self._pass_reads += 1
                if array is None:
                    self._counters.add(read_errors=1)
                    continue
                self._pass_good += 1
            t_ns = self._due_ns(k) if self._pace else time.perf_counter_ns()
            self._counters.on_capture(t_ns)
            self._counters.add(delivered=1)
            self._info.setdefault("size", (int(array.shape[1]), int(array.shape[0])))
            return Frame(array, t_ns, k, getattr(self._reader, "frame_source", None) or self.name)

    def _wait_until_due(self) -> None:
        """A consumer ahead of the clock waits for the next frame's time (close() wakes it)."""
        now = time.perf_counter_ns()
        if self._t0_ns is None:
            self._t0_ns = now - int(self._k * 1e9 / self._fps)
        due = self._due_ns(self._k)
        if due > now:
            self._wake.wait((due - now) / 1e9)

    def _skip_passed(self) -> None:
        """A consumer behind the clock skips, without decoding, the frames it overtook."""
        newest = int((time.perf_counter_ns() - self._t0_ns) * self._fps // 1e9)
        while self._k < newest:
            k = self._k
            if self._advance(self._reader.skip):
                self._counters.on_capture(self._due_ns(k))
                self._counters.add(skipped=1)
            else:
                self._counters.add(read_errors=1)

    def _advance(self, step: Callable[[], Any]) -> Any:
        while True:
            try:
                result = step()
            except EndOfStream:
                self._end_of_pass()
                continue
            self._k += 1
            self._pass_frames += 1
            return result

    def _end_of_pass(self) -> None:
        if not self._loop:
            self.close()
            counts = self._counters.snapshot()
            if counts["captured"] == 0 and counts["read_errors"]:
                raise CameraError(f"{self.name}: no readable frame", "check the file or folder")
            raise StopIteration
        if self._pass_frames == 0:
            self.close()
            raise CameraError(f"{self.name}: has no frames", "check the file or folder")
        if self._pass_reads and not self._pass_good:
            # Without this, looping over a sequence of only corrupt frames would spin forever.
            self.close()
            raise CameraError(f"{self.name}: no readable frame in a whole pass", "check the file or folder")
        self._pass_frames = self._pass_reads = self._pass_good = 0
        self._reader.rewind()

    def close(self) -> None:
        """Release the file; safe from another thread (it ends a paced wait at once)."""
        self._closed = True
        self._wake.set()
        with self._lock:
            if not self._released:
                self._released = True
                self._reader.release()


class _VideoFileReader:
    """A video file through OpenCV's FFMPEG backend."""

    MAX_FAILURES = 3  # consecutive failed reads before a shortened (truncated) file counts as ended

    def __init__(self, path: Path):
        from edgekit.util.quiet import import_cv2

        self.path = path
        self.frame_source = str(path)  # every frame of a clip: its path (the index says which)
        self._cv2 = cv2 = import_cv2(f"reading the video {path.name}")
        self._cap = self._open()
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        self.fps = float(fps) if fps and np.isfinite(fps) and 0 < fps < 1000 else None
        self.frame_count = max(int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0), 0)
        self._pos = 0
        self._failures = 0

    def _open(self) -> Any:
        import logging

        from edgekit.util.quiet import native_stderr_to_log

        cv2 = self._cv2
        # FFmpeg prints "[mov,mp4,...] moov atom not found" to fd 2 beside our own one-line error
        with native_stderr_to_log(logging.getLogger("edgekit.camera")):
            cap = cv2.VideoCapture(str(self.path), cv2.CAP_FFMPEG)
        if not cap.isOpened():
            cap.release()
            raise CameraError(
                f"{self.path}: not a video OpenCV can read",
                "check the file; OpenCV's FFMPEG reads mp4v/MJPG/FFV1, e.g. re-encode with "
                "`ffmpeg -i IN -c:v mjpeg OUT.avi`",
            )
        return cap

    def _after(self, ok: bool) -> bool:
        if ok:
            self._pos += 1
            self._failures = 0
            return True
        # A failed read before the container's frame count is a bad frame; after it (or a
        # few failures in a row: a truncated file) it is the end. Decoders conceal most
        # damaged packets themselves, so this catches what they cannot.
        if self._pos < self.frame_count and self._failures < self.MAX_FAILURES:
            self._pos += 1
            self._failures += 1
            return False
        raise EndOfStream

    def read(self) -> np.ndarray | None:
        try:
            ok, array = self._cap.read()
        except self._cv2.error:
            ok, array = False, None
        ok = ok and array is not None and array.size > 0
        return array if self._after(ok) else None

    def skip(self) -> bool:
        try:
            ok = self._cap.grab()  # demux only: skipping must be cheaper than decoding
        except self._cv2.error:
            ok = False
        return self._after(ok)

    def rewind(self) -> None:
        # Reopen rather than seek: seeking to frame 0 is not exact for every codec/container.
        self._cap.release()
        self._cap = self._open()
        self._pos = self._failures = 0

    def release(self) -> None:
        self._cap.release()


class VideoFileSource(SequenceSource):
    """A video clip, paced to its frame rate by default (``pace=False``: as fast as it
    decodes; ``loop=True``: start again at the end; ``fps=`` overrides the file's rate).

    Raises CameraError when the file is missing or not decodable.
    """

    kind = "file"

    def __init__(self, path: str | Path, *, pace: bool = True, loop: bool = False, fps: float | None = None):
        p = Path(path)
        if not p.is_file():
            raise CameraError(f"{path}: no such video file", "check the path")
        reader = _VideoFileReader(p)
        rate = fps or reader.fps
        if pace and not rate:
            reader.release()
            raise CameraError(f"{path}: the file does not state its frame rate", "pass fps=, or pace=False")
        super().__init__(reader, name=f"file:{path}", fps=rate, pace=pace, loop=loop)
        self._info["frame_count"] = reader.frame_count


def _natural_key(path: Path) -> list:
    # frame_2.png before frame_10.png
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", path.name)]


class _FolderReader:
    def __init__(self, paths: list[Path]):
        self.paths = paths
        self._pos = 0
        self.frame_source: str | None = None  # the image read last, as the folder was given: eval/x/000.jpg

    def _next_path(self) -> Path:
        if self._pos >= len(self.paths):
            raise EndOfStream
        self._pos += 1
        return self.paths[self._pos - 1]

    def read(self) -> np.ndarray | None:
        path = self._next_path()
        self.frame_source = str(path)
        try:
            return read_image(path)
        except (ImageReadError, OSError):
            if not path.parent.is_dir():  # the folder went away mid-run: not one bad image, the end of the source
                raise CameraUnavailable(
                    f"folder {path.parent} disappeared while its images were being read",
                    "check the disk or mount, and that nothing moves the folder during a run",
                ) from None
            return None

    def skip(self) -> bool:
        self._next_path()
        return True

    def rewind(self) -> None:
        self._pos = 0

    def release(self) -> None:
        pass


class ImageFolderSource(SequenceSource):
    """Images of a folder in natural name order (``img2`` before ``img10``), as fast as
    asked, or paced to ``fps=``; ``loop=True`` starts again. Unreadable images are counted
    as read errors and skipped. Raises CameraError for a missing or image-less folder."""

    kind = "folder"

    def __init__(self, directory: str | Path, *, fps: float | None = None, loop: bool = False):
        d = Path(directory)
        if not d.is_dir():
            raise CameraError(f"{directory}: no such folder", "check the path")
        paths = sorted((p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()), key=_natural_key)
        if not paths:
            raise CameraError(f"{directory}: no images", f"put {', '.join(IMAGE_SUFFIXES)} files in it")
        require_image_decoder(f"folder:{directory}")  # a [litert] install has neither: say so at open
        super().__init__(_FolderReader(paths), name=f"folder:{directory}", fps=fps, pace=bool(fps), loop=loop)
        self._info["frame_count"] = len(paths)


def open_video(path: str, **options: Any) -> VideoFileSource:
    """Open ``file:PATH`` (``file:///abs/path`` too) or a bare path with a video suffix."""
    path = path[2:] if path.startswith("//") else path
    if not path.strip():  # `file://`: no path at all (it said ": no such video file")
        raise CameraError("bad camera URI: file: names no file", "write file:PATH or file:///abs/path")
    return VideoFileSource(path, **options)
