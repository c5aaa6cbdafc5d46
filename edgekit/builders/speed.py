"""How fast each TFLite variant of a target runs here, measured at build time, side by side.

A variant that passes the gate is not worth shipping as the default when another one that
passed is clearly faster: an int8 model whose activations fall off the XNNPACK delegate ran
8.8x slower than its fp32 (PaddleOCR's orientation classifier). Every variant is run with the
target's own runtime options, interleaved in rounds so a machine that drifts slows all of them
alike; the ratios (not the absolute times) go into the manifest. XNNPACK here is a proxy for
the device's (a Pi's Arm kernels differ): the build says so.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
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

DEFAULT_MARGIN = 1.15
"""A passing variant faster than the default past this p50 ratio, overall and in every round,
becomes the default: the default is then never more than 1.15x slower than the fastest variant
that passed. Tighter than :data:`CLEAR_MARGIN` (which only decides a warning) because a default
left 1.2x slow costs every frame on the device; every round must still agree."""


@dataclass(frozen=True)
class Speed:
    """One variant's measured p50 latency (ms), the runs behind it, the ops left off the delegate
    and the p50 of each interleaved round (empty when not measured in rounds)."""

    p50_ms: float
    runs: int
    off_delegate: dict[str, int]
    round_p50_ms: tuple[float, ...] = ()

    def clearly_slower_than(self, other: Speed, margin: float = CLEAR_MARGIN) -> bool:
        """Slower than ``other`` past ``margin``, overall and in each round both ran."""
        if self.p50_ms <= margin * other.p50_ms:
            return False
        rounds = zip(self.round_p50_ms, other.round_p50_ms)
        return all(mine > margin * theirs for mine, theirs in rounds)

    def to_dict(self, fp32_ms: float | None) -> dict:
        ratio = round(self.p50_ms / fp32_ms, 3) if fp32_ms else None
        return {"p50_ms": round(self.p50_ms, 4), "runs": self.runs, "vs_fp32": ratio,
                "off_delegate": dict(self.off_delegate), "measured_on": "the build host (a proxy for the device)"}


def measure(models: dict[str, tuple[Path, dict]], budget_s: float = 1.5, rounds: int = 3) -> dict[str, Speed]:
    """p50 latency of each model (``{variant: (path, runtime options)}``), interleaved:
    ``rounds`` rounds, each timing every model for its share of ``budget_s``."""
    from edgekit.runtime.litert import LiteRTRuntime

    runtimes = {name: LiteRTRuntime(path, **options) for name, (path, options) in models.items()}
    try:
        inputs = {name: np.zeros(rt.input_spec.shape, rt.input_spec.dtype) for name, rt in runtimes.items()}
        samples: dict[str, list[list[float]]] = {name: [] for name in runtimes}
        for name, rt in runtimes.items():  # warm-up: first invokes allocate and pack weights
            for _ in range(3):
                rt.infer(inputs[name])
        share = budget_s / rounds / max(len(runtimes), 1)
        for _ in range(rounds):
            for name, rt in runtimes.items():
                samples[name].append(_time_for(rt, inputs[name], share))
        return {name: Speed(float(np.median(np.concatenate(samples[name]))), sum(map(len, samples[name])),
                            off_delegate(rt), tuple(float(np.median(r)) for r in samples[name]))
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
    """The configured default, unless another passing variant is clearly faster (or it did not pass)."""
    timed = [v for v in passing if v in speeds]
    if not timed:
        return configured
    fastest = min(timed, key=lambda v: speeds[v].p50_ms)
    if configured not in timed:
        return fastest
    if speeds[configured].clearly_slower_than(speeds[fastest], DEFAULT_MARGIN):
        return fastest
    return configured


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


def time_variants(ctx: BuildContext, target: Target, out_dir: Path, models: list[BuiltModel],
                  default: str) -> tuple[list[BuiltModel], str]:
    """Each variant timed here with its runtime options: the ratios go into its manifest entry
    (``speed``), a variant clearly slower than fp32 is warned about by the ops left off the
    delegate, and a passing variant clearly faster than the configured default becomes the
    default."""
    budget = timing_budget()
    if budget == 0:
        ctx.log.info(f"[{target.name}] variants not timed ({TIMING_ENV}=0); default {default}")
        return models, default
    runs = {m.name: (out_dir / m.file, {**target.runtime_options, **(m.runtime_options or {})}) for m in models}
    with ctx.log.step(f"[{target.name}] time each variant on this host (its XNNPACK is a proxy for the device's)"):
        speeds = measure(runs, budget)
    passing = [m.name for m in models if not _missed(m.verification)]
    chosen = choose_default(default, passing, speeds)
    base = speeds["fp32"].p50_ms if "fp32" in speeds else None
    line = ", ".join(f"{n} {s.p50_ms:.3g} ms" + (f" ({s.p50_ms / base:.2f}x fp32)" if base and n != "fp32" else "")
                     for n, s in speeds.items())
    why = (f" (the fastest that passed; {default} is {speeds[default].p50_ms / speeds[chosen].p50_ms:.2f}x slower)"
           if chosen != default and default in speeds else "")
    ctx.log.info(f"[{target.name}] p50 on this host: {line}; default {chosen}{why}")
    for warning in slow_variant_lines(target.name, speeds, chosen):
        ctx.log.warn(warning)
    return [replace(m, extra={**m.extra, "speed": speeds[m.name].to_dict(base)}) for m in models], chosen


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


def _missed(verification: dict) -> bool:
    return any(isinstance(r, dict) and r.get("passed") is False for r in verification.values())
