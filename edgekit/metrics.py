"""Honest latency numbers: a stage clock, per-stage recorders, summaries, FPS and machine context.

Conventions (DESIGN.md section 4): time comes from ``time.perf_counter_ns``; warm-up
samples are set aside, not mixed in; a summary reports count, min, mean, std, p50, p90,
p95, p99 and max; raw samples are kept; FPS is ``(n - 1) / (t_last - t_first)`` because n
timestamps span n - 1 intervals (dividing by n overstates it). Every clock is injectable
so tests can drive it by hand.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

Clock = Callable[[], int]
"""A function returning nanoseconds from a monotonic clock (``time.perf_counter_ns``)."""

STAGES = ("capture_wait", "preprocess", "inference", "postprocess", "end_to_end")
"""The stages a pipeline records; ``end_to_end`` runs from the frame's capture time."""


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
    span = int(timestamps_ns[-1]) - int(timestamps_ns[0])
    return (n - 1) * 1e9 / span if span > 0 else 0.0


class LatencyRecorder:
    """Latency samples (ns) of one stage; the first ``warmup`` samples are set aside.

    Warm-up samples (first inference allocations, cold caches) are kept in
    ``warmup_samples`` for inspection but never enter :meth:`summary`.
    """

    def __init__(self, name: str, warmup: int = 0):
        self.name = name
        self.warmup = max(0, int(warmup))
        self.warmup_samples: list[int] = []
        self.samples: list[int] = []

    def add(self, ns: int) -> None:
        """Record one sample in nanoseconds."""
        if len(self.warmup_samples) < self.warmup:
            self.warmup_samples.append(int(ns))
        else:
            self.samples.append(int(ns))

    def __len__(self) -> int:
        return len(self.samples)

    def summary(self, last: int | None = None) -> LatencySummary:
        """Statistics of the kept samples (of the ``last`` ones only, for live stats lines)."""
        return summarize(self.samples[-last:] if last else self.samples)


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
    """Per-stage recorders plus frame accounting for one pipeline run.

    ``init_ms`` (runtime load) and ``first_inference_ms`` are reported on their own: both
    are one-off costs a user pays at start-up and would distort the steady state.
    ``skipped`` counts frames the source produced but the pipeline never saw (gaps in
    ``Frame.index``: newest-frame semantics drop stale frames by design); ``corrupt``
    counts frames that could not be preprocessed.
    """

    warmup: int = 5
    stages: dict[str, LatencyRecorder] = field(default_factory=dict)
    completed_ns: list[int] = field(default_factory=list)
    frames: int = 0
    skipped: int = 0
    corrupt: int = 0
    init_ms: float | None = None
    first_inference_ms: float | None = None
    _last_index: int | None = None

    def __post_init__(self) -> None:
        if not self.stages:
            self.stages = {s: LatencyRecorder(s, self.warmup) for s in STAGES}

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
            self.stages.setdefault(stage, LatencyRecorder(stage, self.warmup)).add(ns)
        if self.frames > self.warmup:
            self.completed_ns.append(int(t_done_ns))

    @property
    def fps(self) -> float:
        """Steady-state frames per second (warm-up excluded)."""
        return fps(self.completed_ns)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary: frame counts, FPS, one-off costs and per-stage statistics."""
        return {
            "frames": self.frames,
            "warmup": min(self.warmup, self.frames),
            "measured": max(0, self.frames - self.warmup),
            "skipped": self.skipped,
            "corrupt": self.corrupt,
            "fps": self.fps,
            "init_ms": self.init_ms,
            "first_inference_ms": self.first_inference_ms,
            "stages": {name: rec.summary().to_dict() for name, rec in self.stages.items()},
        }

    def samples_ms(self, stage: str = "inference") -> list[float]:
        """Raw kept samples of one stage, in milliseconds."""
        return [s / 1e6 for s in self.stages[stage].samples]

    def stats_line(self, last: int = 100) -> str:
        """A one-line live summary over the latest ``last`` frames."""
        inf = self.stages["inference"].summary(last)
        e2e = self.stages["end_to_end"].summary(last)
        recent = self.completed_ns[-last:]
        return (
            f"frames {self.frames}  fps {fps(recent):.1f}  inference p50 {inf.p50_ms:.2f} ms "
            f"p90 {inf.p90_ms:.2f} ms  end-to-end p50 {e2e.p50_ms:.2f} ms  "
            f"skipped {self.skipped}  corrupt {self.corrupt}"
        )


# ---------------------------------------------------------------------------------------------
# Machine context: what a reader needs to trust (or distrust) a number.

_SYS_CPU = Path("/sys/devices/system/cpu")
_LIBRARIES = (
    "edgekit",
    "numpy",
    "opencv-python-headless",
    "opencv-python",
    "ai-edge-litert",
    "tflite-runtime",
    "onnxruntime",
    "onnxruntime-gpu",
    "tensorrt",
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU (or board) model from /proc/cpuinfo and the device tree, else platform."""
    info = _read(Path("/proc/cpuinfo")) or ""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        for line in info.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    board = _read(Path("/proc/device-tree/model"))
    return (board or platform.processor() or platform.machine()).strip("\x00")


def governors() -> dict[str, str]:
    """cpufreq scaling governor per CPU (empty where the kernel does not expose it)."""
    out = {}
    for path in sorted(_SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_governor")):
        value = _read(path)
        if value:
            out[path.parent.parent.name] = value
    return out


def temperatures() -> dict[str, float]:
    """Thermal zone temperatures in degrees Celsius, keyed by zone type."""
    out = {}
    for zone in sorted(Path("/sys/class/thermal").glob("thermal_zone*")):
        raw = _read(zone / "temp")
        if raw and raw.lstrip("-").isdigit():
            out[_read(zone / "type") or zone.name] = int(raw) / 1000.0
    return out


def throttling() -> dict[str, Any]:
    """Throttling evidence where readable: Raspberry Pi firmware flags, thermal throttle counters."""
    out: dict[str, Any] = {}
    pi = _read(Path("/sys/devices/platform/soc/soc:firmware/get_throttled"))
    if pi is not None:
        out["rpi_get_throttled"] = pi  # bit 2: throttled now; bit 18: has throttled since boot
    counts = [_read(p) for p in _SYS_CPU.glob("cpu[0-9]*/thermal_throttle/core_throttle_count")]
    if counts:
        out["core_throttle_count"] = sum(int(c) for c in counts if c and c.isdigit())
    return out


def library_versions(extra: Iterable[str] = ()) -> dict[str, str]:
    """Installed versions of the libraries that decide the numbers (installed ones only)."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in (*_LIBRARIES, *extra):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def machine_context(extra_libraries: Iterable[str] = ()) -> dict[str, Any]:
    """Everything recorded with a benchmark result, plus ``warnings`` about trustworthiness.

    Warns when the cpufreq governor is not ``performance`` (frequency scaling moves the
    numbers, as pycoral's benchmarks warn) or cannot be read.
    """
    govs = governors()
    warnings = []
    if not govs:
        warnings.append("cpufreq governor not readable (VM or container?): clock speed may vary")
    elif any(g != "performance" for g in govs.values()):
        found = ", ".join(sorted(set(govs.values())))
        warnings.append(f"CPU governor is {found}, not 'performance': latencies may vary with clock scaling")
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux
        load = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        usable = os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "governor": sorted(set(govs.values()))[0] if len(set(govs.values())) == 1 else govs or None,
        "temperatures_c": temperatures(),
        "throttling": throttling(),
        "load_average": list(load) if load else None,
        "libraries": library_versions(extra_libraries),
        "warnings": warnings,
    }
