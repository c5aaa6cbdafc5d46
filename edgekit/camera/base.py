"""What every camera source shares: :class:`Frame`, the :class:`FrameSource` contract, frame
counters, the iterator/context-manager base and :class:`LatestFrameSource` (the grabber
thread behind every live camera).

Frames follow OpenCV's convention (uint8, B,G,R). The array in a :class:`Frame` belongs to
the consumer: no source writes into it after handing it out. Sources are not thread-safe:
iterate one from a single thread (the grabber thread is internal).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edgekit.camera.mailbox import FrameMailbox
from edgekit.errors import CameraError, CameraUnavailable, UsageError
from edgekit.metrics import rate

DEFAULT_TIMEOUT_S = 5.0  # a live camera silent this long mid-run is reported as stopped
DEFAULT_OPEN_TIMEOUT_S = 10.0  # RTSP and USB cameras can take seconds to deliver the first frame
MIN_FPS, MAX_FPS = 0.001, 10000.0  # one frame per 17 minutes .. a high-speed camera (the fps option's range)


class CameraOptionError(UsageError, CameraError):
    """A camera option that does not exist or has a bad value.

    A UsageError (retrying will not fix it: the daemon stops instead of reconnecting) and
    a CameraError (what callers of ``open_camera`` have always caught)."""


@dataclass(frozen=True)
class Frame:
    """One captured image (OpenCV convention: uint8, gray 2-D or HxWx3 BGR).

    ``t_capture_ns`` is ``time.perf_counter_ns()`` when the frame was captured (or arrived),
    ``index`` the source's running frame number (gaps mean frames were skipped). ``source`` says
    where it came from, for results that name their image: an image's path as the folder was
    given (``eval/x/000.jpg``), a video file's path, else the camera's name with a stream's
    password redacted (``v4l2:0``, ``rtsp://***@cam/stream``); None for frames made by hand.
    ``metadata`` is the camera's own record of this very frame where a backend reads it (the
    ``imx500`` source: the request's metadata, which carries the sensor's network outputs), else None.
    """

    array: np.ndarray
    t_capture_ns: int
    index: int
    source: str | None = None
    metadata: Mapping[str, Any] | None = None


@runtime_checkable
class FrameSource(Protocol):
    """What every camera source provides."""

    def __iter__(self) -> Iterator[Frame]: ...

    def close(self) -> None: ...


MAX_SIDE = 16384
"""The largest frame side a source is asked for (the same cap as a model input's)."""


def parse_size(size: Any) -> tuple[int, int] | None:
    """``(w, h)``, ``[w, h]`` or ``"WxH"`` -> ``(w, h)``; None stays None.

    Raises CameraError for anything else or a size that is not positive.
    """
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
    if width > MAX_SIDE or height > MAX_SIDE:
        # A typo like 100000x100000 would ask numpy for ~28 GiB per frame and die of MemoryError.
        raise CameraError(f"size {width}x{height} is too large", f"each side at most {MAX_SIDE} pixels")
    return width, height


def redact_uri(uri: str | int) -> str:
    """The URI with any ``user:password@`` replaced by ``***@`` (for messages, stats and metrics)."""
    return re.sub(r"//[^/@]*@", "//***@", str(uri))


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

    @property
    def last_ns(self) -> int | None:
        """When the newest frame was captured (None before the first)."""
        with self._lock:
            return self._last_ns

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            span_ns = (self._last_ns or 0) - (self._first_ns or 0)
            return {
                "captured": self.captured,
                "delivered": self.delivered,
                "skipped": self.skipped,
                "read_errors": self.read_errors,
                # (n-1)/span from the one FPS formula; None, not 0, before two capture times
                "capture_fps": rate(self.captured, span_ns) or None,
            }


class SourceBase:
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
        """True once :meth:`close` was called (or a sequence reached its end)."""
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


class LatestFrameSource(SourceBase):
    """Runs ``read()`` on a grabber thread and hands the consumer only the newest frame.

    ``read`` returns ``(ok, array)`` like ``cv2.VideoCapture.read`` (or ``(ok, array, metadata)``:
    the frame's :attr:`Frame.metadata`); a False, a None or
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
        read: Callable[[], tuple[Any, ...]],
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
        self._mailbox: Any = FrameMailbox()  # the newest captured frame not yet taken (see deliver_to)
        self._handover = threading.Lock()  # deliver_to swaps the mailbox between two puts, never during one
        self._direct = False  # frames go straight to a consumer's mailbox (deliver_to)
        self._opened_ns = time.perf_counter_ns()
        self._stop = threading.Event()
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
                metadata = None
                try:
                    ok, array, *rest = self._read()
                    metadata = rest[0] if rest else None
                except Exception as exc:  # a driver hiccup must not kill the grabber: count it
                    ok, array, self._last_error = False, None, exc
                t_ns = time.perf_counter_ns()
                if not ok or array is None or getattr(array, "size", 0) == 0:
                    self._counters.add(read_errors=1)
                    failures += 1
                    self._stop.wait(min(0.002 * failures, 0.05))
                    continue
                failures = 0
                self._counters.on_capture(t_ns)
                if "size" not in self._info and getattr(array, "ndim", 0) >= 2:
                    self._info["size"] = (int(array.shape[1]), int(array.shape[0]))
                # A frame never taken is simply replaced; the consumer counts it as skipped
                # from the index gap when it takes the next one (or, delivered, as it is replaced).
                with self._handover:
                    dropped = self._mailbox.put(Frame(array, t_ns, index, self.name, metadata))
                if self._direct:
                    self._counters.add(delivered=1 - int(dropped), skipped=int(dropped))
                index += 1
        except BaseException as exc:  # a bug, not a bad frame: the consumer raises it (chained)
            self._fatal = exc
        finally:
            self._mailbox.close()  # a consumer waiting on a grabber that has ended returns now
            if self._release is not None:
                # Releasing a device that has died may fail too; there is nothing left to do.
                with contextlib.suppress(Exception):
                    self._release()

    def __next__(self) -> Frame:
        first = self._last_index < 0
        timeout_s = self._open_timeout_s if first else self._timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            if self._closed:
                raise StopIteration
            frame = self._mailbox.take(max(deadline - time.monotonic(), 0.0))
            if frame is not None and not self._closed:
                break
            if self._fatal is not None:
                raise self._grabber_failed() from self._fatal
            if time.monotonic() >= deadline:
                raise self._stalled(first, timeout_s)
        self._counters.add(delivered=1, skipped=frame.index - self._last_index - 1)
        self._last_index = frame.index
        return frame

    def deliver_to(self, mailbox: Any) -> None:
        """Put every later frame straight into ``mailbox`` (``put(frame) -> replaced``, ``close()``)
        instead of this source's own: a consumer with its own newest-frame slot (the daemon) then
        reads a live camera through this one grabber thread and one mailbox, without a second
        thread copying frames. Do not iterate the source afterwards; :meth:`problem` says when it
        stalled or its grabber failed, as ``next()`` would have raised it."""
        with self._handover:  # the grabber puts under this lock: no newer frame can land first
            old, self._mailbox, self._direct = self._mailbox, mailbox, True
            frame = old.take(0)
            if frame is not None:  # captured before the hand-over and not taken yet
                self._counters.add(delivered=1)
                mailbox.put(frame)
        if old.closed:  # the grabber had already ended: the new mailbox hears it too
            mailbox.close()

    def problem(self) -> CameraError | None:
        """Why the source no longer delivers, as ``next()`` would raise it (the grabber failed, no
        first frame within ``open_timeout_s``, none for ``timeout_s`` later on); None while it does."""
        if self._fatal is not None:
            return self._grabber_failed()
        last = self._counters.last_ns
        first = last is None
        timeout_s = self._open_timeout_s if first else self._timeout_s
        if time.perf_counter_ns() - (self._opened_ns if first else last) >= timeout_s * 1e9:
            return self._stalled(first, timeout_s)
        return None

    def _grabber_failed(self) -> CameraError:
        return CameraUnavailable(
            f"{self.name}: frame grabber failed ({type(self._fatal).__name__}: {self._fatal})",
            "this is a bug in the source's read function; run with --debug for the traceback",
        )

    def _stalled(self, first: bool, timeout_s: float) -> CameraError:
        why = f"; last error: {self._last_error}" if self._last_error else ""
        if first:
            return CameraUnavailable(
                f"{self.name}: opened but delivered no frame within {timeout_s:g} s{why}",
                "check the camera/stream is live; slow streams may need a larger open_timeout_s=",
            )
        return CameraUnavailable(
            f"{self.name}: camera stopped delivering frames (none for {timeout_s:g} s){why}",
            "check the cable, power or network; pass timeout_s= to wait longer",
        )

    def close(self) -> None:
        """Stop the grabber and wake a waiting consumer. Returns after at most
        ``join_timeout_s``; a grabber stuck in a blocking read releases the device itself
        when that read returns."""
        if self._closed:
            return
        self._closed = True
        self._mailbox.close()  # sticky: a consumer about to wait returns at once, too
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self._join_timeout_s)
