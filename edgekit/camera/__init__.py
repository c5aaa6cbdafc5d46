"""Camera sources: iterators of :class:`Frame` with newest-frame semantics.

A slow consumer always gets the latest frame, never a stale queue.

Two mechanisms give that guarantee:

* live sources (USB/V4L2 cameras, RTSP/HTTP streams, picamera2) run a grabber thread
  (:class:`LatestFrameSource`) that reads as fast as the camera delivers and keeps only the
  newest frame; frames overtaken before anyone asked for them are skipped;
* clips, image folders and the synthetic pattern (:class:`SequenceSource`) are read on the
  consumer's thread against a virtual clock: when paced, frame ``k`` is "captured" at
  ``start + k / fps``, and frames whose time has already passed are skipped (not decoded)
  so the consumer again gets the newest one.

Use :func:`open_camera` with a URI; every source is an iterator, a context manager, and has
``close()`` and ``stats()``. Typical use::

    with open_camera("file:clip.mp4") as cam:
        for frame in cam:
            ...

Frames follow OpenCV's convention (uint8, B,G,R). The array in a :class:`Frame` belongs to
the consumer: no source writes into it after handing it out. Sources are not thread-safe:
iterate one from a single thread (the grabber thread is internal).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import cv2
import numpy as np

from edgekit.errors import CameraError, UsageError
from edgekit.image import IMAGE_SUFFIXES, ImageReadError, read_image


@dataclass(frozen=True)
class Frame:
    """One captured image (OpenCV convention: uint8, gray 2-D or HxWx3 BGR).

    ``t_capture_ns`` is ``time.perf_counter_ns()`` when the frame was captured (or arrived),
    ``index`` the source's running frame number (gaps mean frames were skipped).
    """

    array: np.ndarray
    t_capture_ns: int
    index: int


@runtime_checkable
class FrameSource(Protocol):
    """What every camera source provides."""

    def __iter__(self) -> Iterator[Frame]: ...

    def close(self) -> None: ...


VIDEO_SUFFIXES = (
    ".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".mjpeg", ".mjpg",
    ".ts", ".wmv", ".flv", ".h264", ".264", ".y4m",
)  # fmt: skip
STREAM_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://")
URI_FORMS = (
    "v4l2:N | N | rtsp://... | http(s)://... | file:PATH | PATH.mp4 | folder:DIR | DIR | "
    "picamera2[:N] | synthetic[:WxH[@FPS]] | vector:SERIAL"
)

DEFAULT_TIMEOUT_S = 5.0  # a live camera silent this long mid-run is reported as stopped
DEFAULT_OPEN_TIMEOUT_S = 10.0  # RTSP and USB cameras can take seconds to deliver the first frame


# ----------------------------------------------------------------------------------------------
# Common parts: counters, context manager
# ----------------------------------------------------------------------------------------------


class _Counters:
    """Frame counters shared by a grabber thread and its consumer (hence the lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.captured = self.delivered = self.skipped = self.read_errors = 0
        self._first_ns: int | None = None
        self._last_ns: int | None = None

    def on_capture(self, t_ns: int) -> None:
        with self._lock:
            self.captured += 1
            if self._first_ns is None:
                self._first_ns = t_ns
            self._last_ns = t_ns

    def add(self, *, delivered: int = 0, skipped: int = 0, read_errors: int = 0) -> None:
        with self._lock:
            self.delivered += delivered
            self.skipped += skipped
            self.read_errors += read_errors

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            span_ns = (self._last_ns or 0) - (self._first_ns or 0)
            # n timestamps span n-1 intervals: (n-1)/span, not n/span (which overstates FPS).
            fps = (self.captured - 1) * 1e9 / span_ns if self.captured > 1 and span_ns > 0 else None
            return {
                "captured": self.captured,
                "delivered": self.delivered,
                "skipped": self.skipped,
                "read_errors": self.read_errors,
                "capture_fps": fps,
            }


class _SourceBase:
    """Iterator + context manager + ``stats()`` plumbing shared by every source."""

    kind = "source"

    def __init__(self, name: str):
        self.name = name
        self._counters = _Counters()
        self._closed = False
        self._info: dict[str, Any] = {}  # what the source really delivers (size, backend, ...)

    def __iter__(self) -> Iterator[Frame]:
        return self

    def __next__(self) -> Frame:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the camera or file. Safe to call twice; iteration then stops."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, Any]:
        """Counters so far: ``captured`` (frames the source produced), ``delivered``,
        ``skipped`` (overtaken by a newer frame before delivery), ``read_errors``
        (failed or corrupt reads, never delivered), ``capture_fps`` (measured, (n-1)/span,
        None before two frames), plus ``source``, ``kind`` and what the source reports
        about itself (``size`` as (width, height), ``nominal_fps``, backend settings)."""
        return {"source": self.name, "kind": self.kind, **self._counters.snapshot(), **self._info}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}{' closed' if self._closed else ''}>"


# ----------------------------------------------------------------------------------------------
# Live sources: a grabber thread keeps only the newest frame
# ----------------------------------------------------------------------------------------------


class LatestFrameSource(_SourceBase):
    """Runs ``read()`` on a grabber thread and hands the consumer only the newest frame.

    ``read`` returns ``(ok, array)`` like ``cv2.VideoCapture.read``; a False, a None or
    empty array, or an exception counts as a read error and the thread keeps trying (with a
    short back-off so a dead device does not spin a core). ``release`` is called on the
    grabber thread when it ends, so a device is never released while a read is in progress.

    ``next()`` returns the newest frame not yet delivered, waiting for one if needed. It
    raises :class:`CameraError` when no first frame arrives within ``open_timeout_s`` or no
    new frame within ``timeout_s`` later on (a camera that stopped), instead of hanging.
    Frame indices count successful captures, so a gap of ``g`` means ``g`` frames were
    overtaken (counted in ``stats()["skipped"]``). ``close()`` wakes a waiting consumer.
    """

    kind = "live"

    def __init__(
        self,
        read: Callable[[], tuple[bool, np.ndarray | None]],
        *,
        name: str = "live",
        release: Callable[[], None] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
        join_timeout_s: float = 1.0,
    ):
        super().__init__(name)
        if timeout_s <= 0 or open_timeout_s <= 0:
            raise CameraError(f"{name}: timeouts must be positive", "pass timeout_s=/open_timeout_s= > 0")
        self._read = read
        self._release = release
        self._timeout_s = float(timeout_s)
        self._open_timeout_s = float(open_timeout_s)
        self._join_timeout_s = join_timeout_s
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._latest: Frame | None = None
        self._last_index = -1  # index of the last delivered frame
        self._last_error: BaseException | None = None  # the latest failed read, for messages
        self._fatal: BaseException | None = None  # what killed the grabber thread, if anything
        self._thread = threading.Thread(target=self._grab_loop, name=f"edgekit-grab {name}", daemon=True)
        self._thread.start()

    def _grab_loop(self) -> None:
        failures = 0
        index = 0
        try:
            while not self._stop.is_set():
                try:
                    ok, array = self._read()
                except Exception as exc:  # a driver hiccup must not kill the grabber: count it
                    ok, array, self._last_error = False, None, exc
                t_ns = time.perf_counter_ns()
                if not ok or array is None or getattr(array, "size", 0) == 0:
                    self._counters.add(read_errors=1)
                    failures += 1
                    self._stop.wait(min(0.002 * failures, 0.05))
                    continue
                failures = 0
                frame = Frame(array, t_ns, index)
                index += 1
                self._counters.on_capture(t_ns)
                if "size" not in self._info and getattr(array, "ndim", 0) >= 2:
                    self._info["size"] = (int(array.shape[1]), int(array.shape[0]))
                with self._cond:
                    self._latest = frame  # the previous one, if never taken, is simply dropped
                    self._cond.notify_all()
        except BaseException as exc:  # a bug, not a bad frame: the consumer raises it (chained)
            with self._cond:
                self._fatal = exc
                self._cond.notify_all()
        finally:
            if self._release is not None:
                # Releasing a device that has died may fail too; there is nothing left to do.
                with contextlib.suppress(Exception):
                    self._release()

    def __next__(self) -> Frame:
        first = self._last_index < 0
        timeout_s = self._open_timeout_s if first else self._timeout_s
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._closed and (self._latest is None or self._latest.index <= self._last_index):
                if self._fatal is not None:
                    raise CameraError(
                        f"{self.name}: frame grabber failed ({type(self._fatal).__name__}: {self._fatal})",
                        "this is a bug in the source's read function; run with --debug for the traceback",
                    ) from self._fatal
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._stalled(first, timeout_s)
                self._cond.wait(remaining)
            if self._closed:
                raise StopIteration
            frame = self._latest
        skipped = frame.index - self._last_index - 1
        self._last_index = frame.index
        self._counters.add(delivered=1, skipped=skipped)
        return frame

    def _stalled(self, first: bool, timeout_s: float) -> CameraError:
        why = f"; last error: {self._last_error}" if self._last_error else ""
        if first:
            return CameraError(
                f"{self.name}: opened but delivered no frame within {timeout_s:g} s{why}",
                "check the camera/stream is live; slow streams may need a larger open_timeout_s=",
            )
        return CameraError(
            f"{self.name}: camera stopped delivering frames (none for {timeout_s:g} s){why}",
            "check the cable, power or network; pass timeout_s= to wait longer",
        )

    def close(self) -> None:
        """Stop the grabber and wake a waiting consumer. Returns after at most
        ``join_timeout_s``; a grabber stuck in a blocking read releases the device itself
        when that read returns."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self._join_timeout_s)


def _fourcc_str(value: float) -> str:
    code = int(value)
    chars = "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4))
    return chars if chars.isprintable() and code else ""


class OpenCVSource(LatestFrameSource):
    """Any source ``cv2.VideoCapture`` can open (USB/V4L2 device, RTSP/HTTP URL, even a
    file), read by a grabber thread that keeps only the newest frame.

    Args:
        source: a device index, a URL or path, or an already-open capture-like object with
            ``read()`` and ``release()`` (and optionally ``isOpened()``/``get()``/``set()``).
        api: OpenCV backend (``cv2.CAP_V4L2``, ``cv2.CAP_FFMPEG``, ...); default any.
        fourcc: pixel format to ask a device for, e.g. ``"MJPG"`` (USB cameras deliver far
            higher frame rates compressed than as raw YUYV over USB 2).
        size: ``(width, height)`` or ``"WxH"`` to request; the camera may pick another size,
            ``stats()["size"]`` says what it delivers.
        fps: frame rate to request.
        buffer_size: driver queue length (1 = lowest latency; ignored by files/FFMPEG).
        params: extra ``cv2.VideoCapture`` open parameters (``[prop, value, ...]``).
        timeout_s, open_timeout_s: see :class:`LatestFrameSource`.

    Raises:
        CameraError: when the capture does not open (``cv2.VideoCapture`` itself raises
            nothing and returns at once with ``isOpened()`` False when no camera is there).
    """

    kind = "opencv"

    def __init__(
        self,
        source: Any,
        *,
        api: int | None = None,
        fourcc: str | None = None,
        size: Any = None,
        fps: float | None = None,
        buffer_size: int | None = None,
        params: list[int] | None = None,
        name: str | None = None,
        hint: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
    ):
        label = name or (f"camera {source}" if isinstance(source, (int, str)) else type(source).__name__)
        if hasattr(source, "read"):
            cap = source
        else:
            try:
                cap = cv2.VideoCapture(source, cv2.CAP_ANY if api is None else api, list(params or []))
            except cv2.error as exc:
                raise CameraError(f"{label}: cannot open ({exc})", hint) from exc
        if not getattr(cap, "isOpened", lambda: True)():
            cap.release()
            raise CameraError(f"{label}: cannot open", hint or "check the device or URL")
        try:
            info = _configure_capture(cap, fourcc=fourcc, size=_parse_size(size), fps=fps, buffer_size=buffer_size)
        except Exception:
            cap.release()
            raise
        super().__init__(cap.read, name=label, release=cap.release, timeout_s=timeout_s, open_timeout_s=open_timeout_s)
        self._info.update(info)


def _configure_capture(cap: Any, *, fourcc, size, fps, buffer_size) -> dict[str, Any]:
    """Request settings on an open capture and return what it actually reports."""
    if not (hasattr(cap, "set") and hasattr(cap, "get")):
        return {}  # a plain read()/release() object: nothing to request or report
    # V4L2 applies these in order; the pixel format must come before the size, or the driver
    # may reject a size that only exists for MJPG.
    if fourcc:
        cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*fourcc))
    if size:
        cap.set(cv2.CAP_PROP_FRAME_WIDTH, size[0])
        cap.set(cv2.CAP_PROP_FRAME_HEIGHT, size[1])
    if fps:
        cap.set(cv2.CAP_PROP_FPS, fps)
    if buffer_size:
        cap.set(cv2.CAP_PROP_BUFFERSIZE, buffer_size)
    info: dict[str, Any] = {}
    with_backend = getattr(cap, "getBackendName", None)
    if with_backend is not None:
        with contextlib.suppress(cv2.error):
            info["backend"] = with_backend()
    nominal = cap.get(cv2.CAP_PROP_FPS)
    info["nominal_fps"] = float(nominal) if nominal and np.isfinite(nominal) and 0 < nominal < 1000 else None
    fcc = _fourcc_str(cap.get(cv2.CAP_PROP_FOURCC))
    if fcc:
        info["fourcc"] = fcc
    return info


# ----------------------------------------------------------------------------------------------
# picamera2 (Raspberry Pi CSI cameras)
# ----------------------------------------------------------------------------------------------


def _yuv420_to_bgr(array: np.ndarray, width: int, height: int) -> np.ndarray:
    """picamera2's YUV420 array is ``(height*3/2, stride)``: a Y plane, then U and V planes
    whose rows are half a stride each. Drop the stride padding and convert I420 -> BGR."""
    stride = array.shape[1]
    if stride == width:
        return cv2.cvtColor(array, cv2.COLOR_YUV2BGR_I420)
    y = array[:height, :width]
    halves = array.reshape(array.shape[0] * 2, stride // 2)  # one chroma row per half-row
    u = halves[2 * height : 2 * height + height // 2, : width // 2]
    v = halves[2 * height + height // 2 : 3 * height, : width // 2]
    i420 = np.concatenate([y.ravel(), u.ravel(), v.ravel()]).reshape(height * 3 // 2, width)
    return cv2.cvtColor(i420, cv2.COLOR_YUV2BGR_I420)


#: picamera2 stream format -> conversion to OpenCV's B,G,R byte order. libcamera names a
#: format by its little-endian word, so the bytes come reversed: "RGB888" arrays are already
#: B,G,R (no work) and "BGR888" arrays are R,G,B; the 32-bit formats add a padding byte.
PICAMERA2_TO_BGR: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "RGB888": lambda a: a,
    "BGR888": lambda a: cv2.cvtColor(a, cv2.COLOR_RGB2BGR),
    "XRGB8888": lambda a: cv2.cvtColor(a, cv2.COLOR_BGRA2BGR),  # bytes B,G,R,X
    "XBGR8888": lambda a: cv2.cvtColor(a, cv2.COLOR_RGBA2BGR),  # bytes R,G,B,X
}
PICAMERA2_INSTALL_HINT = (
    "picamera2 comes with Raspberry Pi OS (sudo apt install python3-picamera2); "
    "create the virtualenv with --system-site-packages so it can be imported"
)


class Picamera2Source(LatestFrameSource):
    """A Raspberry Pi camera through picamera2 (imported only when this source is opened).

    The ISP resizes for free, so ask it for the model's input size: ``size=(w, h)`` alone
    configures the main stream at that size; with ``main_size=`` as well, the main stream
    runs at ``main_size`` and a low-resolution stream at ``size`` is what this source
    delivers (lores must be ``YUV420`` before the Pi 5). Frames are converted to OpenCV's
    B,G,R order with :data:`PICAMERA2_TO_BGR` (``"RGB888"``, the default, needs no work).
    """

    kind = "picamera2"

    def __init__(
        self,
        camera_num: int = 0,
        *,
        size: Any = None,
        main_size: Any = None,
        format: str = "RGB888",
        lores_format: str = "YUV420",
        fps: float | None = None,
        buffer_count: int = 4,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
    ):
        from edgekit.plugins import resolve

        label = f"picamera2:{camera_num}"
        size, main_size = _parse_size(size), _parse_size(main_size)
        for fmt in {format, lores_format}:
            if fmt not in PICAMERA2_TO_BGR and fmt != "YUV420":
                raise CameraError(
                    f"{label}: unsupported format {fmt!r}",
                    f"use one of {', '.join([*PICAMERA2_TO_BGR, 'YUV420'])}",
                )
        picamera2_cls = resolve("picamera2:Picamera2", PICAMERA2_INSTALL_HINT)
        try:
            cam = picamera2_cls(camera_num)
        except Exception as exc:  # picamera2 raises IndexError/RuntimeError when no camera is there
            raise CameraError(
                f"{label}: cannot open ({type(exc).__name__}: {exc})",
                "is the camera connected and detected? try `rpicam-hello --list-cameras`",
            ) from exc
        if size and main_size:
            main = {"size": main_size, "format": format}
            lores: dict | None = {"size": size, "format": lores_format}
            stream, fmt, out_size = "lores", lores_format, size
        else:
            out_size = size or main_size
            main = {"format": format, **({"size": out_size} if out_size else {})}
            lores, stream, fmt = None, "main", format
        try:
            config = cam.create_video_configuration(
                main=main,
                lores=lores,
                controls={"FrameRate": float(fps)} if fps else {},
                buffer_count=buffer_count,
                queue=False,  # wait for a fresh frame rather than take one already queued
            )
            cam.configure(config)
            if out_size is None:  # the camera chose: read the size back from the configuration
                out_size = tuple(cam.camera_configuration()[stream]["size"])
            cam.start()
        except Exception as exc:
            cam.close()
            raise CameraError(f"{label}: cannot configure ({type(exc).__name__}: {exc})",
                              "try another size= or format=") from exc  # fmt: skip
        width, height = out_size
        convert = PICAMERA2_TO_BGR.get(fmt) or (lambda a: _yuv420_to_bgr(a, width, height))

        # Ask for each frame asynchronously and wait for it in short slices: a camera that
        # stops then shows up as timed-out reads (the grabber can notice close()) instead of
        # a capture_array() call blocked forever. One request stays pending until it completes.
        poll_s = min(float(timeout_s), 0.5)
        pending: list[Any] = []

        def read() -> tuple[bool, np.ndarray | None]:
            if not pending:
                pending.append(cam.capture_array(stream, wait=False))
            try:
                array = cam.wait(pending[0], timeout=poll_s)
            except (TimeoutError, FutureTimeoutError):
                return False, None
            except Exception:
                pending.clear()
                raise
            pending.clear()
            return True, convert(array)

        def release() -> None:
            try:
                cam.stop()
            finally:
                cam.close()

        super().__init__(read, name=label, release=release, timeout_s=timeout_s, open_timeout_s=open_timeout_s)
        self._info.update({"stream": stream, "format": fmt, "nominal_fps": float(fps) if fps else None})


# ----------------------------------------------------------------------------------------------
# Sequences: video files, image folders, the synthetic pattern
# ----------------------------------------------------------------------------------------------


class _EndOfStream(Exception):
    """Raised by a reader that has no more frames in this pass."""


class _Reader(Protocol):
    """Frames in order: ``read()`` -> array, or None for an unreadable frame;
    ``skip()`` -> advance one frame without decoding (False if it failed);
    both raise _EndOfStream at the end; ``rewind()`` starts the next pass."""

    def read(self) -> np.ndarray | None: ...

    def skip(self) -> bool: ...

    def rewind(self) -> None: ...

    def release(self) -> None: ...


class SequenceSource(_SourceBase):
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
            return Frame(array, t_ns, k)

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
            except _EndOfStream:
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
        self.path = path
        self._cap = self._open()
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        self.fps = float(fps) if fps and np.isfinite(fps) and 0 < fps < 1000 else None
        self.frame_count = max(int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0), 0)
        self._pos = 0
        self._failures = 0

    def _open(self) -> Any:
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
        raise _EndOfStream

    def read(self) -> np.ndarray | None:
        try:
            ok, array = self._cap.read()
        except cv2.error:
            ok, array = False, None
        ok = ok and array is not None and array.size > 0
        return array if self._after(ok) else None

    def skip(self) -> bool:
        try:
            ok = self._cap.grab()  # demux only: skipping must be cheaper than decoding
        except cv2.error:
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

    def _next_path(self) -> Path:
        if self._pos >= len(self.paths):
            raise _EndOfStream
        self._pos += 1
        return self.paths[self._pos - 1]

    def read(self) -> np.ndarray | None:
        path = self._next_path()
        try:
            return read_image(path)
        except (ImageReadError, OSError):
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
        super().__init__(_FolderReader(paths), name=f"folder:{directory}", fps=fps, pace=bool(fps), loop=loop)
        self._info["frame_count"] = len(paths)


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

    def frame(self, index: int) -> np.ndarray:
        w, h = self.width, self.height
        out = np.empty((h, w, 3), np.uint8)
        out[..., :2] = self._ramps
        shift = (index * 4) % w
        out[..., 2] = self._checker[:, shift : shift + w]
        t = index / 30.0
        cx = int(w / 2 + w / 3 * np.sin(2 * np.pi * 0.25 * t))
        cy = int(h / 2 + h / 3 * np.sin(2 * np.pi * 0.4 * t))
        cv2.circle(out, (cx, cy), max(min(w, h) // 8, 2), (255, 255, 255), -1)
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
            raise _EndOfStream
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
        width, height = _parse_size(size) or (640, 360)
        super().__init__(
            _SyntheticReader(width, height, frames),
            name=f"synthetic:{width}x{height}" + (f"@{fps:g}" if fps else ""),
            fps=fps,
            pace=bool(fps),
            loop=loop,
        )
        self._info["size"] = (width, height)


# ----------------------------------------------------------------------------------------------
# open_camera: URI -> source
# ----------------------------------------------------------------------------------------------


def _parse_size(size: Any) -> tuple[int, int] | None:
    """``(w, h)``, ``[w, h]`` or ``"WxH"`` -> ``(w, h)``; None stays None."""
    if size is None:
        return None
    if isinstance(size, str):
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", size)
        if not m:
            raise CameraError(f"bad size {size!r}", "write it as WIDTHxHEIGHT, e.g. 640x480")
        size = (m.group(1), m.group(2))
    try:
        width, height = (int(v) for v in size)
    except (TypeError, ValueError) as exc:
        raise CameraError(f"bad size {size!r}", "give (width, height)") from exc
    if width <= 0 or height <= 0:
        raise CameraError(f"bad size {size!r}", "width and height must be positive")
    return width, height


def redact_uri(uri: str | int) -> str:
    """The URI with any ``user:password@`` replaced by ``***@`` (for messages, stats and metrics)."""
    return re.sub(r"//[^/@]*@", "//***@", str(uri))


def _build(label: str, factory: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """Call ``factory`` after checking that it takes every option (a typo such as
    ``looop=True`` gets a clear error instead of a TypeError from deep inside)."""
    params = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            takes = ", ".join(n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
            raise UsageError(f"{label} does not take option(s) {', '.join(unknown)}", f"it takes: {takes}")
    return factory(*args, **options)


def _device_source(device: int | str, uri: str, options: dict) -> OpenCVSource:
    # Linux: V4L2 directly (CAP_ANY may try GStreamer on system OpenCV builds). Elsewhere the
    # platform's default backend.
    api = cv2.CAP_V4L2 if sys.platform.startswith("linux") else cv2.CAP_ANY
    defaults = {"fourcc": "MJPG", "buffer_size": 1}
    hint = (
        "is a camera connected (`ls /dev/video*`), free (not used by another program), and "
        "readable by you (group 'video')? Raspberry Pi CSI cameras need picamera2:N"
    )
    return _build(uri, OpenCVSource, device, api=api, name=uri, hint=hint, **{**defaults, **options})


def _stream_source(url: str, options: dict) -> OpenCVSource:
    timeout_s = float(options.get("timeout_s", DEFAULT_TIMEOUT_S))
    open_timeout_s = float(options.get("open_timeout_s", DEFAULT_OPEN_TIMEOUT_S))
    # FFMPEG's own timeouts bound a blocking read, so the grabber thread ends soon after the
    # consumer gives up on a dead stream instead of hanging in the network stack.
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(open_timeout_s * 1000),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(timeout_s * 1000),
    ]  # fmt: skip
    name = redact_uri(url)
    hint = "check the URL, network and credentials; test it with `ffprobe URL`"
    return _build(name, OpenCVSource, url, api=cv2.CAP_FFMPEG, name=name, hint=hint,
                  **{"params": params, **options})  # fmt: skip


def open_camera(uri: str | int, **options: Any) -> FrameSource:
    """Open a frame source from a URI.

    URIs and their options (all sources also take none of the others'):

    * ``v4l2:N``, ``v4l2:/dev/videoN`` or ``N``: a USB/V4L2 camera via OpenCV, grabber
      thread. Options: ``size=(w, h)``, ``fps=``, ``fourcc="MJPG"``, ``buffer_size=1``,
      ``timeout_s=5``, ``open_timeout_s=10``.
    * ``rtsp://...``, ``http(s)://...`` (and other FFMPEG URLs): a network stream via
      OpenCV FFMPEG, grabber thread. Options: ``timeout_s``, ``open_timeout_s``. RTSP over
      TCP instead of UDP: set ``OPENCV_FFMPEG_CAPTURE_OPTIONS=rtsp_transport;tcp`` in the
      environment (OpenCV reads it when the stream opens).
    * ``file:PATH`` or a path ending in a video suffix: a clip. Options: ``pace=True``
      (to the file's fps), ``loop=False``, ``fps=`` (override).
    * ``folder:DIR`` or an existing directory: its images. Options: ``fps=`` (pace),
      ``loop=False``.
    * ``picamera2`` or ``picamera2:N``: a Raspberry Pi camera. Options: ``size=``,
      ``main_size=``, ``format="RGB888"``, ``lores_format="YUV420"``, ``fps=``,
      ``buffer_count=4``, ``timeout_s``, ``open_timeout_s``.
    * ``synthetic``, ``synthetic:WxH`` or ``synthetic:WxH@FPS``: a moving test pattern
      (640x360 by default, unpaced unless a rate is given). Options: ``frames=``, ``loop=``.
    * ``vector:SERIAL``: an Anki Vector's camera (``edgekit[vector]``); options are passed to
      ``edgekit.vector.camera.VectorSource``.

    Returns:
        A source: an iterator of :class:`Frame` with ``close()``, ``stats()`` and context
        manager support. Live sources start their grabber thread here.

    Raises:
        CameraError: unknown URI or option, or a camera/file that cannot be opened.
        BackendUnavailable: picamera2 or the Vector SDK is not installed.
    """
    if isinstance(uri, int):
        uri = str(uri)
    text = uri.strip()
    lower = text.lower()
    if text.isdigit():
        return _device_source(int(text), f"v4l2:{text}", options)
    if lower.startswith("v4l2:"):
        device = text[5:]
        if not (device.isdigit() or device.startswith("/dev/")):
            raise CameraError(f"bad camera URI {uri!r}", "write v4l2:0 or v4l2:/dev/video0")
        return _device_source(int(device) if device.isdigit() else device, text, options)
    if lower.startswith(STREAM_SCHEMES):
        return _stream_source(text, options)
    if lower.startswith("file:"):
        path = text[5:]
        path = path[2:] if path.startswith("//") else path  # file:///abs/path
        return _build(text, VideoFileSource, path, **options)
    if lower.startswith("folder:"):
        return _build(text, ImageFolderSource, text[7:], **options)
    if lower == "picamera2" or lower.startswith("picamera2:"):
        num = text[10:] or "0"
        if not num.isdigit():
            raise CameraError(f"bad camera URI {uri!r}", "write picamera2 or picamera2:N")
        return _build(text, Picamera2Source, int(num), **options)
    if lower == "synthetic" or lower.startswith("synthetic:"):
        return _synthetic(text, options)
    if lower.startswith("vector:"):
        serial = text[7:]
        if not serial:
            raise CameraError(f"bad camera URI {uri!r}", "write vector:SERIAL (the robot's serial number)")
        from edgekit.plugins import resolve

        vector_source = resolve("edgekit.vector.camera:VectorSource", "pip install 'edgekit[vector]'")
        if "timeout_s" in options:  # one name for "no frame for this long" across every source
            options["frame_timeout_s"] = options.pop("timeout_s")
        return vector_source(serial, **options)
    path = Path(text)
    if path.is_dir():
        return _build(text, ImageFolderSource, path, **options)
    if path.suffix.lower() in VIDEO_SUFFIXES:
        return _build(text, VideoFileSource, path, **options)
    if path.exists():
        raise CameraError(f"{uri}: not a video file or folder", f"video suffixes: {' '.join(VIDEO_SUFFIXES)}")
    raise CameraError(f"unknown camera {uri!r}", f"use one of: {URI_FORMS}")


def _synthetic(text: str, options: dict) -> SyntheticSource:
    spec = text[10:]
    m = re.fullmatch(r"(?:(\d+)[xX](\d+))?(?:@(\d+(?:\.\d+)?))?", spec)
    if not m:
        raise CameraError(f"bad camera URI {text!r}", "write synthetic, synthetic:640x480 or synthetic:640x480@30")
    if m.group(1):
        options.setdefault("size", (int(m.group(1)), int(m.group(2))))
    if m.group(3):
        options.setdefault("fps", float(m.group(3)))
    return _build(text, SyntheticSource, **options)


__all__ = [
    "CameraError",
    "Frame",
    "FrameSource",
    "ImageFolderSource",
    "LatestFrameSource",
    "OpenCVSource",
    "PICAMERA2_TO_BGR",
    "Picamera2Source",
    "SequenceSource",
    "SyntheticSource",
    "VIDEO_SUFFIXES",
    "VideoFileSource",
    "open_camera",
    "synthetic_frame",
]
