"""The default variant on a busy machine (edgekit/bench/default_choice.py, used by the build's timing in
edgekit/builders/gate/speed.py and by bench --set-default): injected run times, no clock.

A loaded 2-core host: each round runs every variant for a slot; another process takes the CPU for part
of some slots, so those runs take longer, and now and then a whole slot is loaded. The old rule (every
round's median past 1.15x) kept fp32 where int8 was 1.27x faster (issue 37); the robust one (each
round's fastest run, the median of the per-round ratios) must choose the fastest passing variant when it
is past the switching margin (1.05x) and keep fp32 when it is not, so that the default stays within the
bundle's promise (1.15x of the fastest) whatever one loaded slot does."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.bench.default_choice import (
    DEFAULT_MARGIN,
    MAX_ROUNDS,
    PROMISE,
    Verdict,
    choose,
    floor,
    undecided,
    verdict,
)
from edgekit.builders.gate.speed import Speed, choose_default


def _loaded(cost_ms: float, rng: np.random.Generator, runs: int = 60, busy: float = 0.5,
            whole_slot: bool = False) -> list[float]:
    """One slot's run times on a loaded machine: the model's cost, timer jitter, and on a share ``busy``
    of the runs another process's time slice (0.5 to 3 times the cost); a ``whole_slot`` of load slows
    every run by 40 % on top."""
    times = cost_ms * (1 + rng.uniform(0, 0.03, runs))
    hit = rng.random(runs) < busy
    times[hit] += cost_ms * rng.uniform(0.5, 3.0, hit.sum())
    return list(times * (1.4 if whole_slot else 1.0))


def _rounds(costs: dict[str, float], seed: int, loaded_slots: dict[int, str]) -> dict[str, list[list[float]]]:
    """Three rounds of every variant; ``loaded_slots``: round -> the variant whose whole slot was loaded."""
    rng = np.random.default_rng(seed)
    return {name: [_loaded(cost, rng, whole_slot=loaded_slots.get(r) == name) for r in range(3)]
            for name, cost in costs.items()}


def _old_rule(rounds: dict[str, list[list[float]]], configured: str, candidate: str, margin: float = 1.15) -> bool:
    """What the build did before: the overall p50 and every round's p50 past the margin."""
    mine, theirs = rounds[configured], rounds[candidate]
    speed = Speed(float(np.median(np.concatenate(mine))), 1, {}, tuple(float(np.median(r)) for r in mine))
    other = Speed(float(np.median(np.concatenate(theirs))), 1, {}, tuple(float(np.median(r)) for r in theirs))
    return speed.clearly_slower_than(other, margin)


def test_on_a_loaded_machine_int8_faster_past_the_margin_becomes_the_default():
    # the issue's figures: fp32 0.439 ms, int8 0.346 ms (1.27x); int8's second slot loaded through
    rounds = _rounds({"fp32": 0.439, "int8": 0.346}, seed=3, loaded_slots={1: "int8"})
    assert not _old_rule(rounds, "fp32", "int8")  # one round said 0.9x: the old rule kept fp32
    choice = choose("fp32", ["fp32", "int8"], rounds)
    assert choice.variant == "int8" and choice.verdict.ratio == pytest.approx(1.27, abs=0.03)
    assert choice.verdict.rounds_past == 2 and choice.verdict.split  # the loaded round disagrees ...
    assert choice.reason.startswith("int8 1.2") and "median of 3 rounds' fastest runs; 2 of 3 past 1.05x" in \
        choice.reason  # ... and the median speaks for the rounds


def test_on_a_loaded_machine_a_variant_under_the_margin_leaves_fp32_the_default():
    # int8 truly 1.03x faster; fp32's first slot loaded through: that round says 1.4x
    rounds = _rounds({"fp32": 0.412, "int8": 0.4}, seed=5, loaded_slots={0: "fp32"})
    assert verdict("fp32", "int8", rounds).ratios[0] > 1.4
    choice = choose("fp32", ["fp32", "int8"], rounds)
    assert choice.variant == "fp32" and choice.verdict.ratio == pytest.approx(1.03, abs=0.015)
    # noisy runs that only lengthen some of a slot's runs move no round's floor
    quiet = _rounds({"fp32": 0.412, "int8": 0.4}, seed=7, loaded_slots={})
    assert max(verdict("fp32", "int8", quiet).ratios) < DEFAULT_MARGIN


@pytest.mark.parametrize("seed", range(20))
def test_the_decision_holds_whatever_the_noise_of_one_loaded_slot(seed):
    rng = np.random.default_rng(100 + seed)
    slot = {int(rng.integers(3)): str(rng.choice(["fp32", "int8"]))}
    assert choose("fp32", ["fp32", "int8"], _rounds({"fp32": 0.439, "int8": 0.346}, seed, slot)).variant == "int8"
    assert choose("fp32", ["fp32", "int8"], _rounds({"fp32": 0.412, "int8": 0.4}, seed, slot)).variant == "fp32"


def test_the_boundary_is_strictly_past_the_margin_and_only_passing_variants_count():
    at = {"fp32": [[DEFAULT_MARGIN]], "int8": [[1.0]]}
    assert Verdict("fp32", "int8", (DEFAULT_MARGIN,)).faster is False
    assert choose("fp32", ["fp32", "int8"], at).variant == "fp32"
    past = {"fp32": [[DEFAULT_MARGIN + 1e-4]], "int8": [[1.0]]}
    assert choose("fp32", ["fp32", "int8"], past).variant == "int8"
    assert choose("fp32", ["fp32"], past).variant == "fp32"  # int8 missed the gate: never the default
    assert choose("fp32", ["int8"], past).variant == "int8"  # fp32 missed it: the fastest that passed
    three = {"fp32": [[2.0]], "fp16": [[1.6]], "int8": [[1.0]]}
    assert choose("fp32", ["fp32", "fp16", "int8"], three).variant == "int8"  # the fastest, not the first faster
    assert choose("fp32", [], three).reason == "no passing variant was timed"
    assert floor([0.5, 0.3, 0.9]) == 0.3


def test_rounds_that_disagree_ask_for_more_and_agreeing_ones_do_not():
    split = {"fp32": [[1.3], [1.3], [1.0]], "int8": [[1.0], [1.0], [1.0]]}
    agree = {"fp32": [[1.3], [1.3], [1.3]], "int8": [[1.0], [1.0], [1.0]]}
    assert undecided("fp32", ["fp32", "int8"], split) and not undecided("fp32", ["fp32", "int8"], agree)
    assert not undecided("fp32", ["fp32"], split)  # nothing to compare


def test_the_build_timing_adds_rounds_while_they_disagree_up_to_the_bound(monkeypatch):
    """builders/gate/speed.py measure(): three rounds, then one more while ``more`` says they disagree, at most
    MAX_ROUNDS (a fake runtime and scripted run times: no model is run, no clock is read)."""
    import edgekit.builders.gate.speed as speed
    import edgekit.runtime.litert as litert
    from edgekit.bench.default_choice import undecided as disagree

    class _Runtime:
        def __init__(self, path, **options):
            self.name = str(path)
            self.input_spec = type("Spec", (), {"shape": (1, 2), "dtype": np.float32})()

        def infer(self, x):
            return [x]

        def close(self):
            pass

    script = {"fp32": iter([[1.3], [1.02]] * 15), "int8": iter([[1.0]] * 30)}  # every other round under 1.05x
    monkeypatch.setattr(litert, "LiteRTRuntime", _Runtime)
    monkeypatch.setattr(speed, "_time_for", lambda rt, x, s: next(script[rt.name]))
    monkeypatch.setattr(speed, "off_delegate", lambda rt: {})
    passing = ["fp32", "int8"]
    runs = {"fp32": ("fp32", {}), "int8": ("int8", {})}
    speeds = speed.measure(runs, 0.1, more=lambda rounds: disagree("fp32", passing, rounds))
    assert len(speeds["fp32"].rounds_ms) == MAX_ROUNDS  # split to the end: bounded
    assert choose_default("fp32", passing, speeds) == "int8"  # 5 rounds of 1.3x, 4 of 1.02x: the median says 1.3x
    script["fp32"] = iter([[1.3]] * 30)
    assert len(speed.measure(runs, 0.1, more=lambda rounds: disagree("fp32", passing, rounds))["fp32"].rounds_ms) == 3


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("int8_speedup", [1.08, 1.12, 1.16, 1.27])
def test_the_default_keeps_the_promise_near_the_margin_on_a_loaded_machine(seed, int8_speedup):
    """Near the promise is where a 1.15x switch failed: int8 truly 1.12-1.16x faster, the build's rounds
    measured ~1.11x and kept fp32, which bench then put past 1.15x. Whatever the default chosen from rounds
    with one loaded slot, its true cost is within PROMISE of the fastest passing variant's."""
    rng = np.random.default_rng(500 + seed)
    costs = {"fp32": 0.4 * int8_speedup, "int8": 0.4}
    slot = {int(rng.integers(3)): str(rng.choice(["fp32", "int8"]))}
    chosen = choose("fp32", ["fp32", "int8"], _rounds(costs, seed, slot)).variant
    assert costs[chosen] <= PROMISE * min(costs.values())
    if int8_speedup > PROMISE:
        assert chosen == "int8"


def test_the_reason_names_the_statistic_when_the_configured_default_is_fastest():
    """A build log prints p50s beside the decision; the floor the rule decides on can rank otherwise (iris
    landmark: fp16 0.89x fp32 by p50, fp32 the fastest by each round's fastest run), so the reason says which."""
    rounds = {"fp32": [[1.0, 1.5, 1.6]], "fp16": [[1.1, 1.2, 1.2]]}  # p50: fp16 faster; floor: fp32
    choice = choose("fp32", ["fp32", "fp16"], rounds)
    assert choice.variant == "fp32" and choice.reason == "fp32 is the fastest that passed by each round's fastest run"
