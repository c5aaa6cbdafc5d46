"""Honest latency numbers: a stage clock, per-stage recorders (the pipeline's sink), summaries, FPS.

Conventions (docs/design.md, measurement conventions): time comes from ``time.perf_counter_ns``; warm-up
samples are set aside, not mixed in; a summary reports count, min, mean, std, p50, p90,
p95, p99 and max; FPS is ``(n - 1) / (t_last - t_first)`` because n timestamps span n - 1
intervals (dividing by n overstates it). Every clock is injectable so tests can drive it by hand.

Two ways to keep samples, chosen by ``window``:

- raw (``window=None``): every sample is kept, for ``edgekit bench`` and evaluation, which
  plot and re-analyse them. Memory grows with the run.
- bounded (``window=N``): only the newest N samples per stage are kept, so a process that
  runs for weeks (``edgekit serve``, a long ``edgekit run``) does not grow. The summary stays
  honest: count, min, mean, std, max and FPS are exact running values over the whole run;
  only the percentiles cover the newest N samples (the summary says ``window: N``). A run
  shorter than N gives exactly the raw numbers.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# Machine context moved to its own module (one idea per module); kept importable from here.

Clock = Callable[[], int]
"""A function returning nanoseconds from a monotonic clock (``time.perf_counter_ns``)."""

STAGES = ("capture_wait", "preprocess", "inference", "postprocess", "end_to_end")
"""The stages a pipeline records; ``end_to_end`` runs from the frame's capture time."""

RUN_WINDOW = 50_000
"""Samples per stage a long-running loop keeps (``edgekit run``, the robot demo): about
28 minutes at 30 fps and a few MB in all. Runs shorter than this report exactly what
keeping every sample would; longer ones keep exact totals and recent percentiles."""


@dataclass(frozen=True)
class LatencySummary:
    """Statistics of one set of latency samples, in milliseconds.

    ``std_ms`` is the sample standard deviation (n - 1 in the denominator); ``cv`` is
    ``std / mean``, the noise measure ``edgekit bench`` warns about.
    """

    count: int
    min_ms: float
    mean_ms: float
    std_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    @property
    def cv(self) -> float:
        return self.std_ms / self.mean_ms if self.mean_ms > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["cv"] = self.cv
        return d


EMPTY_SUMMARY = LatencySummary(0, *(math.nan,) * 8)


def summarize(samples_ns: Iterable[int]) -> LatencySummary:
    """Summarise latency samples given in nanoseconds. An empty input gives NaNs and count 0."""
    a = np.asarray(list(samples_ns), dtype=np.float64) / 1e6
    if a.size == 0:
        return EMPTY_SUMMARY
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    std = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return LatencySummary(
        count=int(a.size),
        min_ms=float(a.min()),
        mean_ms=float(a.mean()),
        std_ms=std,
        p50_ms=float(p50),
        p90_ms=float(p90),
        p95_ms=float(p95),
        p99_ms=float(p99),
        max_ms=float(a.max()),
    )


def fps(timestamps_ns: list[int] | np.ndarray) -> float:
    """Frames per second over completion timestamps: ``(n - 1) / (t_last - t_first)``.

    Returns 0.0 with fewer than two timestamps or a zero span (no interval to measure).
    """
    n = len(timestamps_ns)
    if n < 2:
        return 0.0
    return rate(n, int(timestamps_ns[-1]) - int(timestamps_ns[0]))


def rate(events: int, span_ns: int) -> float:
    """Events per second of ``events`` timestamps spanning ``span_ns``: ``(n - 1) / span``.

    The one place the FPS formula lives (:func:`fps`, bounded recorders and the daemon's
    rate meters all come here). 0.0 with fewer than two events or a zero span.
    """
    return (events - 1) * 1e9 / span_ns if events >= 2 and span_ns > 0 else 0.0


def tail(samples: Sequence[int] | deque, last: int | None) -> list[int]:
    """The newest ``last`` items of a list or deque (all of them when ``last`` is falsy)."""
    if not last:
        return list(samples)
    if isinstance(samples, deque):  # deques do not slice; walk back from the newest end
        return list(itertools.islice(reversed(samples), last))[::-1]
    return list(samples[-last:])


class _Totals:
    """Exact running count, sum, sum of squares, min and max of integer samples.

    Python integers do not overflow, so the variance from these sums is exact however long
    the run (a float accumulator would lose the small differences of a week of samples).
    """

    __slots__ = ("count", "total", "squares", "low", "high")

    def __init__(self) -> None:
        self.count = self.total = self.squares = 0
        self.low = self.high = 0

    def add(self, ns: int) -> None:
        if self.count == 0 or ns < self.low:
            self.low = ns
        if self.count == 0 or ns > self.high:
            self.high = ns
        self.count += 1
        self.total += ns
        self.squares += ns * ns

    def std_ms(self) -> float:
        n = self.count
        if n < 2:
            return 0.0
        return math.sqrt((n * self.squares - self.total * self.total) / (n * (n - 1))) / 1e6


class LatencyRecorder:
    """Latency samples (ns) of one stage; the first ``warmup`` samples are set aside.

    Warm-up samples (first inference allocations, cold caches) are kept in
    ``warmup_samples`` for inspection but never enter :meth:`summary`. With ``window`` set
    only the newest ``window`` samples are kept (see the module docstring for what the
    summary then reports). ``add`` and :meth:`recent` are thread-safe, so another thread
    (an HTTP /stats handler) may read while the frame loop records.
    """

    def __init__(self, name: str, warmup: int = 0, window: int | None = None):
        self.name = name
        self.warmup = max(0, int(warmup))
        self.window = window
        self.warmup_samples: list[int] = []
        self.samples: list[int] | deque[int] = [] if window is None else deque(maxlen=window)
        self._totals = _Totals()
        self._lock = threading.Lock()

    def add(self, ns: int) -> None:
        """Record one sample in nanoseconds."""
        ns = int(ns)
        with self._lock:
            if len(self.warmup_samples) < self.warmup:
                self.warmup_samples.append(ns)
                return
            self.samples.append(ns)
            self._totals.add(ns)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def count(self) -> int:
        """Samples recorded after warm-up, including those a bounded window has dropped."""
        return self._totals.count

    def recent(self, last: int | None = None) -> list[int]:
        """A copy of the kept samples (the newest ``last`` only), safe to read from any thread."""
        with self._lock:
            return tail(self.samples, last)

    def summary(self, last: int | None = None) -> LatencySummary:
        """Statistics of the kept samples (of the ``last`` ones only, for live stats lines).

        When a bounded window has dropped samples, count, min, mean, std and max still
        cover every sample; the percentiles cover the window.
        """
        with self._lock:
            kept = tail(self.samples, last)
            totals = self._totals
            whole = last is None and totals.count > len(kept)
            if whole:
                exact = (totals.count, totals.low, totals.total, totals.high, totals.std_ms())
        s = summarize(kept)
        if not whole:
            return s
        count, low, total, high, std = exact
        return LatencySummary(count, low / 1e6, total / count / 1e6, std, s.p50_ms, s.p90_ms, s.p95_ms,
                              s.p99_ms, high / 1e6)


class StageClock:
    """Time consecutive stages with one clock: ``lap()`` returns ns since the previous mark.

    >>> clock = StageClock()                                     # doctest: +SKIP
    >>> clock.mark(); tensor = pre(frame); t_pre = clock.lap()
    """

    def __init__(self, clock: Clock = time.perf_counter_ns):
        self.now = clock
        self._last = clock()

    def mark(self) -> int:
        """Start timing from now; returns the timestamp."""
        self._last = self.now()
        return self._last

    def lap(self) -> int:
        """Nanoseconds since the previous mark or lap; starts the next lap."""
        t = self.now()
        elapsed, self._last = t - self._last, t
        return elapsed

    @property
    def last(self) -> int:
        """Timestamp of the latest mark or lap."""
        return self._last


@dataclass
class PipelineMetrics:
    """Per-stage recorders plus frame accounting for one pipeline run: the pipeline's sink.

    ``init_ms`` (runtime load) and ``first_inference_ms`` are reported on their own: both
    are one-off costs a user pays at start-up and would distort the steady state.
    ``skipped`` counts frames the source produced but the pipeline never saw (gaps in
    ``Frame.index``: newest-frame semantics drop stale frames by design); ``corrupt``
    counts frames that could not be preprocessed.

    ``window=None`` keeps every sample (bench, evaluation); ``window=N`` keeps the newest N
    per stage for processes that run for days (serve, long runs), with exact totals and FPS
    (module docstring).
    """

    warmup: int = 5
    window: int | None = None
    stages: dict[str, LatencyRecorder] = field(default_factory=dict)
    completed_ns: list[int] | deque[int] = field(default_factory=list)
    frames: int = 0
    skipped: int = 0
    corrupt: int = 0
    init_ms: float | None = None
    first_inference_ms: float | None = None
    _last_index: int | None = None
    _done: list[int] = field(default_factory=lambda: [0, 0, 0])  # count, first, last completion after warm-up

    def __post_init__(self) -> None:
        if not self.stages:
            self.stages = {s: self._recorder(s) for s in STAGES}
        if self.window is not None and not isinstance(self.completed_ns, deque):
            self.completed_ns = deque(self.completed_ns, maxlen=self.window)

    def _recorder(self, stage: str) -> LatencyRecorder:
        return LatencyRecorder(stage, self.warmup, self.window)

    def frame_seen(self, index: int) -> None:
        """Account for a frame's index: a gap since the previous one means skipped frames."""
        if self._last_index is not None and index > self._last_index + 1:
            self.skipped += index - self._last_index - 1
        self._last_index = index

    def record(self, timings_ns: dict[str, int], t_done_ns: int) -> None:
        """Record one completed frame: stage durations (ns) and its completion time."""
        if self.frames == 0 and "inference" in timings_ns:
            self.first_inference_ms = timings_ns["inference"] / 1e6
        self.frames += 1
        for stage, ns in timings_ns.items():
            recorder = self.stages.get(stage)
            if recorder is None:  # first seen at this frame: only the run's warm-up frames left are set aside
                recorder = self.stages[stage] = LatencyRecorder(stage, max(0, self.warmup - self.frames + 1),
                                                                self.window)
            recorder.add(ns)
        if self.frames > self.warmup:
            t = int(t_done_ns)
            self.completed_ns.append(t)
            done = self._done
            done[0] += 1
            done[1] = done[1] if done[0] > 1 else t
            done[2] = t

    @property
    def fps(self) -> float:
        """Steady-state frames per second (warm-up excluded), over the whole run."""
        count, first, last = self._done
        return rate(count, last - first)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary: frame counts, FPS, one-off costs and per-stage statistics.

        ``window`` is None when every sample was kept, else how many of the newest samples
        the percentiles cover.
        """
        return {
            "frames": self.frames,
            "warmup": min(self.warmup, self.frames),
            "measured": max(0, self.frames - self.warmup),
            "skipped": self.skipped,
            "corrupt": self.corrupt,
            "fps": self.fps,
            "init_ms": self.init_ms,
            "first_inference_ms": self.first_inference_ms,
            "window": self.window,
            "stages": {name: rec.summary().to_dict() for name, rec in self.stages.items()},
        }

    def samples_ms(self, stage: str = "inference") -> list[float]:
        """Kept samples of one stage, in milliseconds (all of them unless bounded)."""
        return [s / 1e6 for s in self.stages[stage].recent()]

    def stats_line(self, last: int = 100) -> str:
        """A one-line live summary over the latest ``last`` frames."""
        inf = self.stages["inference"].summary(last)
        e2e = self.stages["end_to_end"].summary(last)
        recent = tail(self.completed_ns, last)
        return (
            f"frames {self.frames}  fps {fps(recent):.1f}  inference p50 {inf.p50_ms:.2f} ms "
            f"p90 {inf.p90_ms:.2f} ms  end-to-end p50 {e2e.p50_ms:.2f} ms  "
            f"skipped {self.skipped}  corrupt {self.corrupt}"
        )
