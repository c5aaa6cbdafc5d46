"""Latency recorder (raw and bounded), summaries, FPS and machine context (a fake clock where time matters)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgekit.bench import machine
from edgekit.bench.machine import machine_context
from edgekit.metrics import LatencyRecorder, PipelineMetrics, StageClock, fps, summarize


class FakeClock:
    """A nanosecond clock that moves only when told to."""

    def __init__(self, start: int = 1_000_000):
        self.t = start

    def __call__(self) -> int:
        return self.t

    def advance(self, ms: float) -> None:
        self.t += int(ms * 1e6)


def test_fps_counts_intervals_not_timestamps():
    # 11 frames 100 ms apart span 1 s: 10 intervals -> 10 FPS (n / span would say 11).
    clock = FakeClock()
    stamps = []
    for _ in range(11):
        stamps.append(clock())
        clock.advance(100)
    assert fps(stamps) == pytest.approx(10.0)
    assert fps(stamps[:1]) == 0.0
    assert fps([5, 5]) == 0.0  # no span, no rate


def test_summary_matches_numpy_and_reports_every_statistic():
    rng = np.random.default_rng(1)
    ms = rng.gamma(4.0, 0.5, size=1000)
    s = summarize((ms * 1e6).astype(np.int64))
    a = np.floor(ms * 1e6) / 1e6  # the samples are whole nanoseconds
    assert s.count == 1000
    assert s.min_ms == pytest.approx(a.min()) and s.max_ms == pytest.approx(a.max())
    assert s.mean_ms == pytest.approx(a.mean())
    assert s.std_ms == pytest.approx(a.std(ddof=1))
    for q, got in zip((50, 90, 95, 99), (s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms)):
        assert got == pytest.approx(np.percentile(a, q))
    assert s.min_ms <= s.p50_ms <= s.p90_ms <= s.p95_ms <= s.p99_ms <= s.max_ms
    assert s.to_dict()["cv"] == pytest.approx(s.std_ms / s.mean_ms)


def test_empty_and_single_sample_summaries():
    assert summarize([]).count == 0 and math.isnan(summarize([]).p50_ms)
    one = summarize([2_000_000])
    assert (one.count, one.p99_ms, one.std_ms) == (1, 2.0, 0.0)


def test_recorder_sets_warmup_aside_and_keeps_raw_samples():
    rec = LatencyRecorder("inference", warmup=3)
    for ns in [50_000_000, 40_000_000, 30_000_000, 1_000_000, 2_000_000, 3_000_000]:
        rec.add(ns)
    assert rec.warmup_samples == [50_000_000, 40_000_000, 30_000_000]
    assert rec.samples == [1_000_000, 2_000_000, 3_000_000]
    assert rec.summary().max_ms == 3.0  # the slow first inferences do not leak in
    assert rec.summary(last=1).p50_ms == 3.0


def test_stage_clock_laps_with_a_fake_clock():
    clock = FakeClock()
    stages = StageClock(clock)
    stages.mark()
    clock.advance(2)
    assert stages.lap() == 2_000_000
    clock.advance(0.5)
    assert stages.lap() == 500_000
    assert stages.last == clock()


def test_pipeline_metrics_first_inference_skips_and_fps():
    clock = FakeClock()
    m = PipelineMetrics(warmup=2)
    for i, index in enumerate([0, 1, 2, 5, 6, 7]):  # frames 3 and 4 never reached us
        m.frame_seen(index)
        clock.advance(10)
        m.record({"inference": (30 if i == 0 else 4) * 1_000_000, "end_to_end": 6_000_000}, clock())
    s = m.summary()
    assert s["first_inference_ms"] == 30.0
    assert s["skipped"] == 2
    assert (s["frames"], s["warmup"], s["measured"]) == (6, 2, 4)
    assert s["stages"]["inference"]["count"] == 4 and s["stages"]["inference"]["max_ms"] == 4.0
    assert s["fps"] == pytest.approx(100.0)  # 4 completions 10 ms apart
    assert "fps 100.0" in m.stats_line()
    assert m.samples_ms("inference") == [4.0] * 4


def test_bounded_recorder_keeps_the_newest_samples_and_exact_totals():
    rng = np.random.default_rng(2)
    ns = rng.integers(1_000_000, 9_000_000, size=500)
    raw, bounded = LatencyRecorder("inference", warmup=2), LatencyRecorder("inference", warmup=2, window=100)
    for x in ns:
        raw.add(x)
        bounded.add(x)
    assert len(bounded) == 100 and bounded.count == 498 == len(raw)
    assert bounded.recent() == [int(x) for x in ns[-100:]]
    whole, window = raw.summary(), bounded.summary()
    # count, min, mean, std and max are exact over every sample; percentiles cover the window
    assert window.count == whole.count
    for key in ("min_ms", "mean_ms", "std_ms", "max_ms"):
        assert getattr(window, key) == pytest.approx(getattr(whole, key), rel=1e-12), key
    assert window.p50_ms == pytest.approx(np.percentile(ns[-100:] / 1e6, 50))
    assert bounded.summary(last=10).count == 10 and bounded.recent(3) == [int(x) for x in ns[-3:]]


def test_bounded_pipeline_metrics_stay_small_and_report_like_raw_until_the_window_fills():
    clock = FakeClock()
    raw, bounded = PipelineMetrics(warmup=1), PipelineMetrics(warmup=1, window=50)
    for i in range(40):
        clock.advance(10)
        for m in (raw, bounded):
            m.frame_seen(i)
            m.record({"inference": (i % 7 + 1) * 1_000_000, "end_to_end": 2_000_000}, clock())
    short_raw, short_bounded = raw.summary(), bounded.summary()
    assert short_bounded.pop("window") == 50 and short_raw.pop("window") is None
    assert short_bounded == short_raw  # a run shorter than the window: exactly the raw numbers
    for i in range(40, 5000):
        clock.advance(10)
        bounded.frame_seen(i)
        bounded.record({"inference": 4_000_000, "end_to_end": 5_000_000}, clock())
    s = bounded.summary()
    assert len(bounded.completed_ns) == 50 and len(bounded.stages["inference"]) == 50
    assert s["frames"] == 5000 and s["stages"]["inference"]["count"] == 4999
    assert s["fps"] == pytest.approx(100.0)  # over the whole run, not only the window
    assert s["stages"]["inference"]["max_ms"] == 7.0  # the early slow frames are not forgotten
    assert s["stages"]["inference"]["p99_ms"] == 4.0  # percentiles: the newest 50 frames
    assert "fps 100.0" in bounded.stats_line(last=20)


def test_machine_context_is_still_importable_from_metrics():
    assert machine_context is machine.machine_context


def _fake_sysfs(tmp_path, governor: str | None):
    for cpu in ("cpu0", "cpu1"):
        d = tmp_path / cpu / "cpufreq"
        d.mkdir(parents=True)
        if governor:
            (d / "scaling_governor").write_text(governor + "\n")
    return tmp_path


def test_machine_context_warns_when_governor_is_not_performance(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "_SYS_CPU", _fake_sysfs(tmp_path, "powersave"))
    ctx = machine.machine_context()
    assert ctx["governor"] == "powersave"
    assert any("not 'performance'" in w for w in ctx["warnings"])


def test_machine_context_quiet_with_performance_governor(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "_SYS_CPU", _fake_sysfs(tmp_path, "performance"))
    ctx = machine.machine_context()
    assert ctx["governor"] == "performance" and ctx["warnings"] == []


def test_machine_context_on_this_machine():
    ctx = machine.machine_context()
    assert ctx["cpu_model"] and ctx["cores"] >= 1 and ctx["cores_usable"] >= 1
    assert ctx["libraries"]["numpy"] == np.__version__
    assert "ai-edge-litert" in ctx["libraries"]
    assert isinstance(ctx["temperatures_c"], dict) and isinstance(ctx["throttling"], dict)
    if not machine.governors():  # containers and VMs hide cpufreq: say so rather than guess
        assert any("not readable" in w for w in ctx["warnings"])


# --- values, boundaries and branches the mutation run found unpinned (issue 18, docs/mutation.md) ------


def test_rate_and_fps_at_their_boundaries_are_exact():
    from edgekit.metrics import rate

    assert rate(11, 1_000_000_000) == 10.0  # exactly: (n - 1) * 1e9 / span
    assert rate(2, 1_000_000_000) == 1.0  # two events are one interval
    assert rate(2, 1) == 1e9  # a 1 ns span is still a span
    assert rate(1, 1_000_000_000) == 0.0 and rate(2, 0) == 0.0 and rate(3, -5) == 0.0
    assert fps([0, 500_000_000]) == 2.0


def test_two_samples_have_a_sample_std():
    s = summarize([1_000_000, 3_000_000])
    assert s.std_ms == pytest.approx(math.sqrt(2)) and s.cv == pytest.approx(math.sqrt(2) / 2)


def test_bounded_totals_remember_an_extreme_first_sample_and_std_of_two():
    for samples, key, expected in (([1, 5, 6, 7], "min_ms", 1.0), ([9, 5, 6, 7], "max_ms", 9.0)):
        rec = LatencyRecorder("inference", window=2)
        for ms in samples:
            rec.add(ms * 1_000_000)
        assert rec.recent() == [6_000_000, 7_000_000]
        assert getattr(rec.summary(), key) == expected, key
    two = LatencyRecorder("inference", window=1)
    two.add(1_000_000)
    two.add(3_000_000)
    assert two.summary().count == 2 and two.summary().std_ms == pytest.approx(math.sqrt(2))


def test_one_sample_has_no_spread():
    from edgekit.metrics import _Totals

    totals = _Totals()
    totals.add(5_000_000)
    assert totals.std_ms() == 0.0 and (totals.low, totals.high) == (5_000_000, 5_000_000)


def test_bounded_summary_reports_every_percentile_of_the_window():
    rec = LatencyRecorder("inference", window=100)
    for i in range(300):
        rec.add((i % 100 + 1) * 1_000_000)  # the newest 100: 1..100 ms once each
    s = rec.summary()
    assert s.count == 300
    window = np.arange(1, 101) / 1.0
    for q, got in zip((50, 90, 95, 99), (s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms)):
        assert got == pytest.approx(np.percentile(window, q)), q


def test_a_recorder_keeps_its_name_window_and_no_warmup_by_default():
    rec = LatencyRecorder("decode", window=100)
    assert (rec.name, rec.window, rec.warmup) == ("decode", 100, 0)
    rec.add(5)
    assert rec.recent() == [5] and rec.warmup_samples == []
    assert LatencyRecorder("x", warmup=0).warmup == 0 and LatencyRecorder("x", warmup=-3).warmup == 0


def test_stage_clock_starts_timing_when_made():
    clock = FakeClock()
    stages = StageClock(clock)
    clock.advance(3)
    assert stages.lap() == 3_000_000  # no mark needed for the first lap


def test_pipeline_metrics_has_one_named_recorder_per_stage_and_keeps_given_ones():
    from edgekit.metrics import STAGES

    m = PipelineMetrics()
    assert list(m.stages) == list(STAGES)
    assert all(rec.name == name for name, rec in m.stages.items())
    mine = {"inference": LatencyRecorder("inference")}
    assert PipelineMetrics(stages=mine).stages is mine
    m.record({"decode": 2_000_000}, 10)
    assert m.stages["decode"].name == "decode" and m.stages["decode"].warmup == 5


def test_a_bounded_run_keeps_the_newest_completions_it_was_given():
    m = PipelineMetrics(window=3, completed_ns=[1, 2, 3, 4])
    assert list(m.completed_ns) == [2, 3, 4]


def test_skipped_frames_add_up_over_gaps_and_ignore_repeats_and_restarts():
    m = PipelineMetrics()
    for index in (0, 2, 2, 5, 6, 1, 2):  # one gap of 1, a repeat, a gap of 2, a restart at 1
        m.frame_seen(index)
    assert m.skipped == 3


def test_completions_during_warmup_are_not_counted_in_fps():
    m = PipelineMetrics(warmup=2)
    for t_ms in (10, 20, 50, 60):  # warm-up frames at 10 and 20 ms; measured at 50 and 60 ms
        m.record({"inference": 1_000_000}, t_ms * 1_000_000)
    assert list(m.completed_ns) == [50_000_000, 60_000_000]
    assert m.fps == pytest.approx(100.0)


def test_fps_from_a_clock_that_starts_at_zero():
    m = PipelineMetrics(warmup=0)
    for t in (0, 1_000_000_000, 2_000_000_000):
        m.record({"inference": 1}, t)
    assert m.fps == 1.0


def test_summary_of_nothing_and_its_every_key():
    m = PipelineMetrics(warmup=5)
    s = m.summary()
    assert (s["frames"], s["warmup"], s["measured"], s["fps"]) == (0, 0, 0, 0.0)
    m.corrupt, m.init_ms = 2, 12.5
    m.record({"inference": 3_000_000}, 1)
    s = m.summary()
    assert set(s) == {"frames", "warmup", "measured", "skipped", "corrupt", "fps", "init_ms",
                      "first_inference_ms", "window", "stages"}
    assert (s["corrupt"], s["init_ms"], s["first_inference_ms"], s["window"]) == (2, 12.5, 3.0, None)


def test_samples_ms_defaults_to_inference():
    m = PipelineMetrics(warmup=0)
    m.record({"inference": 2_000_000, "preprocess": 1_000_000}, 1)
    assert m.samples_ms() == [2.0] and m.samples_ms("preprocess") == [1.0]


def test_stats_line_covers_the_latest_hundred_frames_by_default():
    clock = FakeClock()
    m = PipelineMetrics(warmup=0)
    for i in range(250):
        clock.advance(10 if i < 200 else 20)
        slow = i < 200
        m.frame_seen(i)
        m.record({"inference": (9 if slow else 1) * 1_000_000, "end_to_end": (19 if slow else 3) * 1_000_000},
                 clock())
    # the latest 100 frames: 50 slow and 50 fast (p50 halfway), 99 intervals of 10 ms x 49 and 20 ms x 50
    assert m.stats_line() == ("frames 250  fps 66.4  inference p50 5.00 ms p90 9.00 ms  end-to-end p50 11.00 ms  "
                              "skipped 0  corrupt 0")


def test_a_stage_first_seen_after_the_warm_up_keeps_every_sample():
    # a cascade files its second stage by region count (second_stage@k=N): a key first seen at frame 8 of a
    # run with warm-up 5 must keep its samples, and one first seen at frame 3 sets aside only frames 3-5
    m = PipelineMetrics(warmup=5)
    for frame in range(1, 11):
        stages = {"inference": 1_000}
        if frame >= 3:
            stages["late_from_3"] = 2_000
        if frame >= 8:
            stages["late_from_8"] = 3_000
        m.record(stages, frame * 1_000_000)
    summary = m.summary()["stages"]
    assert summary["inference"]["count"] == 5
    assert summary["late_from_3"]["count"] == 5 and summary["late_from_8"]["count"] == 3
