"""Where ``edgekit run --save`` puts the frames it drew on: a folder of JPEGs or one video.

Nothing is left half-written. A folder is filled under a temporary name beside it and
renamed into place when the run ends; a video is written to a temporary file (its extension
kept, OpenCV picks the container by it) and renamed the same way. :meth:`Recording.abort`
(a write failed) removes the temporary name, so the target is either the whole recording
or absent (a folder that held an earlier recording keeps it).

Writes go through Python's file API, so a full disk or a folder that went away is an
``OSError`` here, never a silent ``False`` from ``cv2.imwrite``. A video's frame rate is
the source's when it states one, else measured on the first frames, else 10.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EXIT_USAGE, OutputError
from edgekit.util.quiet import import_cv2

log = logging.getLogger("edgekit.outputs.recording")

VIDEO_CODECS = {".mp4": "mp4v", ".avi": "MJPG"}  # FourCCs every OpenCV build with FFmpeg writes
H264_HINT = "pip install 'edgekit-vision[video]': PyAV, whose wheels carry FFmpeg with libx264"
"""OpenCV's pip wheels leave the GPL x264 encoder out ('avc1' does not open): an .mp4 from them
is MPEG-4 Part 2, which browsers do not play. PyAV, when installed, writes H.264 instead."""
FRAME_PATTERN = "frame_{:06d}.jpg"
MARKER = ".edgekit-save"
"""Left in a folder ``--save`` wrote, so the next run may replace it although its frames carry the
source images' names (a folder of other files is refused, never emptied)."""
JPEG_SUFFIXES = (".jpg", ".jpeg")
DEFAULT_FPS = 10.0
_PROBE_FRAMES = 10  # frames held back to measure the rate of a source that states none
_FIX = "give a folder or a .mp4/.avi path in a writable place with free space"


class SaveError(OutputError):
    """The recording could not be written (unwritable place, full disk, codec missing): exit 1."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message, hint or _FIX)


class SaveTargetError(SaveError):
    """A --save target that cannot be a recording (a suffix edgekit does not write, a folder of
    other files): input the user must fix, exit 2."""

    exit_code = EXIT_USAGE


def open_recording(target: str | Path, fps: float | None = None, quality: int = 90) -> Recording:
    """A :class:`FolderRecording` for a folder, a :class:`VideoRecording` for ``*.mp4``/``*.avi``.

    The place is checked now (before any model runs): SaveError when it cannot be written.
    ``fps`` is the source's nominal rate (videos; None: measured).
    """
    path = Path(target)
    if path.suffix.lower() in VIDEO_CODECS:
        return VideoRecording(path, fps)
    if path.suffix and not path.is_dir():
        raise SaveTargetError(f"--save {target}: {path.suffix} is not a video format edgekit writes",
                              "give a folder (one JPEG per frame) or a path ending in .mp4 or .avi")
    return FolderRecording(path, quality)


class Recording:
    """A recording being written: :meth:`write` per frame, then :meth:`finish` or :meth:`abort`.

    ``fps`` is the frame rate a video is written at (None until known; a folder ignores it).
    """

    fps: float | None = None

    def __init__(self, path: Path):
        self.path = path
        self.frames = 0
        self.done = False

    def write(self, image: np.ndarray, t_ns: int | None = None, name: str | None = None) -> None:
        """Add one BGR frame (``t_ns``: its capture time, used to measure a video's rate; ``name``:
        the source image's file, whose name a folder recording keeps)."""
        raise NotImplementedError

    def finish(self) -> Path:
        """Complete the recording and move it to its name; returns that path."""
        raise NotImplementedError

    def abort(self) -> None:
        """Remove what was written (idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.done:
            self.finish()


class FolderRecording(Recording):
    """One JPEG per frame, filled under a temporary folder: named as the source image it was drawn
    on (``000.jpg``; ``000.png`` becomes ``000.jpg``; a name already written gets ``-2``, ``-3``...,
    so a folder read twice, or two images of one stem, never overwrite each other), or
    ``frame_000001.jpg`` on for frames of a video or camera."""

    def __init__(self, path: Path, quality: int = 90):
        super().__init__(path)
        if path.exists() and not path.is_dir():
            raise SaveTargetError(f"--save {path}: exists and is not a folder")
        if path.is_dir() and not (path / MARKER).is_file() and any(not _is_frame(p) for p in path.iterdir()):
            raise SaveTargetError(f"--save {path}: the folder holds other files than frames",
                                  "give a new or empty folder (an earlier recording's frames are replaced)")
        self.quality = int(quality)
        self._cv2 = import_cv2("--save")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
            (self._tmp / MARKER).write_text("frames drawn by edgekit run --save\n", encoding="utf-8")
        except OSError as exc:
            raise SaveError(f"--save {path}: cannot write there: {exc.strerror or exc}") from exc
        self._names: set[str] = {MARKER}  # lower case: 'A.jpg' and 'a.jpg' are one file on some disks

    def write(self, image: np.ndarray, t_ns: int | None = None, name: str | None = None) -> None:
        ok, data = self._cv2.imencode(".jpg", image, [self._cv2.IMWRITE_JPEG_QUALITY, self.quality])
        if not ok:
            raise SaveError(f"--save {self.path}: OpenCV could not encode frame {self.frames + 1} as JPEG")
        path = self._tmp / self._file_name(name)
        try:
            _write_bytes(path, data.tobytes(), self.path)
        except BaseException:  # Ctrl-C/SIGTERM mid-write too: the recording finishes without a torn frame
            path.unlink(missing_ok=True)
            raise
        self.frames += 1

    def _file_name(self, name: str | None) -> str:
        """The source image's name as a JPEG, never one this recording already wrote."""
        base = Path(name).name if name else ""
        stem, suffix = Path(base).stem, Path(base).suffix
        if not stem:
            stem, suffix = FRAME_PATTERN.format(self.frames + 1)[:-4], ".jpg"
        suffix = suffix if suffix.lower() in JPEG_SUFFIXES else ".jpg"
        candidate, n = stem + suffix, 2
        while candidate.lower() in self._names:
            candidate, n = f"{stem}-{n}{suffix}", n + 1
        self._names.add(candidate.lower())
        return candidate

    def finish(self) -> Path:
        if self.done:
            return self.path
        self.done = True
        old = None
        try:
            if self.path.is_dir():
                # an earlier recording (checked: frames only) steps aside, then goes
                old = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", suffix=".old", dir=self.path.parent))
                os.replace(self.path, old / "frames")
            _share(self._tmp)
            os.replace(self._tmp, self.path)
        except OSError as exc:
            self.abort()
            raise SaveError(f"--save {self.path}: cannot move the frames into place: {exc.strerror or exc}") from exc
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        return self.path

    def abort(self) -> None:
        self.done = True
        shutil.rmtree(self._tmp, ignore_errors=True)


class VideoRecording(Recording):
    """One video file (``.mp4``: H.264 through PyAV when it is installed, else MPEG-4 part 2
    through OpenCV with a warning; ``.avi``: Motion JPEG), all frames at the first's size."""

    def __init__(self, path: Path, fps: float | None = None):
        super().__init__(path)
        if path.is_dir():
            raise SaveTargetError(f"--save {path}: is a folder, not a video file")
        self.fps = float(fps) if fps and 0 < fps < 1000 else None
        self._cv2 = import_cv2("--save")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".partial{path.suffix}", dir=path.parent)
            os.close(fd)
        except OSError as exc:
            raise SaveError(f"--save {path}: cannot write there: {exc.strerror or exc}") from exc
        self._tmp = Path(name)
        self._writer: Any = None
        self._size: tuple[int, int] | None = None
        self._held: list[tuple[np.ndarray, int | None]] = []

    def write(self, image: np.ndarray, t_ns: int | None = None, name: str | None = None) -> None:
        self.frames += 1
        if self._writer is None:
            self._held.append((image, t_ns))
            if self.fps is None and len(self._held) < _PROBE_FRAMES:
                return  # measure the rate on a few frames before the writer must be told it
            self._open()
            return
        self._put(image)

    def _open(self) -> None:
        # two decimals: MPEG-4 refuses a time base over 65535 (a measured 95.917 fps is 95917/1000 and the
        # writer would not open; 95.92 is 2398/25), and no player needs a finer rate
        fps = round(self.fps or _measured_fps([t for _, t in self._held]) or DEFAULT_FPS, 2)
        h, w = self._held[0][0].shape[:2]
        self._size = (w, h)
        cv2 = self._cv2
        h264 = _h264_writer(self._tmp, fps, self._size, self.path) if self.path.suffix.lower() == ".mp4" else None
        if h264 is None and self.path.suffix.lower() == ".mp4":
            log.warning("--save %s: written as MPEG-4 Part 2, which browsers do not play (%s)", self.path.name,
                        H264_HINT)
        self._writer = h264 or cv2.VideoWriter(
            str(self._tmp), cv2.VideoWriter_fourcc(*VIDEO_CODECS[self.path.suffix.lower()]), fps, self._size)
        if not self._writer.isOpened():
            raise SaveError(f"--save {self.path}: OpenCV cannot write {self.path.suffix} video here",
                            "install an OpenCV build with FFmpeg (opencv-python-headless), or save to a folder")
        self.fps = fps
        self.codec = "h264" if h264 else VIDEO_CODECS[self.path.suffix.lower()]
        held, self._held = self._held, []
        for image, _ in held:
            self._put(image)

    def _put(self, image: np.ndarray) -> None:
        if (image.shape[1], image.shape[0]) != self._size:  # a video keeps one frame size
            image = self._cv2.resize(image, self._size, interpolation=self._cv2.INTER_AREA)
        self._writer.write(image)

    def finish(self) -> Path:
        if self.done:
            return self.path
        if self._writer is None and self._held:
            self._open()
        self.done = True
        if self._writer is not None:
            self._writer.release()
        # VideoWriter.write reports nothing: a full disk shows as a missing or empty file, or as
        # an .mp4 cut off before its index (moov atom) that no player opens
        if self.frames == 0 or not self._tmp.is_file() or self._tmp.stat().st_size == 0:
            self.abort()
            raise SaveError(f"--save {self.path}: no video was written"
                            + ("" if self.frames else " (no frames)"))
        readable = self._readable_frames()
        if readable < self.frames:
            self.abort()
            raise SaveError(f"--save {self.path}: the video was cut short ({readable} of {self.frames} frames "
                            "readable; is the disk full?)")
        try:
            _share(self._tmp)
            os.replace(self._tmp, self.path)
        except OSError as exc:
            self.abort()
            raise SaveError(f"--save {self.path}: cannot move the video into place: {exc.strerror or exc}") from exc
        return self.path

    def _readable_frames(self) -> int:
        """How many frames the written file says it holds (0: OpenCV cannot open it)."""
        import logging

        from edgekit.util.quiet import native_stderr_to_log

        cv2 = self._cv2
        with native_stderr_to_log(logging.getLogger("edgekit.outputs.recording")):  # FFmpeg's "moov atom not found"
            cap = cv2.VideoCapture(str(self._tmp))
            try:
                return int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) if cap.isOpened() else 0
            finally:
                cap.release()

    def abort(self) -> None:
        self.done = True
        if self._writer is not None:
            self._writer.release()
        self._tmp.unlink(missing_ok=True)


class _H264Writer:
    """cv2.VideoWriter's three calls over PyAV's libx264 (yuv420p, which every browser plays;
    odd sides are padded by one edge pixel, as 4:2:0 needs even ones)."""

    def __init__(self, av: Any, path: Path, fps: float, size: tuple[int, int], target: Path):
        from fractions import Fraction

        self._av, self._target = av, target
        self._container = av.open(str(path), "w", format="mp4")
        self._stream = self._container.add_stream("libx264", rate=Fraction(round(fps * 1000), 1000))
        self._stream.width, self._stream.height = size[0] + size[0] % 2, size[1] + size[1] % 2
        self._stream.pix_fmt = "yuv420p"
        self._stream.options = {"crf": "23", "preset": "veryfast"}

    def isOpened(self) -> bool:  # noqa: N802  (cv2.VideoWriter's name)
        return True

    def write(self, image: np.ndarray) -> None:
        pad = ((0, self._stream.height - image.shape[0]), (0, self._stream.width - image.shape[1]), (0, 0))
        image = np.pad(image, pad, mode="edge") if any(p[1] for p in pad) else image
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="bgr24")
        try:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        except OSError as exc:  # a full disk: PyAV raises where OpenCV's writer says nothing
            self._failed(exc)

    def release(self) -> None:
        if self._container is None:
            return
        container, self._container = self._container, None
        try:
            for packet in self._stream.encode():  # flush the encoder's delayed frames
                container.mux(packet)
        except OSError as exc:
            self._failed(exc, container)
        finally:
            with contextlib.suppress(OSError):
                container.close()

    def _failed(self, exc: OSError, container: Any = None) -> None:
        with contextlib.suppress(OSError):
            (container or self._container).close()
        self._container = None
        raise SaveError(f"--save {self._target}: cannot write the video: {exc.strerror or exc}")


def _h264_writer(path: Path, fps: float, size: tuple[int, int], target: Path) -> _H264Writer | None:
    """An H.264 writer into ``path`` (``target``'s temporary name) when PyAV with libx264 is
    installed, else None."""
    try:
        import av
    except ImportError:
        return None
    if "libx264" not in av.codecs_available:
        return None
    try:
        return _H264Writer(av, path, fps, size, target)
    except (OSError, ValueError, av.FFmpegError) as exc:
        log.warning("--save %s: PyAV cannot write H.264 here (%s); falling back to OpenCV", target.name, exc)
        return None


def _share(path: Path) -> None:
    """Give a temporary file or folder the mode a plain open()/mkdir() would have: mkstemp and
    mkdtemp make them private (0600/0700), which a recording meant for others must not keep."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _is_frame(path: Path) -> bool:
    return path.is_file() and path.name.startswith("frame_") and path.suffix == ".jpg"


def _write_bytes(path: Path, data: bytes, target: Path) -> None:
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise SaveError(f"--save {target}: cannot write {path.name}: {exc.strerror or exc}") from exc


def _measured_fps(times_ns: list[int | None]) -> float | None:
    """(n-1)/span of the capture times, when that is a plausible video rate (1..120 fps)."""
    t = [v for v in times_ns if v is not None]
    if len(t) < 2 or t[-1] <= t[0]:
        return None
    fps = (len(t) - 1) * 1e9 / (t[-1] - t[0])
    return round(fps, 3) if 1.0 <= fps <= 120.0 else None
