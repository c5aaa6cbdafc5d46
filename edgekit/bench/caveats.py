"""What a bench reader must be told besides the numbers, one line per kind of caveat.

Each check finds the variants it concerns; :func:`noise_warnings` folds them into one line per
kind ("noisy (cv above 0.25): a 0.31, b 0.40: close other programs ..."), so fourteen variants on
a busy machine give four readable lines, not thirty. The kinds:

- more threads than the machine's usable cores (they compete: not what a device with that many
  cores measures);
- a bundle built for an accelerator (the Edge TPU, a Jetson's GPU) that ran without it: its
  latency is the host CPU's, not the device's;
- noise within runs (coefficient of variation), drift between repeats, invalid runs;
- a bundle whose default variant measured here more than :data:`~edgekit.bench.default_choice.PROMISE`
  slower than another of its variants (the build promises better; ``--set-default`` re-decides).
"""

from __future__ import annotations

import statistics
from typing import Any

from edgekit.bench.default_choice import PROMISE, fastest, verdict
from edgekit.bench.report import BenchReport, VariantResult, short_runtime

REPEAT_SPREAD_BOUND = 0.05
"""Warn when the per-repeat medians of a variant vary more than this (coefficient of variation)."""

ACCELERATORS = {"edgetpu": "the Edge TPU", "jetson": "TensorRT or CUDA"}
"""Targets whose bundles are built for an accelerator, and what should have run them."""


def threads_over_cores(report: BenchReport) -> list[str]:
    """``"demo-rpi:fp16 uses 4 threads on 2 usable cores"`` for each variant asking for more threads
    than this machine can run at once (a Pi profile benchmarked on a small VM, say)."""
    cores = report.machine.get("cores_usable") or report.machine.get("cores")
    out = []
    for v in report.variants:
        threads = v.runtime.get("num_threads")
        if cores and isinstance(threads, int) and threads > cores:
            out.append(f"{v.name} uses {threads} threads on {cores} usable cores")
    return out


def ran_on_accelerator(runtime: dict[str, Any]) -> bool:
    """Whether a runtime description says an accelerator did the work: the Edge TPU delegate
    applied, TensorRT, or a CUDA/TensorRT provider of ONNX Runtime."""
    if runtime.get("delegate_requested") == "edgetpu":
        return bool(runtime.get("delegate_applied"))
    if str(runtime.get("backend", "")).startswith("tensorrt"):
        return True
    providers = runtime.get("providers_used") or []
    return any(p.startswith(("CUDA", "Tensorrt")) for p in providers)


def off_accelerator(report: BenchReport) -> list[str]:
    """``"demo-edgetpu:int8 (built for edgetpu, ran on litert xnnpack 12/12 t2)"`` for each
    bundle built for an accelerator that ran without it."""
    return [f"{v.name} (built for {v.target}, ran on {short_runtime(v.runtime)})" for v in report.variants
            if v.target in ACCELERATORS and not ran_on_accelerator(v.runtime)]


def _repeat_spread(v: VariantResult) -> float:
    p50s = v.repeat_p50s()
    if len(p50s) < 2 or statistics.mean(p50s) <= 0:
        return 0.0
    return statistics.stdev(p50s) / statistics.mean(p50s)


def default_past_promise(report: BenchReport) -> list[str]:
    """``"dist/demo-cpu: default fp32, but int8 1.24x faster than fp32 (...)"`` for each bundle whose default
    variant, by the rule the build decides with (each repeat's fastest run, the median of the per-repeat
    ratios), ran more than :data:`PROMISE` slower here than the fastest of its other variants. A bundle
    holds only variants that passed its gate, so any of them may be its default."""
    bundles: dict[str, list[VariantResult]] = {}
    for v in report.variants:
        if v.variant is not None and v.valid:
            bundles.setdefault(v.path, []).append(v)
    out = []
    for path, variants in bundles.items():
        default = next((v.variant for v in variants if v.default), None)
        rounds = {v.variant: [list(r.samples_ms["inference"]) for r in v.runs] for v in variants}
        if default is None or len(rounds) != len(variants) or len(rounds) < 2:
            continue  # no default among them, or one variant measured with several backends
        best = fastest(list(rounds), rounds)
        found = verdict(default, best, rounds, PROMISE) if best != default else None
        if found is not None and found.faster:
            out.append(f"{path}: default {default}, but {found.text()}")
    return out


def _fold(what: str, items: list[str], advice: str) -> list[str]:
    return [f"{what}: {', '.join(items)}: {advice}"] if items else []


def noise_warnings(report: BenchReport) -> list[str]:
    """One warning per kind of caveat, naming every variant it concerns (see the module doc)."""
    cfg = report.config
    accelerators = sorted({ACCELERATORS[v.target] for v in report.variants
                           if v.target in ACCELERATORS and not ran_on_accelerator(v.runtime)})
    noisy = [f"{v.name} {v.pooled().cv:.2f}" for v in report.variants
             if v.pooled().count and v.pooled().cv > cfg.max_cv]
    drift = [f"{v.name} {_repeat_spread(v):.2f}" for v in report.variants if _repeat_spread(v) > REPEAT_SPREAD_BOUND]
    invalid = [f"{v.name} ({sum(not r.valid for r in v.runs)} of {len(v.runs)})" for v in report.variants
               if not v.valid]
    cores = report.machine.get("cores_usable") or report.machine.get("cores")
    threads = [f"{v.name} ({v.runtime['num_threads']})" for v in report.variants
               if cores and isinstance(v.runtime.get("num_threads"), int) and v.runtime["num_threads"] > cores]
    return [
        *_fold(f"more threads than the {cores} usable cores", threads,
               "threads compete for cores, so the latency is not what a device with that many cores would "
               "measure (set --threads to the cores you have, or run it on the device)"),
        *_fold("built for an accelerator, ran without it", off_accelerator(report),
               f"these latencies are this host's CPU, not the device's (run them where {' or '.join(accelerators)} "
               "is installed)"),
        *_fold(f"noisy, coefficient of variation above {cfg.max_cv:.2f}", noisy,
               "close other programs, set the governor to performance, or raise --min-duration"),
        *_fold(f"medians differ between repeats (cv above {REPEAT_SPREAD_BOUND})", drift,
               "the machine's speed drifted; compare ratios, not absolute times"),
        *_fold("run(s) invalid", invalid,
               "--max-duration reached before --min-count frames over --min-duration seconds"),
        *_fold(f"default more than {PROMISE:g}x slower than another variant of its bundle",
               default_past_promise(report),
               "the build host timed them otherwise; edgekit bench BUNDLE --set-default re-decides on this machine"),
    ]
