"""Whether the bounded HTTP server still serves, for ``/healthz``, ``/stats`` and the watchdog.

Its I/O thread is the one thread that answers every client (``/healthz`` included): a bug that
killed it, or a callback that hung it, would leave the port bound and silent while inference
goes on, and nothing would notice. So the thread beats on every turn of its loop and records
why it stopped, and the requests handed to the workers are timed: :meth:`ServerHealth.problem`
says in one line what is wrong, ``""`` when nothing is. A dead or stalled I/O thread stops the
systemd watchdog's pings (the daemon's :class:`~edgekit.serve.systemd.Watchdog`), so systemd
restarts the daemon; workers held past ``WORKER_STALL_S`` make ``/healthz`` say ``503``.
"""

from __future__ import annotations

import threading
import time

IO_STALL_S = 10.0  # the loop turns every poll interval (50 ms): 10 s without a turn is a hang, not load
WORKER_STALL_S = 60.0  # a request waiting or in a handler this long: the workers are stuck (a scrape takes ms)
ERROR_KINDS = ("malformed", "too_large", "timed_out", "refused", "evicted", "internal", "handler")


class ServerHealth:
    """The I/O thread's heartbeat and failure, and the requests the workers hold (thread-safe)."""

    def __init__(self) -> None:
        self.beat = time.monotonic()
        self.failure = ""  # why the I/O loop stopped, when it stopped on an error
        self.running = False
        self._lock = threading.Lock()
        self._jobs: dict[int, float] = {}  # id of a request handed to the workers -> when

    def turned(self, now: float) -> None:
        """The I/O loop went round once."""
        self.beat = now

    def started(self) -> None:
        """The I/O loop starts."""
        self.running, self.failure, self.beat = True, "", time.monotonic()

    def stopped(self, exc: BaseException | None) -> None:
        """The I/O loop ended: on :meth:`shutdown` (``exc`` None) or on an error it could not survive."""
        self.running = False
        if exc is not None:
            self.failure = f"{type(exc).__name__}: {exc}"[:300]

    def job_queued(self, key: int, now: float) -> None:
        with self._lock:
            self._jobs[key] = now

    def job_done(self, key: int) -> None:
        with self._lock:
            self._jobs.pop(key, None)

    def io_problem(self, now: float) -> str:
        """Why the I/O thread does not serve (stopped on an error, or not turning), ``""`` when it does."""
        if self.failure:
            return f"the HTTP endpoint's I/O thread stopped: {self.failure}"
        if self.running and now - self.beat > IO_STALL_S:
            return f"the HTTP endpoint's I/O thread has not turned for {now - self.beat:.0f} s"
        return ""

    def problem(self, now: float) -> str:
        """:meth:`io_problem`, or workers held past ``WORKER_STALL_S``; ``""`` when the endpoint serves."""
        io = self.io_problem(now)
        if io:
            return io
        with self._lock:
            oldest = min(self._jobs.values(), default=now)
            waiting = len(self._jobs)
        if now - oldest > WORKER_STALL_S:
            return (f"the HTTP endpoint's workers hold {waiting} requests, the oldest for {now - oldest:.0f} s "
                    "(a handler is stuck)")
        return ""
