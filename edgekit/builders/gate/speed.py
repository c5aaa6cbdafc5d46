"""How fast each TFLite variant of a target runs here, measured at build time, side by side.

A variant that passes the gate is not worth shipping as the default when another one that
passed is clearly faster: an int8 model whose activations fall off the XNNPACK delegate ran
8.8x slower than its fp32 (PaddleOCR's orientation classifier). Every variant is run with the
target's own runtime options, interleaved in rounds so a machine that drifts slows all of them
alike; the ratios (not the absolute times) go into the manifest. XNNPACK here is a proxy for
the device's (a Pi's Arm kernels differ): the build says so.

The default moves by the robust rule of :mod:`edgekit.bench.default_choice` (each round's fastest run,
the median of the per-round ratios), with rounds added while they disagree, up to
:data:`~edgekit.bench.default_choice.MAX_ROUNDS`: the rule that every round's median agree kept fp32 on
a loaded machine where int8 was 1.27x faster.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.bench.default_choice import (
    DEFAULT_MARGIN,  # noqa: F401 - re-exported: callers read the margin here
    MAX_ROUNDS,
    choose,
    undecided,
)
from edgekit.builders.gate.verdict import failed

if TYPE_CHECKING:
    from edgekit.builders.contract import BuiltModel
    from edgekit.target import Target

TIMING_ENV = "EDGEKIT_BUILD_TIMING_S"
"""Seconds each target's variants are timed for at build (default 1.5, shared by the variants in
three interleaved rounds); 0 skips the timing, and the configured default variant stays."""
DEFAULT_BUDGET_S = 1.5

CLEAR_MARGIN = 1.25
"""A variant counts as slower (or faster) than another only past this p50 ratio, overall and in
every round: below it, or when one round disagrees (a burst of load on a shared machine lands on
one variant's slot), the machine cannot tell them apart reliably."""

ROUNDS = 3
"""Interleaved rounds a timing starts with; more while they disagree about the default (MAX_ROUNDS)."""


@dataclass(frozen=True)
class Speed:
    """One variant's measured p50 latency (ms), the runs behind it, the ops left off the delegate,
    the p50 of each interleaved round (empty when not measured in rounds) and each round's run
    times (what the default is decided on: edgekit/bench/default_choice.py)."""

    p50_ms: float
    runs: int
    off_delegate: dict[str, int]
    round_p50_ms: tuple[float, ...] = ()
    rounds_ms: tuple[tuple[float, ...], ...] = ()

    def clearly_slower_than(self, other: Speed, margin: float = CLEAR_MARGIN) -> bool:
        """Slower than ``other`` past ``margin``, overall and in each round both ran."""
        if self.p50_ms <= margin * other.p50_ms:
            return False
        rounds = zip(self.round_p50_ms, other.round_p50_ms)
        return all(mine > margin * theirs for mine, theirs in rounds)

    def to_dict(self, fp32_ms: float | None) -> dict:
        ratio = round(self.p50_ms / fp32_ms, 3) if fp32_ms else None
        floors = [min(r) for r in self.rounds_ms if r]
        return {"p50_ms": round(self.p50_ms, 4), "runs": self.runs, "vs_fp32": ratio,
                "round_min_ms": [round(f, 4) for f in floors], "off_delegate": dict(self.off_delegate),
                "measured_on": "the build host (a proxy for the device)"}


def measure(models: dict[str, tuple[Path, dict]], budget_s: float = 1.5, rounds: int = ROUNDS,
            more: Callable[[dict[str, list[list[float]]]], bool] | None = None) -> dict[str, Speed]:
    """p50 latency of each model (``{variant: (path, runtime options)}``), interleaved:
    ``rounds`` rounds, each timing every model for its share of ``budget_s``; then one more round at a
    time while ``more(run times so far)`` says the rounds disagree, up to MAX_ROUNDS in all."""
    from edgekit.runtime.litert import LiteRTRuntime

    runtimes = {name: LiteRTRuntime(path, **options) for name, (path, options) in models.items()}
    try:
        inputs = {name: np.zeros(rt.input_spec.shape, rt.input_spec.dtype) for name, rt in runtimes.items()}
        samples: dict[str, list[list[float]]] = {name: [] for name in runtimes}
        for name, rt in runtimes.items():  # warm-up: first invokes allocate and pack weights
            for _ in range(3):
                rt.infer(inputs[name])
        share = budget_s / rounds / max(len(runtimes), 1)
        done = 0
        while done < rounds or (more is not None and done < MAX_ROUNDS and more(samples)):
            order = list(runtimes)[done % len(runtimes):] + list(runtimes)[:done % len(runtimes)]
            for name in order:  # rotated each round: no variant always runs right after the same one
                samples[name].append(_time_for(runtimes[name], inputs[name], share))
            done += 1
        return {name: Speed(float(np.median(np.concatenate(samples[name]))), sum(map(len, samples[name])),
                            off_delegate(rt), tuple(float(np.median(r)) for r in samples[name]),
                            tuple(tuple(r) for r in samples[name]))
                for name, rt in runtimes.items()}
    finally:
        for rt in runtimes.values():
            rt.close()


def _time_for(rt, tensor: np.ndarray, seconds: float) -> list[float]:
    """Latencies (ms) of back-to-back invokes for ``seconds`` (at least one)."""
    taken = []
    end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter_ns()
        rt.infer(tensor)
        taken.append((time.perf_counter_ns() - t0) / 1e6)
        if time.perf_counter() >= end:
            return taken


def off_delegate(rt) -> dict[str, int]:
    """Op names (and counts) a LiteRT runtime left on its built-in kernels."""
    from edgekit.runtime.litert import delegated_nodes

    ops = rt.ops_details()
    if not any(o.get("op_name") == "DELEGATE" for o in ops):
        return {}
    taken = delegated_nodes(ops)
    left = Counter(o["op_name"] for o in ops if o.get("op_name") != "DELEGATE" and o["index"] not in taken)
    return dict(left.most_common())


def choose_default(configured: str, passing: list[str], speeds: dict[str, Speed]) -> str:
    """The configured default, unless another passing variant is faster past DEFAULT_MARGIN by the robust
    statistic (edgekit/bench/default_choice.py), or the configured one did not pass."""
    return choose(configured, passing, _rounds(speeds)).variant


def _rounds(speeds: dict[str, Speed]) -> dict[str, list[list[float]]]:
    """Per variant its rounds' run times; a Speed without them (made by hand, or measured before they were
    kept): each round's p50 as that round's one run, else its overall p50 as one round."""
    return {name: [list(r) for r in s.rounds_ms] or [[p] for p in s.round_p50_ms] or [[s.p50_ms]]
            for name, s in speeds.items()}


def slow_variant_lines(target: str, speeds: dict[str, Speed], default: str) -> list[str]:
    """One warning per variant clearly slower than fp32, naming the ops left off the delegate."""
    base = speeds.get("fp32")
    lines = []
    for name, speed in speeds.items():
        if base is None or name == "fp32" or not speed.clearly_slower_than(base):
            continue
        ops = ", ".join(f"{op} x{n}" for op, n in list(speed.off_delegate.items())[:6])
        why = f"{ops} run on built-in kernels: " if ops else ""
        lines.append(f"[{target}] {name}: {why}{speed.p50_ms / base.p50_ms:.1f}x slower than fp32 on this host "
                     f"(p50 {speed.p50_ms:.2f} vs {base.p50_ms:.2f} ms); default is {default}")
    return lines


def time_variants(ctx: Any, target: Target, out_dir: Path, models: list[BuiltModel],
                  default: str) -> tuple[list[BuiltModel], str]:
    """Each variant timed here with its runtime options: the ratios go into its manifest entry
    (``speed``), a variant clearly slower than fp32 is warned about by the ops left off the
    delegate, and a passing variant faster than the configured default past DEFAULT_MARGIN (by the
    median over rounds of each round's fastest run; rounds added while they disagree) becomes the
    default; the default's ``speed.default_choice`` says why."""
    budget = timing_budget()
    if budget == 0:
        ctx.log.info(f"[{target.name}] variants not timed ({TIMING_ENV}=0); default {default}")
        return models, default
    runs = {m.name: (out_dir / m.file, {**target.runtime_options, **(m.runtime_options or {})}) for m in models}
    passing = [m.name for m in models if not failed(m.verification)]
    with ctx.log.step(f"[{target.name}] time each variant on this host (its XNNPACK is a proxy for the device's)"):
        speeds = measure(runs, budget, more=lambda rounds: undecided(default, passing, rounds))
    choice = choose(default, passing, _rounds(speeds))
    chosen = choice.variant
    base = speeds["fp32"].p50_ms if "fp32" in speeds else None
    line = ", ".join(f"{n} {s.p50_ms:.3g} ms" + (f" ({s.p50_ms / base:.2f}x fp32)" if base and n != "fp32" else "")
                     for n, s in speeds.items())
    why = f" ({choice.reason})" if choice.verdict is not None or chosen != default else ""
    ctx.log.info(f"[{target.name}] p50 on this host: {line}; default {chosen}{why}")
    for warning in slow_variant_lines(target.name, speeds, chosen):
        ctx.log.warn(warning)
    record = {"chosen": chosen, "configured": default, "reason": choice.reason,
              **(choice.verdict.to_dict() if choice.verdict is not None else {})}
    return [replace(m, extra={**m.extra, "speed": {**speeds[m.name].to_dict(base),
                                                   **({"default_choice": record} if m.name == chosen else {})}})
            for m in models], chosen


def timing_budget() -> float:
    """The timing budget from ``$EDGEKIT_BUILD_TIMING_S`` (seconds, 0-60), else 1.5 s."""
    from edgekit.errors import UsageError

    text = os.environ.get(TIMING_ENV, "").strip()
    if not text:
        return DEFAULT_BUDGET_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 60:
        raise UsageError(f"{TIMING_ENV}={text!r} is not a number of seconds from 0 to 60",
                         f"unset it (default {DEFAULT_BUDGET_S}) or give e.g. {TIMING_ENV}=0 to skip the timing")
    return value


