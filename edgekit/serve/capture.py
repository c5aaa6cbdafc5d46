"""The daemon's capture thread: camera -> newest-frame mailbox, reopened with backoff.

The camera is read as fast as it delivers and only the newest frame is kept, in the daemon's
one-slot :class:`~edgekit.camera.mailbox.FrameMailbox`; the inference loop takes whatever is
newest when it is free. A live camera (:class:`~edgekit.camera.LatestFrameSource`) already
reads on its own grabber thread: its frames go straight into that mailbox (one reading thread,
one mailbox), and the capture thread only opens, watches and reopens it. Files, folders and
the synthetic clip are read on the capture thread itself. Frames overwritten in the mailbox, and gaps in ``Frame.index``
(frames the source itself dropped), are counted as skipped. A camera that fails to open or
stops is reopened with exponential backoff; one that cannot work (a wrong option, a missing
library, a robot with no SDK configuration) is fatal: retrying forever would hide it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from edgekit.camera import SequenceSource, redact_uri
from edgekit.camera.mailbox import FrameMailbox
from edgekit.errors import BackendUnavailable, CameraError, UsageError
from edgekit.serve.config.load import CameraConfig
from edgekit.serve.stats import Counters, RateMeter

log = logging.getLogger("edgekit.serve")

WATCH_S = 0.05  # how often the capture thread looks at a live source that delivers on its own thread


def check_reduced_decode(options: dict[str, Any], crop: Any) -> None:
    """Refuse ``decode_size=`` with a model whose preprocessing crops in pixels.

    A reduced decode shrinks the frame uniformly, so ``crop = "square"`` or none still takes
    the same part of the scene, but ``[height, width]`` pixels would take a larger share of a
    smaller frame: a different input from the one the model was evaluated on.
    """
    if options.get("decode_size") and isinstance(crop, (list, tuple)):
        raise UsageError(
            f"[camera] decode_size= with a model that crops {list(crop)} pixels of the full frame",
            "remove decode_size= (the reduced frame would change what the crop covers)",
        )


class Capture:
    """Feeds ``mailbox`` from the camera in a daemon thread until ``stop`` is set.

    Args:
        config: the ``[camera]`` table.
        factory: ``(uri, options) -> FrameSource``; called again after every camera loss.
        mailbox: where the newest frame waits for the inference loop.
        counters: ``frames.captured``/``skipped``, ``errors.camera``, ``reconnects.camera``.
        stop: the daemon's stop event; the capture sets it itself when the camera is fatal.
        clock: nanosecond monotonic clock.
        gate: a motion gate (:class:`~edgekit.camera.motion.MotionGate`) or None: a frame it does
            not want never reaches the mailbox (counted in ``frames.gated``). It sees every frame
            the camera delivers, on the thread that delivers them, so the inference loop never
            wakes for a still frame and the difference is taken between consecutive frames.

    Read by other threads: ``is_open``, ``error``, ``last_frame_ns``, ``rates`` (camera,
    skipped), ``fatal`` (the exception that ended capture for good) and ``ended`` (set when
    a source with ``on_end = "stop"`` finished).
    """

    def __init__(self, config: CameraConfig, factory: Callable[[str, dict], Any], mailbox: FrameMailbox,
                 counters: Counters, stop: threading.Event, clock: Callable[[], int], gate: Any = None):
        self.config = config
        self.name = redact_uri(config.uri)  # never publish camera credentials
        self.label = f"{config.name} ({self.name})" if config.name else self.name  # in log lines
        self.gate = gate
        self._factory = factory
        self._mailbox = mailbox
        self._counters = counters
        self._stop = stop
        self._clock = clock
        self.rates = {"camera": RateMeter(clock=clock), "skipped": RateMeter(clock=clock)}
        self.ended = threading.Event()
        self.fatal: BaseException | None = None
        self.is_open = False
        self.error = ""
        self.last_frame_ns: int | None = None
        self.loops = 0  # passes of a clip played to its end (not faults)
        self._looped = False
        self.source: Any = None
        self._thread: threading.Thread | None = None
        self._previous: int | None = None  # the last frame index a live source delivered

    def start(self) -> None:
        """Start the capture thread."""
        name = f"edgekit-capture-{self.config.name}" if self.config.name else "edgekit-capture"  # py-spy, ps -L
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def join(self, timeout_s: float = 1.0) -> None:
        """Wait for the thread after ``stop`` was set; close a source stuck in a read."""
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout=timeout_s)
        if thread.is_alive():
            # The source is blocked in a read: closing it from here is the only way to
            # unblock it; the thread is a daemon thread, so it cannot hold up the exit.
            self.close_source()
            thread.join(timeout=timeout_s)

    def close_source(self) -> None:
        """Close the current source, if any (errors are only logged)."""
        source, self.source = self.source, None
        if source is not None:
            try:
                source.close()
            except Exception as exc:
                log.debug("closing the camera failed: %s", exc)

    def source_stats(self) -> dict[str, Any] | None:
        """The open source's own ``stats()``, if it has one, with ``loops`` (passes of a clip)."""
        stats = getattr(self.source, "stats", None)
        if not callable(stats):
            return None
        try:
            return {**stats(), **({"loops": self.loops} if self.loops else {})}
        except Exception as exc:
            return {"error": str(exc)}

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        cfg = self.config
        delay, opened = cfg.reconnect_min_s, 0
        while not self._stop.is_set():
            source = self._open()
            if source is None:
                if self.fatal is not None:
                    return
                self._stop.wait(delay)
                delay = min(delay * 2, cfg.reconnect_max_s)
                continue
            opened += 1
            if opened > 1 and not self._looped:
                self._counters.add("reconnects", camera=1)
                log.info("camera %s reopened (reconnect %d)", self.label, opened - 1)
            self._looped = False
            if self._session(source):
                return
            if self._looped:  # a clip played to its end: the next pass at once, no error, no backoff
                delay = cfg.reconnect_min_s
                continue
            if self.last_frame_ns is not None and self._clock() - self.last_frame_ns < 1e9 * delay:
                delay = cfg.reconnect_min_s  # it delivered recently: start the backoff over
            self._stop.wait(delay)
            delay = min(delay * 2, cfg.reconnect_max_s)

    def _open(self) -> Any:
        """The opened source, or None (``fatal`` set when retrying cannot help)."""
        try:
            return self._factory(self.config.uri, dict(self.config.options))
        except (UsageError, BackendUnavailable) as exc:
            # A wrong option or a missing library will not fix itself: retrying forever
            # would hide it (and keep systemd from ever seeing the failure).
            self._give_up(exc)
        except Exception as exc:  # CameraError, or anything a driver throws
            if getattr(exc, "retryable", True) is False:  # e.g. a Vector with no SDK configuration
                self._give_up(exc)
            else:
                self._down(f"cannot open camera {self.label}: {exc}")
        return None

    def _give_up(self, exc: BaseException) -> None:
        self.fatal = exc
        self._down(f"cannot open camera {self.label}: {exc}")
        self._stop.set()
        self._mailbox.wake()

    def _session(self, source: Any) -> bool:
        """Pump one opened source until it ends or fails; True when capture is over (clip ended)."""
        self.source = source
        self.is_open = True
        try:
            ended = self._watch(source) if callable(getattr(source, "deliver_to", None)) else self._pump(source)
            if ended and not self._stop.is_set():
                if self.config.on_end == "stop":
                    log.info("camera %s ended; stopping after the last frame", self.label)
                    self.ended.set()
                    return True
                if isinstance(source, SequenceSource) and self.last_frame_ns is not None:
                    self._loop_done()
                    return False
                self._down(f"camera {self.label} stopped delivering frames")
        except Exception as exc:  # CameraError or a driver error: reconnect
            self._down(f"camera {self.label} lost: {exc}")
        finally:
            self.is_open = False
            self.close_source()
        return False

    def _pump(self, source: Any) -> bool:
        """Move frames from the source into the mailbox on this thread (files, folders, the
        synthetic clip: sources without a grabber thread); True when the source ended by itself."""
        self._previous = None
        for frame in source:
            if self._stop.is_set():
                return False
            self._deliver(frame)
        return True

    def _watch(self, source: Any) -> bool:
        """A live source (:class:`~edgekit.camera.LatestFrameSource`): its own grabber thread puts
        every frame straight into the daemon's mailbox (:meth:`_deliver`), so one thread reads the
        camera and one mailbox holds its newest frame; this thread only watches it. True when it
        was closed; raises what ``next()`` would have (a stall, a failed grabber)."""
        feed = _Feed(self._deliver)
        self._previous = None
        source.deliver_to(feed)
        while not self._stop.wait(WATCH_S):
            if source.closed:
                return True
            problem = source.problem()
            if problem is not None:
                raise problem
        return False

    def _deliver(self, frame: Any) -> bool:
        """One frame into the mailbox (on a live source's grabber thread, or this one); True when it
        replaced one never taken. Gaps in ``Frame.index`` are frames the source itself dropped."""
        if self._stop.is_set():
            return False
        now = self._clock()
        previous, self._previous = self._previous, frame.index
        gap = frame.index - previous - 1 if previous is not None and frame.index > previous + 1 else 0
        wanted = self.gate is None or self._wanted(frame)  # a gated frame never reaches the model
        dropped = self._mailbox.put(frame) if wanted else False
        self.last_frame_ns = now  # a still scene is a camera that works
        self._counters.add("frames", captured=1 + gap, skipped=gap + int(dropped), **({} if wanted else {"gated": 1}))
        self.rates["camera"].add(1 + gap, now)
        if gap or dropped:
            self.rates["skipped"].add(gap + int(dropped), now)
        return dropped

    def _wanted(self, frame: Any) -> bool:
        """Whether the motion gate lets ``frame`` through; a frame it cannot read (not a gray,
        BGR or BGRA array) goes on, and the pipeline counts it as bad."""
        try:
            return bool(self.gate.wants(frame))
        except Exception as exc:  # a driver's odd frame must not end the camera's session
            log.debug("motion gate: %s", exc)
            return True

    def _loop_done(self) -> None:
        """A file, folder or synthetic clip ended with ``on_end = "reconnect"``: it is played again.
        A pass is not a camera fault (each used to count as an error and a reconnect, and a looped
        demo clip tripped EdgekitCameraFlapping); passes are counted in ``loops``."""
        self.loops += 1
        self._looped = True
        log.log(logging.INFO if self.loops == 1 else logging.DEBUG,
                "camera %s ended; playing it again (pass %d; on_end = \"stop\" stops instead)",
                self.label, self.loops + 1)

    def _down(self, message: str) -> None:
        self._counters.add("errors", camera=1)
        self.error = message
        log.warning("%s; retrying", message)


class _Feed:
    """What a live source's grabber writes into instead of its own mailbox: ``put`` is the
    capture's :meth:`Capture._deliver`; ``close`` (the grabber ended) leaves the daemon's mailbox
    open, since the next source feeds the same one."""

    def __init__(self, deliver: Callable[[Any], bool]):
        self.put = deliver
        self.closed = False

    def close(self) -> None:
        self.closed = True


def open_source(uri: str, options: dict[str, Any], runtime: Any = None):
    """Open a camera with :func:`edgekit.camera.open_camera`; ``runtime``: the model's open runtime,
    for a source that reads its device (``imx500``)."""
    try:
        from edgekit.camera import open_camera
    except ImportError as exc:  # camera sources not shipped in this build
        raise CameraError(f"cannot open camera {uri}: edgekit.camera has no open_camera", str(exc)) from exc
    return open_camera(uri, runtime, **options)
