"""What ``edgekit bench`` measured, and how it is shown: the report, its table, JSON and CSV,
and per-op profiles. Plots are in :mod:`edgekit.bench.plots`, warnings in
:mod:`edgekit.bench.caveats`.

:func:`edgekit.bench.runner.run_bench` fills a :class:`BenchReport`; nothing here measures.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.metrics import LatencySummary, summarize


@dataclass
class RunResult:
    """One SingleStream run of one variant."""

    repeat: int
    valid: bool
    duration_s: float
    summary: dict[str, Any]
    samples_ms: dict[str, list[float]]
    t_s: list[float]

    def stage(self, name: str = "inference") -> LatencySummary:
        """Latency statistics of one stage of this run (warm-up excluded)."""
        return summarize(int(v * 1e6) for v in self.samples_ms[name])


@dataclass
class VariantResult:
    """Everything measured for one variant across repeats."""

    name: str
    path: str
    variant: str | None
    precision: str | None
    target: str | None
    runtime: dict[str, Any]
    init_ms: float | None = None
    first_inference_ms: float | None = None
    runs: list[RunResult] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    default: bool = False
    """The bundle's default variant (marked ``*`` in the table)."""
    model: str = ""
    """The model this variant is a form of (a bundle's source model, else the file): ratios are
    taken within it, and the plot gives it a panel of its own."""

    @property
    def valid(self) -> bool:
        """Every repeat reached both minimums (and there was at least one)."""
        return bool(self.runs) and all(r.valid for r in self.runs)

    def stage_p50s(self) -> dict[str, float]:
        """p50 (ms) of every stage recorded, repeats pooled, in pipeline order."""
        names = self.runs[0].samples_ms if self.runs else {}
        return {name: round(self.pooled(name).p50_ms, 4) for name in names if self.samples(name)}

    def samples(self, stage: str = "inference") -> list[float]:
        """All kept samples of a stage (ms) across repeats, in run order."""
        return [v for r in self.runs for v in r.samples_ms[stage]]

    def pooled(self, stage: str = "inference") -> LatencySummary:
        """Statistics of a stage over every repeat's samples together."""
        return summarize(int(v * 1e6) for v in self.samples(stage))

    def repeat_p50s(self) -> list[float]:
        """The inference median of each repeat (their spread shows drift of the machine)."""
        return [r.stage().p50_ms for r in self.runs]

    def fps(self) -> float:
        """Median of the repeats' frame rates."""
        rates = [r.summary["fps"] for r in self.runs if r.summary["fps"]]
        return statistics.median(rates) if rates else 0.0


@dataclass
class BenchReport:
    """The result of :func:`run_bench`: variants in the order given, first = reference."""

    config: Any  # the edgekit.bench.runner.BenchConfig of the run
    machine: dict[str, Any]
    variants: list[VariantResult]
    started: str
    warnings: list[str] = field(default_factory=list)

    def reference(self, v: VariantResult) -> VariantResult:
        """The variant ``v`` is compared with: the first one of the same model (a detector's
        latency divided by a classifier's says nothing)."""
        return next(r for r in self.variants if (r.model or r.name) == (v.model or v.name))

    def groups(self) -> dict[str, list[VariantResult]]:
        """Variants by model, models in the order they first appear."""
        out: dict[str, list[VariantResult]] = {}
        for v in self.variants:
            out.setdefault(v.model or v.name, []).append(v)
        return out

    def ratio(self, v: VariantResult, stat: str = "p50_ms") -> float:
        """Latency of ``v`` divided by its model's first variant's (below 1: faster than it)."""
        ref = getattr(self.reference(v).pooled(), stat)
        return getattr(v.pooled(), stat) / ref if ref else float("nan")

    @property
    def valid(self) -> bool:
        """Every variant is valid."""
        return all(v.valid for v in self.variants)

    def table(self) -> str:
        """The side-by-side table (inference latency, end-to-end p50, FPS, ratios)."""
        # as wide as the longest name: a cut name lost its variant (two rows of a long bundle name both
        # read "ch_PP-OCRv4_rec_infer-c")
        width = max([23, *(len(v.name) for v in self.variants)]) + 3
        head = (
            f"{'variant':<{width}}{'runtime':<34}{'runs x n':>11}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}"
            f"{'cv':>6}{'e2e p50':>9}{'fps':>9}{'p50 x':>8}{'p90 x':>8}  valid"
        )
        lines = [head, "-" * len(head)]
        several = len(self.groups()) > 1
        for v in self.variants:
            if several and self.reference(v) is v:
                lines.append(f"model {v.model or v.name}:")
            s = v.pooled()
            n = f"{len(v.runs)} x {round(s.count / max(1, len(v.runs)))}"
            name = v.name + " *" if v.default else v.name
            lines.append(
                f"{name:<{width}}{short_runtime(v.runtime)[:33]:<34}{n:>11}{s.p50_ms:>9.3f}{s.p90_ms:>9.3f}"
                f"{s.p99_ms:>9.3f}{s.mean_ms:>9.3f}{s.cv:>6.2f}{v.pooled('end_to_end').p50_ms:>9.3f}"
                f"{v.fps():>9.1f}{self.ratio(v):>7.2f}x{self.ratio(v, 'p90_ms'):>7.2f}x  {'yes' if v.valid else 'NO'}"
            )
        lines.append(
            "latency in ms (inference stage, warm-up excluded, repeats pooled); "
            "ratios = latency / the first variant's of the same model (below 1 = faster)"
            + ("; * = the bundle's default variant (the build's choice)" if any(v.default for v in self.variants)
               else "")
        )
        return "\n".join(lines)

    def to_dict(self, samples: bool = True) -> dict[str, Any]:
        """JSON-ready report; ``samples`` includes every raw latency sample (ms)."""
        from edgekit._version import __version__

        out = {
            "edgekit": __version__,
            "started": self.started,
            "config": {k: v for k, v in self.config.__dict__.items()},
            "machine": self.machine,
            "valid": self.valid,
            "warnings": self.warnings,
            "variants": [],
        }
        for v in self.variants:
            out["variants"].append(
                {
                    "name": v.name,
                    "model": v.model or v.name,
                    "default": v.default,
                    "ratio_to": self.reference(v).name,
                    "path": v.path,
                    "variant": v.variant,
                    "precision": v.precision,
                    "target": v.target,
                    "runtime": v.runtime,
                    "init_ms": v.init_ms,
                    "first_inference_ms": v.first_inference_ms,
                    "valid": v.valid,
                    "inference": v.pooled().to_dict(),
                    "end_to_end": v.pooled("end_to_end").to_dict(),
                    "preprocess": v.pooled("preprocess").to_dict(),
                    "stages_p50_ms": v.stage_p50s(),
                    "fps": v.fps(),
                    "ratio_p50": self.ratio(v),
                    "ratio_p90": self.ratio(v, "p90_ms"),
                    "repeat_p50_ms": v.repeat_p50s(),
                    "profile": v.profile,
                    "runs": [
                        {
                            "repeat": r.repeat,
                            "valid": r.valid,
                            "duration_s": r.duration_s,
                            "summary": r.summary,
                            **({"samples_ms": r.samples_ms, "t_s": r.t_s} if samples else {}),
                        }
                        for r in v.runs
                    ],
                }
            )
        return out

    def write_json(self, path: str | Path) -> Path:
        """The full report with raw samples as JSON at ``path``; returns the path."""
        from edgekit.util.atomic import write_text_atomic
        from edgekit.util.finite_json import strict_dumps  # NaN (an invalid run's statistics) is not JSON: null

        return write_text_atomic(path, strict_dumps(self.to_dict(), indent=1, default=jsonable) + "\n",
                                 force=True)

    def write_csv(self, path: str | Path) -> Path:
        """One row per variant and repeat, plus a pooled row (repeat ``all``) per variant."""
        path = Path(path)
        cols = [
            "variant",
            "repeat",
            "valid",
            "count",
            "min_ms",
            "mean_ms",
            "std_ms",
            "p50_ms",
            "p90_ms",
            "p95_ms",
            "p99_ms",
            "max_ms",
            "cv",
            "e2e_p50_ms",
            "fps",
            "ratio_p50",
            "ratio_p90",
        ]
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for v in self.variants:
                for r in v.runs:
                    s = r.stage()
                    w.writerow(
                        [
                            v.name,
                            r.repeat,
                            r.valid,
                            s.count,
                            *_stats(s),
                            r.stage("end_to_end").p50_ms,
                            r.summary["fps"],
                            "",
                            "",
                        ]
                    )
                s = v.pooled()
                w.writerow(
                    [
                        v.name,
                        "all",
                        v.valid,
                        s.count,
                        *_stats(s),
                        v.pooled("end_to_end").p50_ms,
                        v.fps(),
                        self.ratio(v),
                        self.ratio(v, "p90_ms"),
                    ]
                )
        return path


def _stats(s: LatencySummary) -> list[float]:
    return [s.min_ms, s.mean_ms, s.std_ms, s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms, s.max_ms, s.cv]


def jsonable(obj: Any) -> Any:
    """``json.dumps(..., default=jsonable)``: numpy scalars, paths and tuples as plain JSON values."""
    if isinstance(obj, (np.generic,)):
        return obj.item()
    if isinstance(obj, (Path, tuple)):
        return str(obj) if isinstance(obj, Path) else list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def short_runtime(info: dict[str, Any]) -> str:
    """``litert xnnpack 12/12 t2`` or ``onnxruntime CPU t1``: what ran, in a table cell."""
    backend = str(info.get("backend", "?")).replace("ai_edge_litert", "litert")
    if "delegate_requested" in info:
        what = info["delegate_requested"]
        what += f" {info['delegated_nodes']}/{info['total_nodes']}" if info.get("delegate_applied") else " (cpu)"
    else:
        what = ",".join(p.replace("ExecutionProvider", "") for p in info.get("providers_used", []))
    threads = f" t{info['num_threads']}" if info.get("num_threads") else ""
    return f"{backend} {what}{threads}"


def format_profile(v: VariantResult, top: int = 12) -> str:
    """A variant's per-op profile as text."""
    p = v.profile
    if not p:
        return f"{v.name}: no per-op profile for this runtime"
    lines = [f"{v.name}: per-op profile ({p['kind']})"]
    if p["kind"] == "measured":
        lines.append(f"  {'op type':<24}{'calls':>8}{'total ms':>11}{'mean us':>10}{'share':>8}")
        for r in p["ops"][:top]:
            lines.append(
                f"  {r['op_type']:<24}{r['calls']:>8}{r['total_ms']:>11.3f}{r['mean_us']:>10.1f}{r['share']:>8.1%}"
            )
        lines.append("  (profiling adds overhead to the latencies above)")
    else:
        lines.append(f"  {'op type':<24}{'count':>7}{'delegated':>11}{'cpu':>6}   ({p['note']})")
        for r in p["ops"][:top]:
            lines.append(f"  {r['op_type']:<24}{r['count']:>7}{r['delegated']:>11}{r['cpu']:>6}")
    return "\n".join(lines)
