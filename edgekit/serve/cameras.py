"""Several cameras, one model: a capture per camera, and a fair turn for each at the model.

Each camera keeps what one camera always had (:class:`~edgekit.serve.capture.Capture`: its thread,
a one-slot newest-frame mailbox, reconnects with backoff, the stall watch) plus its own counters,
rates and optional motion gate (:class:`CameraFeed`). The inference loop asks :class:`CameraSet`
for the next frame: the newest frame of the next camera that has one, round robin, so with the
model busy every camera gets its share and none waits behind another. A camera with no new frame
is passed over, never waited on; one that fails or stalls reconnects on its own thread while the
others keep being served. Every mailbox wakes one shared event, so an idle loop sleeps on that
event instead of polling each camera.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from edgekit.camera.mailbox import FrameMailbox
from edgekit.camera.motion import motion_gate_from
from edgekit.serve.capture import Capture
from edgekit.serve.config.cameras import CameraConfig, motion_settings
from edgekit.serve.stats import Counters, RateMeter, camera_health


class _WakingMailbox(FrameMailbox):
    """A camera's mailbox that also wakes the inference loop, which waits for any camera."""

    def __init__(self, ready: threading.Event):
        super().__init__()
        self._ready = ready

    def put(self, frame: Any) -> bool:
        """Offer the newest frame (see FrameMailbox) and wake the loop."""
        dropped = super().put(frame)
        self._ready.set()
        return dropped

    def wake(self) -> None:
        """Release a waiting ``take`` and the loop (a camera that gave up for good, a stop)."""
        super().wake()
        self._ready.set()


class _BothCounters:
    """What a capture counts goes to its camera's counters and to the daemon's totals."""

    def __init__(self, total: Counters, own: Counters):
        self._both = (total, own)

    def add(self, group: str, **counts: int) -> None:
        """Add ``counts`` to ``group`` of both."""
        for counters in self._both:
            counters.add(group, **counts)


class CameraFeed:
    """One camera of the daemon: its capture, counters, rates and motion gate.

    ``name`` is the camera's name (``""`` for the one unnamed camera). ``count`` adds to its
    counters and the daemon's at once; ``processed`` meters the results made from it.
    """

    def __init__(self, config: CameraConfig, factory: Callable[[str, dict], Any], total: Counters,
                 stop: threading.Event, clock: Callable[[], int], ready: threading.Event):
        self.config = config
        self.name = config.name
        self.counters = Counters()
        both = _BothCounters(total, self.counters)
        self.count = both.add
        self.gate = motion_gate_from(motion_settings(config), text=False) if config.motion else None
        if self.gate is not None:
            self.count("frames", gated=0)  # in /stats and /metrics from the start, not from the first still frame
        self.mailbox = _WakingMailbox(ready)
        self.capture = Capture(config, factory, self.mailbox, both, stop, clock, gate=self.gate)
        self.process_rate = RateMeter(clock=clock)
        self._clock = clock

    def health(self) -> tuple[bool, str | None]:
        """``(ok, why not)``: ok when open and a frame arrived within ``stall_timeout_s``."""
        cap = self.capture
        return camera_health(cap.is_open, cap.error, cap.last_frame_ns, self._clock(), self.config.stall_timeout_s)

    def motion(self) -> dict[str, Any] | None:
        """The gate's counts (``seen``, ``passed``, ``gated``) and the last frame's moving share, or None."""
        if self.gate is None:
            return None
        counts = self.gate.counts()
        return {"seen": counts["seen"], "passed": counts["inferred"], "gated": counts["gated"],
                "last_motion": round(float(self.gate.last_motion), 5)}

    def stats(self) -> dict[str, Any]:
        """This camera's ``/stats`` entry: health, frames, fps, errors, reconnects, motion, source."""
        ok, why = self.health()
        counts = self.counters.snapshot()
        rates = {"camera": self.capture.rates["camera"], "process": self.process_rate,
                 "skipped": self.capture.rates["skipped"]}
        stats: dict[str, Any] = {
            "uri": self.capture.name, "up": int(ok), "frames": counts["frames"],
            "fps": {k: round(m.rate(), 3) for k, m in rates.items()},
            "errors": counts["errors"]["camera"], "reconnects": counts["reconnects"]["camera"],
        }
        if why is not None:
            stats["error"] = why
        motion = self.motion()
        if motion is not None:
            stats["motion"] = motion
        source = self.capture.source_stats()
        if source is not None:
            stats["source"] = source
        return stats


class CameraSet:
    """The daemon's cameras and their turns at the model (see the module docstring).

    ``take`` is for the inference loop only; everything else may be read from any thread.
    """

    def __init__(self, configs: Sequence[CameraConfig], factory: Callable[[str, dict], Any], total: Counters,
                 stop: threading.Event, clock: Callable[[], int]):
        self._ready = threading.Event()
        self.feeds = [CameraFeed(c, factory, total, stop, clock, self._ready) for c in configs]
        self.named = any(feed.name for feed in self.feeds)
        self._next = 0  # the camera whose turn is next

    def start(self) -> None:
        """Start every capture thread."""
        for feed in self.feeds:
            feed.capture.start()

    def take(self, timeout: float) -> tuple[CameraFeed, Any] | None:
        """``(camera, its newest frame)`` of the next camera in turn that has a new frame, waiting
        up to ``timeout`` seconds for one; None when none came (or on ``wake``)."""
        self._ready.clear()  # before looking: a frame put after the look sets it again
        got = self._scan()
        if got is None and self._ready.wait(timeout):
            got = self._scan()
        return got

    def _scan(self) -> tuple[CameraFeed, Any] | None:
        n = len(self.feeds)
        for k in range(n):
            feed = self.feeds[(self._next + k) % n]
            frame = feed.mailbox.take(0)
            if frame is not None:
                self._next = (self._next + k + 1) % n  # the next turn starts after this camera
                return feed, frame
        return None

    def wake(self) -> None:
        """Release a waiting ``take`` (on stop)."""
        self._ready.set()
        for feed in self.feeds:
            feed.mailbox.wake()

    def join(self, timeout_s: float = 1.0) -> None:
        """Wait for the capture threads after ``stop`` was set (see Capture.join)."""
        for feed in self.feeds:
            feed.capture.join(timeout_s=timeout_s)

    @property
    def ended(self) -> bool:
        """Every camera was a clip with ``on_end = "stop"`` and has ended."""
        return all(feed.capture.ended.is_set() for feed in self.feeds)

    @property
    def fatal(self) -> BaseException | None:
        """The error that ended a camera for good (a wrong option, a missing library), if any."""
        return next((f.capture.fatal for f in self.feeds if f.capture.fatal is not None), None)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """``(ok, details)``: ok while at least one camera delivers. One unnamed camera's details
        are ``camera`` and ``camera_error`` as ever; named cameras add ``cameras`` (name -> ok or
        down) and ``camera_errors`` (name -> why) for those down."""
        states = [(feed, *feed.health()) for feed in self.feeds]
        ok = any(good for _, good, _ in states)
        details: dict[str, Any] = {"camera": "ok" if ok else "down"}
        if not ok and states[0][2] is not None:
            details["camera_error"] = states[0][2]
        if self.named:
            details["cameras"] = {feed.name: "ok" if good else "down" for feed, good, _ in states}
            errors = {feed.name: why for feed, good, why in states if not good and why is not None}
            if errors:
                details["camera_errors"] = errors
        return ok, details
