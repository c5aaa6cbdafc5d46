"""The daemon's numbers: thread-safe counters, rate meters, latency percentiles and health.

Everything here is read by the HTTP thread (/healthz, /stats, /metrics) while the capture
thread and the inference loop write, so every piece is safe to use from several threads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from edgekit.metrics import rate, summarize

RATE_WINDOW_S = 5.0  # FPS gauges average over this many seconds


class RateMeter:
    """Events per second over a sliding window, as ``(n - 1) / span`` of the events in it.

    Thread-safe. A meter whose last event is older than the window reads 0 (a stalled
    camera shows 0 fps, not its last rate).
    """

    def __init__(self, window_s: float = RATE_WINDOW_S, clock: Callable[[], int] = time.perf_counter_ns):
        self.window_ns = int(window_s * 1e9)
        self._clock = clock
        self._events: deque[int] = deque(maxlen=100_000)
        self._lock = threading.Lock()

    def add(self, count: int = 1, t_ns: int | None = None) -> None:
        """Record ``count`` events at ``t_ns`` (now by default)."""
        t = self._clock() if t_ns is None else t_ns
        with self._lock:
            self._events.extend([t] * count)

    def rate(self) -> float:
        """Events per second within the window ending now."""
        horizon = self._clock() - self.window_ns
        with self._lock:
            while self._events and self._events[0] < horizon:
                self._events.popleft()
            if not self._events:
                return 0.0
            return rate(len(self._events), self._events[-1] - self._events[0])


_ON_DEMAND = {("frames", "gated")}  # counters that exist once something adds to them


class Counters:
    """Cumulative counters in three groups (``frames``, ``errors``, ``reconnects``), thread-safe.

    :meth:`add` updates several counters of a group at once, so a reader never sees a frame
    counted as captured but not yet as skipped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, int]] = {
            "frames": {"captured": 0, "processed": 0, "skipped": 0, "bad": 0},
            "errors": {"camera": 0, "inference": 0, "output": 0},
            "reconnects": {"camera": 0, "model": 0},
        }

    def add(self, group: str, **counts: int) -> None:
        """Add ``counts`` to the named counters of ``group``; KeyError for a name it does not
        have (``frames.gated`` is there once added: only where a motion gate is)."""
        with self._lock:
            target = self._groups[group]
            for key, n in counts.items():
                if key not in target and (group, key) not in _ON_DEMAND:
                    raise KeyError(f"{group}.{key}")
                target[key] = target.get(key, 0) + n

    def get(self, group: str, key: str) -> int:
        """One counter's value."""
        with self._lock:
            return self._groups[group][key]

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A consistent copy of every group."""
        with self._lock:
            return {name: dict(values) for name, values in self._groups.items()}


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """The /stats latency entry of a window of samples: count, p50, p90, p99, max in ms."""
    if not samples_ns:
        return {"count": 0}
    s = summarize(samples_ns)
    return {"count": s.count, "p50": round(s.p50_ms, 3), "p90": round(s.p90_ms, 3),
            "p99": round(s.p99_ms, 3), "max": round(s.max_ms, 3)}


def camera_health(is_open: bool, error: str, last_frame_ns: int | None, now_ns: int,
                  stall_timeout_s: float) -> tuple[bool, str | None]:
    """``(ok, why not)``: the camera is ok when open and a frame arrived within the stall timeout."""
    ok = is_open and last_frame_ns is not None and now_ns - last_frame_ns < stall_timeout_s * 1e9
    if ok:
        return True, None
    if not is_open and error:
        return False, error
    if last_frame_ns is None:
        return False, "no frame yet"
    return False, f"no frame for {(now_ns - last_frame_ns) / 1e9:.1f} s"


def health_stats(ready: bool, health: dict[str, Any]) -> dict[str, Any]:
    """The /stats ``health`` entry (gauges as 0/1, plus the error texts)."""
    return {"ready": int(ready), "camera": int(health["camera"] == "ok"), "model": int(health["model"] == "ok"),
            **{k: v for k, v in health.items() if "error" in k}}


def stats_line(stats: dict[str, Any]) -> str:
    """One journal line from a /stats dict."""
    f, r, lat = stats["frames"], stats["fps"], stats["latency_ms"]
    return (
        f"frames {f['processed']} processed, {f['skipped']} skipped, {f['bad']} bad; "
        f"fps camera {r['camera']:.1f} process {r['process']:.1f}; "
        f"inference p50 {lat['inference'].get('p50', 0):.2f} ms; end-to-end p99 "
        f"{lat['end_to_end'].get('p99', 0):.2f} ms; ready {bool(stats['health']['ready'])}"
    )
