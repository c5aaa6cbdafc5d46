"""``edgekit bench``: compare bundles/variants side by side with honest statistics.

    edgekit bench dist/demo-cpu --variants all --synthetic
    edgekit bench dist/demo-cpu:fp32 dist/demo-cpu:int8 --camera file:clip.mp4 --repeats 5
    edgekit bench model.tflite --json out.json --csv out.csv --plot out.png
    edgekit bench dist/demo-cpu --eval data/eval        # accuracy mode

In the spirit of MLPerf SingleStream: frames are fed one at a time, each after the
previous result; a run is valid only once it has lasted ``--min-duration`` seconds *and*
measured ``--min-count`` frames. Every variant is opened in this one process and the runs
are interleaved (repeat 1: A B C, repeat 2: B C A, ...) so that drift of a shared machine
hits all variants alike; results are reported as ratios to the first variant, with the
machine context and a warning when the numbers are noisy.

The same is available from Python: :func:`run_bench` and :func:`evaluate`.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import BackendUnavailable, CalibrationError, CameraError, EdgekitError, ModelError, UsageError
from edgekit.metrics import LatencySummary, machine_context, summarize
from edgekit.model import OpenModel, open_model, split_model_spec
from edgekit.pipeline import Pipeline

REPEAT_SPREAD_BOUND = 0.05
"""Warn when the per-repeat medians of a variant vary more than this (coefficient of variation)."""


@dataclass(frozen=True)
class BenchConfig:
    """How long and how often to measure, and with which input.

    A run stops once it is valid (``min_count`` measured frames spanning at least
    ``min_duration_s``), or, invalid, when ``max_duration_s`` is reached.
    """

    min_duration_s: float = 2.0
    min_count: int = 100
    max_duration_s: float | None = None
    repeats: int = 3
    warmup: int = 10
    max_cv: float = 0.25
    frames: int = 32
    camera: str | None = None
    camera_options: dict[str, Any] = field(default_factory=dict)  # open_camera(camera, **camera_options)
    frame_size: tuple[int, int] = (640, 360)
    profile: bool = False
    runtime_options: dict[str, Any] = field(default_factory=dict)
    labels: str | None = None
    skip_unavailable: bool = False


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

    @property
    def valid(self) -> bool:
        return bool(self.runs) and all(r.valid for r in self.runs)

    def samples(self, stage: str = "inference") -> list[float]:
        """All kept samples of a stage (ms) across repeats, in run order."""
        return [v for r in self.runs for v in r.samples_ms[stage]]

    def pooled(self, stage: str = "inference") -> LatencySummary:
        return summarize(int(v * 1e6) for v in self.samples(stage))

    def repeat_p50s(self) -> list[float]:
        return [r.stage().p50_ms for r in self.runs]

    def fps(self) -> float:
        rates = [r.summary["fps"] for r in self.runs if r.summary["fps"]]
        return statistics.median(rates) if rates else 0.0


@dataclass
class BenchReport:
    """The result of :func:`run_bench`: variants in the order given, first = reference."""

    config: BenchConfig
    machine: dict[str, Any]
    variants: list[VariantResult]
    started: str
    warnings: list[str] = field(default_factory=list)

    def ratio(self, v: VariantResult, stat: str = "p50_ms") -> float:
        """Latency of ``v`` divided by the first variant's (below 1: faster than the reference)."""
        ref = getattr(self.variants[0].pooled(), stat)
        return getattr(v.pooled(), stat) / ref if ref else float("nan")

    @property
    def valid(self) -> bool:
        return all(v.valid for v in self.variants)

    def table(self) -> str:
        """The side-by-side table (inference latency, end-to-end p50, FPS, ratios)."""
        head = (
            f"{'variant':<26}{'runtime':<34}{'runs x n':>11}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}"
            f"{'cv':>6}{'e2e p50':>9}{'fps':>9}{'p50 x':>8}{'p90 x':>8}  valid"
        )
        lines = [head, "-" * len(head)]
        for v in self.variants:
            s = v.pooled()
            n = f"{len(v.runs)} x {round(s.count / max(1, len(v.runs)))}"
            lines.append(
                f"{v.name[:25]:<26}{short_runtime(v.runtime)[:33]:<34}{n:>11}{s.p50_ms:>9.3f}{s.p90_ms:>9.3f}"
                f"{s.p99_ms:>9.3f}{s.mean_ms:>9.3f}{s.cv:>6.2f}{v.pooled('end_to_end').p50_ms:>9.3f}"
                f"{v.fps():>9.1f}{self.ratio(v):>7.2f}x{self.ratio(v, 'p90_ms'):>7.2f}x  {'yes' if v.valid else 'NO'}"
            )
        lines.append(
            "latency in ms (inference stage, warm-up excluded, repeats pooled); "
            "ratios = latency / first variant's (below 1 = faster)"
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
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1, default=_jsonable) + "\n")
        return path

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


def _jsonable(obj: Any) -> Any:
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


# ---------------------------------------------------------------------------------------------
# Variants and input frames


def expand_variants(specs: Sequence[str], variants: str = "default") -> list[tuple[str, str | None]]:
    """Expand model arguments into ``(path, variant)`` pairs, in order.

    ``BUNDLE:fp16`` names one model of a bundle; a plain bundle gives its default model,
    every model with ``variants="all"``, or the listed ones with ``variants="fp32,int8"``.
    Bare model files give themselves.
    """
    from edgekit.bundle import load_bundle

    out: list[tuple[str, str | None]] = []
    for spec in specs:
        path, named = split_model_spec(spec)
        if named or not path.is_dir() or variants in ("", "default"):
            out.append((str(path), named))
            continue
        models = [m.name for m in load_bundle(path, allow_rejected=True).models]
        wanted = models if variants == "all" else [v.strip() for v in variants.split(",") if v.strip()]
        missing = [v for v in wanted if v not in models]
        if missing:
            raise UsageError(f"bundle {path} has no variant {', '.join(missing)}", f"choose from: {', '.join(models)}")
        out.extend((str(path), m) for m in wanted)
    if not out:
        raise UsageError("nothing to benchmark", "give at least one bundle or model file")
    return out


def synthetic_frames(n: int = 32, size: tuple[int, int] = (640, 360), seed: int = 0) -> list[np.ndarray]:
    """``n`` deterministic BGR frames of ``size`` (width, height): smooth shapes plus sensor-like noise."""
    import cv2

    rng = np.random.default_rng(seed)
    w, h = size
    frames = []
    for _ in range(n):
        small = rng.integers(0, 256, size=(max(2, h // 40), max(2, w // 40), 3), dtype=np.uint8)
        img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
        noise = rng.integers(-8, 9, size=img.shape, dtype=np.int16)
        frames.append(np.clip(img.astype(np.int16) + noise, 0, 255).astype(np.uint8))
    return frames


def camera_frames(uri: str, n: int = 32, **options: Any) -> list[np.ndarray]:
    """The first ``n`` usable frames of a camera, held in memory so every variant sees the same ones.

    ``options`` go to :func:`edgekit.camera.open_camera` (``fps``, ``size``...).
    """
    from edgekit.camera import open_camera
    from edgekit.pipeline import is_valid_frame

    source = open_camera(uri, **options)
    try:
        frames = [f.array.copy() for f in itertools.islice(source, n) if is_valid_frame(f.array)]
    finally:
        source.close()
    if not frames:
        raise CameraError(f"camera {uri} delivered no usable frames", "check the URI and that it has frames")
    return frames


def replay(frames: Sequence[np.ndarray], clock: Callable[[], int] = time.perf_counter_ns) -> Iterator[Any]:
    """An endless source cycling over ``frames``; each frame is 'captured' when it is asked for."""
    from edgekit.camera import Frame

    for i in itertools.count():
        yield Frame(frames[i % len(frames)], clock(), i)


# ---------------------------------------------------------------------------------------------
# The benchmark


def single_stream(
    model: OpenModel, frames: Sequence[np.ndarray], config: BenchConfig, repeat: int = 0, t0_ns: int | None = None
) -> RunResult:
    """One SingleStream run: frames back to back until valid (or ``max_duration_s``)."""
    clock = time.perf_counter_ns
    t0_ns = clock() if t0_ns is None else t0_ns
    pipeline = Pipeline(model.runtime, model.labels, top_k=1, warmup=config.warmup, clock=clock)
    metrics = pipeline.metrics
    start = clock()
    min_ns = int(config.min_duration_s * 1e9)
    max_ns = int(config.max_duration_s * 1e9) if config.max_duration_s else None
    valid = False
    for _ in pipeline.run(replay(frames, clock)):
        done = metrics.completed_ns
        span = done[-1] - done[0] if done else 0
        if len(done) >= config.min_count and span >= min_ns:
            valid = True
            break
        if max_ns is not None and clock() - start >= max_ns:
            break
    done = metrics.completed_ns
    return RunResult(
        repeat=repeat,
        valid=valid,
        duration_s=(done[-1] - done[0]) / 1e9 if done else 0.0,
        summary=metrics.summary(),
        samples_ms={s: [round(x, 5) for x in metrics.samples_ms(s)] for s in ("inference", "preprocess", "end_to_end")},
        t_s=[round((t - t0_ns) / 1e9, 6) for t in done],
    )


def _backends_for(path: str, variant: str | None, backends: list[str | None]) -> list[str | None]:
    """The requested backends that can run this model's format (``[None]``: the bundle's own)."""
    from edgekit.bundle import load_bundle
    from edgekit.runtime import BACKENDS

    if backends == [None]:
        return [None]
    p = Path(path)
    try:
        if p.is_dir():
            fmt = load_bundle(p, check_hashes=False, allow_rejected=True).model(variant).format
        else:
            fmt = p.suffix.lstrip(".")
    except EdgekitError:
        return [None]  # let open_model report what is wrong with it
    usable = [b for b in backends if b is None or fmt in BACKENDS[b][1]]
    return usable or [None]


def _open_all(pairs: list[tuple[str, str | None]], config: BenchConfig) -> tuple[list[OpenModel], list[str]]:
    """Open every variant; with ``skip_unavailable``, variants this machine cannot run (no
    Edge TPU, no CUDA, a model compiled for other hardware) are left out with a reason."""
    options = dict(config.runtime_options)
    backends = options.pop("backend", None) or [None]
    backends = [backends] if isinstance(backends, str) else list(backends)
    if config.profile:
        options["profile"] = True
    opened: list[OpenModel] = []
    skipped: list[str] = []
    try:
        for path, variant in pairs:
            for backend in _backends_for(path, variant, backends):
                try:
                    m = open_model(path, variant, config.labels, backend=backend, **options)
                    if backend and len(backends) > 1:
                        m.name = f"{m.name}@{backend}"
                    opened.append(m)
                except (BackendUnavailable, ModelError) as exc:
                    if not config.skip_unavailable or not Path(path).exists():
                        raise
                    name = f"{Path(path).name}{':' + variant if variant else ''}{'@' + backend if backend else ''}"
                    skipped.append(f"skipped {name}: {exc.message}")
    except BaseException:
        for m in opened:
            m.close()
        raise
    if not opened:
        raise BackendUnavailable("none of the models can run on this machine: " + "; ".join(skipped))
    return opened, skipped


def run_bench(
    models: Sequence[str],
    config: BenchConfig | None = None,
    variants: str = "default",
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Benchmark models/bundles in this process, interleaved, ``config.repeats`` times.

    Args:
        models: bundle directories (``BUNDLE`` or ``BUNDLE:VARIANT``) or model files; the
            first is the reference for ratios.
        config: durations, counts, input and runtime options.
        variants: ``default``, ``all`` or a comma list, for bundles given without ``:VARIANT``.
        progress: called with a line after every run.

    Returns:
        A :class:`BenchReport`; ``report.valid`` is False if any run hit ``max_duration_s``
        before reaching both minimums.
    """
    config = config or BenchConfig()
    if config.repeats < 1 or config.min_count < 1 or config.min_duration_s < 0:
        raise UsageError("--repeats and --min-count must be at least 1 and --min-duration not negative")
    say = progress or (lambda _line: None)
    pairs = expand_variants(models, variants)
    frames = (
        camera_frames(config.camera, config.frames, **config.camera_options)
        if config.camera
        else synthetic_frames(config.frames, config.frame_size)
    )
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    opened, skipped = _open_all(pairs, config)
    try:
        results = [
            VariantResult(
                m.name,
                str(m.path),
                m.variant,
                m.precision,
                m.target,
                m.runtime.describe(),
                init_ms=getattr(m.runtime, "init_ms", None),
            )
            for m in opened
        ]
        t0 = time.perf_counter_ns()
        for repeat in range(config.repeats):
            # Rotate the order every repeat so no variant always runs first (or right after
            # the heaviest one): drift of a shared machine then hits every variant alike.
            order = [(repeat + i) % len(opened) for i in range(len(opened))]
            for i in order:
                run = single_stream(opened[i], frames, config, repeat, t0)
                results[i].runs.append(run)
                if repeat == 0:
                    results[i].first_inference_ms = run.summary["first_inference_ms"]
                s = run.stage()
                say(
                    f"repeat {repeat + 1}/{config.repeats}  {results[i].name:<24} n {s.count:5d}  "
                    f"p50 {s.p50_ms:8.3f} ms  p90 {s.p90_ms:8.3f} ms  {'valid' if run.valid else 'INVALID'}"
                )
        if config.profile:
            for m, r in zip(opened, results):
                r.profile = collect_profile(m.runtime)
    finally:
        for m in opened:
            m.close()
    machine = machine_context()
    report = BenchReport(config, machine, results, started)
    report.warnings = skipped + noise_warnings(report) + list(machine["warnings"])
    return report


def noise_warnings(report: BenchReport) -> list[str]:
    """Warnings for noisy or invalid variants: spread within runs and between repeats."""
    out = []
    cfg = report.config
    for v in report.variants:
        s = v.pooled()
        if s.count and s.cv > cfg.max_cv:
            out.append(
                f"{v.name}: noisy, coefficient of variation {s.cv:.2f} > {cfg.max_cv:.2f} (close other "
                "programs, set the governor to performance, or raise --min-duration)"
            )
        p50s = v.repeat_p50s()
        if len(p50s) >= 2 and statistics.mean(p50s) > 0:
            spread = statistics.stdev(p50s) / statistics.mean(p50s)
            if spread > REPEAT_SPREAD_BOUND:
                out.append(
                    f"{v.name}: medians differ between repeats (cv {spread:.2f} > {REPEAT_SPREAD_BOUND}): "
                    "the machine's speed drifted; compare ratios, not absolute times"
                )
        if not v.valid:
            bad = sum(not r.valid for r in v.runs)
            out.append(
                f"{v.name}: {bad} run(s) invalid: --max-duration reached before --min-count frames "
                "over --min-duration seconds"
            )
    return out


def collect_profile(runtime: Any) -> dict[str, Any] | None:
    """Per-op profile: measured by ONNX Runtime's profiler, static (op counts) for LiteRT."""
    if hasattr(runtime, "end_profiling"):
        from edgekit.runtime.onnxrt import summarize_profile

        trace = runtime.end_profiling()
        if trace:
            return {"kind": "measured", "trace": trace, "ops": summarize_profile(trace)}
        return None
    if hasattr(runtime, "op_profile"):
        return {
            "kind": "static",
            "note": "LiteRT's Python API exposes no per-op timings; op counts and where they run",
            "ops": runtime.op_profile(),
        }
    return None


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
        lines.append(f"  trace: {p['trace']} (profiling adds overhead to the latencies above)")
    else:
        lines.append(f"  {'op type':<24}{'count':>7}{'delegated':>11}{'cpu':>6}   ({p['note']})")
        for r in p["ops"][:top]:
            lines.append(f"  {r['op_type']:<24}{r['count']:>7}{r['delegated']:>11}{r['cpu']:>6}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, imported only when asked for; no pyplot, so no GUI backend and no global state)


def write_plots(report: BenchReport, path: str | Path) -> list[Path]:
    """Write a box-and-whisker PNG (variants x repeats) at ``path`` and a latency-over-time PNG
    beside it (``<stem>-timeline.png``). Returns both paths."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        from edgekit.errors import BackendUnavailable

        raise BackendUnavailable("--plot needs matplotlib", "pip install 'edgekit[plot]'") from exc
    path = Path(path)
    timeline = path.with_name(f"{path.stem}-timeline{path.suffix or '.png'}")
    colours = [f"C{i % 10}" for i in range(len(report.variants))]

    boxes = sum(len(v.runs) for v in report.variants)
    fig = Figure(figsize=(min(14.0, max(6.0, 0.8 * boxes)), 4.5), layout="constrained")
    ax = fig.add_subplot()
    pos, data, cols, centres = [], [], [], []
    x = 0
    for v, c in zip(report.variants, colours):
        first = x
        for r in v.runs:
            pos.append(x)
            data.append(r.samples_ms["inference"] or [np.nan])
            cols.append(c)
            x += 1
        centres.append((first + x - 1) / 2)
        x += 1  # a gap between variants
    box = ax.boxplot(data, positions=pos, widths=0.7, patch_artist=True, flierprops={"markersize": 2})
    for patch, c in zip(box["boxes"], cols):
        patch.set_facecolor(c)
        patch.set_alpha(0.5)
    ax.set_xticks(centres, [v.name for v in report.variants], rotation=15, ha="right")
    ax.set_ylabel("inference latency (ms)")
    ax.set_title("Inference latency per variant, one box per repeat")
    log_scale, top = _y_axis(report)
    cut = f" ({_count_above(report, top)} samples above {top:.3g} ms not shown)" if top and not log_scale else ""
    if log_scale:
        ax.set_yscale("log")  # variants an order of magnitude apart: keep both readable
    elif top:
        ax.set_ylim(0, top)
    ax.set_title("Inference latency per variant, one box per repeat" + cut, fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=120)

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for v, c in zip(report.variants, colours):
        for k, r in enumerate(v.runs):
            ax.plot(r.t_s, r.samples_ms["inference"], ".", markersize=2, color=c, label=v.name if k == 0 else None)
    ax.set_xlabel("time since the benchmark started (s)")
    ax.set_ylabel("inference latency (ms)")
    ax.set_title("Latency over time (runs interleaved across variants)" + cut, fontsize="medium")
    if log_scale:
        ax.set_yscale("log")
    elif top:
        ax.set_ylim(0, top)
    ax.legend(markerscale=5, fontsize="small")
    ax.grid(alpha=0.3)
    fig.savefig(timeline, dpi=120)
    return [path, timeline]


def _y_axis(report: BenchReport) -> tuple[bool, float | None]:
    """(log scale?, upper limit or None).

    Rare outliers (a preempted thread, a page fault) must not squash every box to a line:
    the axis stops at twice the highest upper whisker (Q3 + 1.5 IQR) of any box.
    """
    pooled = [v.pooled() for v in report.variants if v.pooled().count]
    p50s = [s.p50_ms for s in pooled]
    if p50s and min(p50s) > 0 and max(p50s) / min(p50s) > 20:
        return True, None
    whiskers = []
    for v in report.variants:
        for r in v.runs:
            if r.samples_ms["inference"]:
                q1, q3 = np.percentile(r.samples_ms["inference"], [25, 75])
                whiskers.append(q3 + 1.5 * (q3 - q1))
    if not whiskers:
        return False, None
    top = 2 * max(whiskers)
    return False, (top if max(s.max_ms for s in pooled) > top else None)


def _count_above(report: BenchReport, top: float) -> int:
    return sum(x > top for v in report.variants for x in v.samples())


# ---------------------------------------------------------------------------------------------
# Accuracy mode


def _norm(name: str) -> str:
    # Folder names cannot hold every label character ("T-shirt/top"): compare letters and digits only.
    return re.sub(r"[^0-9a-z]", "", name.lower())


def eval_items(directory: str | Path, labels: Sequence[str]) -> tuple[list[tuple[Path, int]], list[str]]:
    """The images of an ImageFolder (one subfolder per class) with the class index of each.

    Subfolders are matched to ``labels`` by name (case, spaces and punctuation ignored);
    without labels, numeric folder names are taken as class indices.
    """
    from edgekit.image import IMAGE_SUFFIXES

    root = Path(directory)
    if not root.is_dir():
        raise CalibrationError(f"evaluation folder {root} does not exist", "give a folder with one subfolder per class")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    if not folders:
        raise CalibrationError(f"{root} has no class subfolders", "lay it out as DIR/<class name>/<image files>")
    index = {_norm(label): i for i, label in enumerate(labels)}
    items: list[tuple[Path, int]] = []
    unknown = []
    for folder in folders:
        cls = index.get(_norm(folder.name))
        if cls is None and not labels and folder.name.isdigit():
            cls = int(folder.name)
        if cls is None:
            unknown.append(folder.name)
            continue
        items.extend((f, cls) for f in sorted(folder.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES)
    if unknown:
        hint = f"labels are: {', '.join(labels)}" if labels else "give --labels FILE or name folders 0, 1, 2..."
        raise CalibrationError(f"class folder(s) {', '.join(unknown)} in {root} match no label of the model", hint)
    if not items:
        raise CalibrationError(f"{root} holds no images ({', '.join(IMAGE_SUFFIXES)})", "add images per class")
    return items, [f.name for f in folders]


@dataclass
class EvalResult:
    """Top-1 accuracy of one variant on an ImageFolder."""

    name: str
    images: int
    unreadable: int
    accuracy: float
    per_class: dict[str, float]
    predictions: list[int]
    runtime: dict[str, Any]
    agreement: float | None = None


def evaluate(
    models: Sequence[str],
    directory: str | Path,
    variants: str = "default",
    runtime_options: dict[str, Any] | None = None,
    labels: str | None = None,
) -> list[EvalResult]:
    """Top-1 accuracy of every variant on the same images, through the same pipeline.

    ``agreement`` is the share of images where a variant's top-1 equals the first variant's.
    Unreadable or truncated images are skipped and counted.
    """
    from edgekit.camera import Frame
    from edgekit.image import ImageReadError, read_image

    out: list[EvalResult] = []
    for path, variant in expand_variants(models, variants):
        with open_model(path, variant, labels, **(runtime_options or {})) as m:
            items, _ = eval_items(directory, m.labels)
            pipeline = Pipeline(m.runtime, m.labels, top_k=1, warmup=0)
            preds, truth, unreadable = [], [], 0
            for i, (file, cls) in enumerate(items):
                try:
                    image = read_image(file)
                except ImageReadError:
                    unreadable += 1
                    continue
                result = pipeline.step(Frame(image, time.perf_counter_ns(), i))
                if result is None:
                    unreadable += 1
                    continue
                preds.append(result.classification.top.index)
                truth.append(cls)
            if not preds:
                raise CalibrationError(f"no readable image in {directory}", "check the image files")
            p, t = np.array(preds), np.array(truth)
            names = {c: label for c, label in enumerate(m.labels)}
            per_class = {names.get(int(c), str(c)): float((p[t == c] == c).mean()) for c in np.unique(t)}
            out.append(
                EvalResult(
                    m.name, len(preds), unreadable, float((p == t).mean()), per_class, preds, m.runtime.describe()
                )
            )
    ref = out[0].predictions
    for r in out:
        if len(r.predictions) == len(ref):
            r.agreement = float(np.mean(np.array(r.predictions) == np.array(ref)))
    return out


def format_eval(results: list[EvalResult]) -> str:
    """Accuracy table with the ratio to the first variant."""
    head = f"{'variant':<28}{'runtime':<34}{'images':>8}{'top-1':>8}{'ratio':>8}{'agree':>8}"
    lines = [head, "-" * len(head)]
    ref = results[0].accuracy
    for r in results:
        ratio = r.accuracy / ref if ref else float("nan")
        agree = f"{r.agreement:.1%}" if r.agreement is not None else "n/a"
        lines.append(
            f"{r.name[:27]:<28}{short_runtime(r.runtime)[:33]:<34}{r.images:>8}{r.accuracy:>8.1%}"
            f"{ratio:>8.3f}{agree:>8}"
        )
        if r.unreadable:
            lines.append(f"  ({r.unreadable} unreadable image(s) skipped)")
    lines.append("ratio = top-1 / first variant's top-1; agree = same top-1 as the first variant")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CLI


