"""Speed truth at build time (edgekit/builders/gate/speed.py): every TFLite variant timed side by side,
the default moved only past a clear margin, slow variants named with their off-delegate ops."""

from __future__ import annotations

import pytest

from edgekit.bench.default_choice import PROMISE
from edgekit.builders.gate.speed import CLEAR_MARGIN, DEFAULT_MARGIN, Speed, choose_default, slow_variant_lines


def _speeds(**p50) -> dict[str, Speed]:
    return {name: Speed(ms, 100, {"HARD_SWISH": 18, "RELU_0_TO_1": 9} if name == "int8" else {})
            for name, ms in p50.items()}


def test_default_moves_only_to_a_clearly_faster_passing_variant():
    speeds = _speeds(fp32=1.0, fp16=0.97, int8=0.5)
    assert choose_default("fp32", ["fp32", "fp16", "int8"], speeds) == "int8"  # 2x faster
    assert choose_default("fp32", ["fp32", "fp16"], speeds) == "fp32"  # 3 % is noise here
    assert choose_default("fp32", ["fp16"], speeds) == "fp16"  # the configured one failed
    close = _speeds(fp32=1.0, int8=1.0 / (DEFAULT_MARGIN - 0.01))
    assert choose_default("fp32", ["fp32", "int8"], close) == "fp32"
    # the figure: a default never more than 1.15x slower than the fastest passing variant
    assert DEFAULT_MARGIN < PROMISE and choose_default("fp32", ["fp32", "int8"], _speeds(fp32=1.2, int8=1.0)) == "int8"
    assert slow_variant_lines("cpu", _speeds(fp32=1.0, int8=1.0 * (CLEAR_MARGIN - 0.01)), "fp32") == []


def test_one_round_that_disagrees_keeps_the_configured_default():
    """A burst of load on the shared machine that lands on one variant's slot in one round makes its
    overall p50 look clearly slower; the other rounds say they are alike, so nothing moves."""
    noisy = {"fp32": Speed(1.4, 90, {}, (1.0, 1.0, 2.6)), "fp16": Speed(1.0, 90, {}, (1.0, 1.0, 1.0))}
    assert choose_default("fp32", ["fp32", "fp16"], noisy) == "fp32"
    assert slow_variant_lines("cpu", noisy, "fp32") == []
    steady = {"fp32": Speed(1.0, 90, {}, (1.0, 1.1, 0.9)), "int8": Speed(0.5, 90, {}, (0.5, 0.6, 0.4))}
    assert choose_default("fp32", ["fp32", "int8"], steady) == "int8"


def test_a_variant_slower_than_fp32_is_named_with_its_ops():
    lines = slow_variant_lines("cpu", _speeds(fp32=0.84, fp16=0.8, int8=7.42), "fp16")
    assert lines == ["[cpu] int8: HARD_SWISH x18, RELU_0_TO_1 x9 run on built-in kernels: 8.8x slower than fp32 on "
                     "this host (p50 7.42 vs 0.84 ms); default is fp16"]
    assert slow_variant_lines("cpu", _speeds(fp32=1.0, int8=1.2), "fp32") == []


@pytest.mark.slow
def test_every_variant_of_a_build_carries_its_measured_ratio(demo_bundles):
    from edgekit.bundle import load_bundle

    bundle = load_bundle(demo_bundles["cpu"].bundle)
    speeds = {m.name: m.extra["speed"] for m in bundle.models}
    assert set(speeds) == {"fp32", "fp16", "int8"}
    assert speeds["fp32"]["vs_fp32"] == 1.0 and all(s["runs"] >= 5 and s["p50_ms"] > 0 for s in speeds.values())
    assert speeds["int8"]["off_delegate"] == {} or all(n > 0 for n in speeds["int8"]["off_delegate"].values())
    log = (demo_bundles["cpu"].bundle / "build.log").read_text()
    assert "[cpu] p50 on this host: fp32" in log and f"default {bundle.manifest['default_model']}" in log


def test_the_timing_budget_comes_from_the_environment_and_is_range_checked(monkeypatch):
    from edgekit.builders.gate.speed import DEFAULT_BUDGET_S, TIMING_ENV, timing_budget
    from edgekit.errors import UsageError

    monkeypatch.delenv(TIMING_ENV, raising=False)
    assert timing_budget() == DEFAULT_BUDGET_S == 1.5
    monkeypatch.setenv(TIMING_ENV, "0")
    assert timing_budget() == 0.0
    for bad in ("-1", "nan", "fast", "1e9"):
        monkeypatch.setenv(TIMING_ENV, bad)
        with pytest.raises(UsageError, match="not a number of seconds from 0 to 60"):
            timing_budget()
