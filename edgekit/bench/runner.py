"""``edgekit bench`` as a library: compare bundles/variants side by side with honest statistics.

    edgekit bench dist/demo-cpu --variants all --synthetic
    edgekit bench dist/demo-cpu:fp32 dist/demo-cpu:int8 --camera file:clip.mp4 --repeats 5
    edgekit bench model.tflite --json out.json --csv out.csv --plot out.png

In the spirit of MLPerf SingleStream: frames are fed one at a time, each after the
previous result; a run is valid only once it has lasted ``--min-duration`` seconds *and*
measured ``--min-count`` frames. Every variant is opened in this one process and the runs
are interleaved (repeat 1: A B C, repeat 2: B C A, ...) so that drift of a shared machine
hits all variants alike; results are reported as ratios to the first variant, with the
machine context and a warning when the numbers are noisy.

This module measures (:func:`run_bench`, :func:`single_stream`); which variants it opens, and how
(``--skip-unavailable``), is :mod:`edgekit.bench.variants`; the report it returns, its
table, JSON, CSV and warnings are in :mod:`edgekit.bench.report`, plots in
:mod:`edgekit.bench.plots`, and the accuracy mode (``--eval``) in :mod:`edgekit.bench.accuracy`.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bench.cascade import open_second
from edgekit.bench.caveats import noise_warnings
from edgekit.bench.machine import machine_context
from edgekit.bench.report import BenchReport, RunResult, VariantResult
from edgekit.bench.variants import expand_variants, open_all
from edgekit.errors import CameraUnavailable, EdgekitError, UsageError
from edgekit.model import OpenModel
from edgekit.pipeline import Pipeline


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
    names: dict[str, str] = field(default_factory=dict)  # --label NAME=PATH (edgekit.bench.variants.distinct_labels)
    then: str | None = None  # a cascade: every variant feeds this SECOND[:VARIANT] (roi: its region options,
    roi: Any = None  # edgekit.cascade.region.parse_roi; then_options: its open_model keywords)
    then_options: dict[str, Any] = field(default_factory=dict)


# --- Input frames ------------------------------------------------------------------------------


def synthetic_frames(n: int = 32, size: tuple[int, int] = (640, 360), seed: int = 0) -> list[np.ndarray]:
    """``n`` deterministic BGR frames of ``size`` (width, height): smooth shapes plus sensor-like noise."""
    from edgekit.imaging.imgops import resize
    from edgekit.util.quiet import optional_cv2

    cv2 = optional_cv2()  # OpenCV is an extra: without it the smooth shapes are bilinear, not bicubic
    rng = np.random.default_rng(seed)
    w, h = size
    frames = []
    for _ in range(n):
        small = rng.integers(0, 256, size=(max(2, h // 40), max(2, w // 40), 3), dtype=np.uint8)
        img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC) if cv2 else resize(small, h, w, "linear")
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
        raise CameraUnavailable(f"camera {uri} delivered no usable frames", "check the URI and that it has frames")
    return frames


def replay(frames: Sequence[np.ndarray], clock: Callable[[], int] = time.perf_counter_ns) -> Iterator[Any]:
    """An endless source cycling over ``frames``; each frame is 'captured' when it is asked for."""
    from edgekit.camera import Frame

    for i in itertools.count():
        yield Frame(frames[i % len(frames)], clock(), i)


# --- The benchmark -------------------------------------------------------------------------------


def single_stream(
    model: OpenModel, frames: Sequence[np.ndarray], config: BenchConfig, repeat: int = 0, t0_ns: int | None = None,
    then: Any = None,
) -> RunResult:
    """One SingleStream run: frames back to back until valid (or ``max_duration_s``); ``then``: a cascade's."""
    clock = time.perf_counter_ns
    t0_ns = clock() if t0_ns is None else t0_ns
    pipeline = Pipeline(model.runtime, model.labels, top_k=1, warmup=config.warmup, clock=clock,
                        task=getattr(model, "task", "classify"), task_options=getattr(model, "task_options", None),
                        then=then)
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
        # every stage the pipeline recorded: a detector adds decode and nms (within postprocess)
        samples_ms={s: [round(x, 5) for x in metrics.samples_ms(s)] for s in metrics.stages if s != "capture_wait"},
        t_s=[round((t - t0_ns) / 1e9, 6) for t in done],
    )


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
        A :class:`~edgekit.bench.report.BenchReport`; ``report.valid`` is False if any run hit
        ``max_duration_s`` before reaching both minimums.
    """
    config = config or BenchConfig()
    if config.repeats < 1 or config.min_count < 1 or config.min_duration_s < 0:
        raise UsageError("--repeats and --min-count must be at least 1 and --min-duration not negative")
    pairs = expand_variants(models, variants)
    frames = (
        camera_frames(config.camera, config.frames, **config.camera_options)
        if config.camera
        else synthetic_frames(config.frames, config.frame_size)
    )
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    opened, skipped = open_all(pairs, config)
    second = None  # a cascade's second model (--then), open for the whole bench
    try:
        second = open_second(opened, config.then, config.roi, config.then_options, progress)
        manifests = [_manifest(m) for m in opened]  # read once: the model's name and its default
        results = [
            VariantResult(m.name, str(m.path), m.variant, m.precision, m.target, m.runtime.describe(),
                          init_ms=getattr(m.runtime, "init_ms", None), model=model_of(m, manifest),
                          default=m.variant is not None and manifest.get("default_model") == m.variant)
            for m, manifest in zip(opened, manifests)
        ]
        for m in opened:  # a bare model's shape, layout and colour are assumptions: say them
            assumed = getattr(m, "assumed_input", lambda: None)()
            if assumed and progress:
                progress(f"{m.name}: input {assumed}")
        _interleave(opened, results, frames, config, progress or (lambda _line: None), second)
        if config.profile:
            for m, r in zip(opened, results):
                r.profile = collect_profile(m.runtime)
    finally:
        for m in opened + ([second.model] if second is not None else []):
            m.close()
    machine = machine_context()
    report = BenchReport(config, machine, results, started)
    report.warnings = skipped + noise_warnings(report) + list(machine["warnings"])
    return report


def _interleave(opened: list[OpenModel], results: list[VariantResult], frames: Sequence[np.ndarray],
                config: BenchConfig, say: Callable[[str], None], second: Any = None) -> None:
    """Every repeat runs every variant once, appending to ``results``."""
    t0 = time.perf_counter_ns()
    total, done = config.repeats * len(opened), 0
    for repeat in range(config.repeats):
        # Rotate the order every repeat so no variant always runs first (or right after
        # the heaviest one): drift of a shared machine then hits every variant alike.
        order = [(repeat + i) % len(opened) for i in range(len(opened))]
        for i in order:
            run = single_stream(opened[i], frames, config, repeat, t0, second.stage if second else None)
            results[i].runs.append(run)
            if repeat == 0:
                results[i].first_inference_ms = run.summary["first_inference_ms"]
            s = run.stage()
            done += 1
            say(
                f"[{done}/{total} {_eta(t0, done, total)}] "
                f"repeat {repeat + 1}/{config.repeats}  {results[i].name:<24} n {s.count:5d}  "
                f"p50 {s.p50_ms:8.3f} ms  p90 {s.p90_ms:8.3f} ms  {'valid' if run.valid else 'INVALID'}"
            )


def _eta(t0_ns: int, done: int, total: int) -> str:
    """``ETA 1m05s`` from the mean time per run so far (``done`` when nothing is left)."""
    if done >= total:
        return "done"
    left = (time.perf_counter_ns() - t0_ns) / 1e9 / done * (total - done)
    return f"ETA {int(left // 60)}m{int(left % 60):02d}s"


def _manifest(m: OpenModel) -> dict[str, Any]:
    """A bundle's manifest (hashes were checked when it was opened); {} for a bare model file."""
    if m.variant is None:
        return {}
    from edgekit.bundle import load_bundle

    try:
        return load_bundle(m.path, check_hashes=False, allow_rejected=True).manifest
    except EdgekitError:
        return {}


def model_of(m: OpenModel, manifest: dict[str, Any]) -> str:
    """What model ``m`` is a form of: its bundle's source model (so its targets and variants are
    compared with each other), else the file's name."""
    provenance = manifest.get("provenance")
    source = provenance.get("source_model") if isinstance(provenance, dict) else None
    return source if isinstance(source, str) and source else m.path.name


def _remove_trace(trace: Path) -> None:
    """Delete ONNX Runtime's trace and the temporary directory the adapter made for it."""
    with contextlib.suppress(OSError):
        trace.unlink()
        if trace.parent.name.startswith("edgekit-ort-"):
            trace.parent.rmdir()


def collect_profile(runtime: Any) -> dict[str, Any] | None:
    """Per-op profile: measured by ONNX Runtime's profiler, static (op counts) for LiteRT."""
    if hasattr(runtime, "end_profiling"):
        from edgekit.runtime.onnxrt import summarize_profile

        trace = runtime.end_profiling()
        if trace:
            ops = summarize_profile(trace)
            _remove_trace(Path(trace))  # the summary is what is kept; no edgekit-ort-* temporary directory left behind
            return {"kind": "measured", "ops": ops}
        return None
    if hasattr(runtime, "op_profile"):
        return {
            "kind": "static",
            "note": "LiteRT's Python API exposes no per-op timings; op counts and where they run",
            "ops": runtime.op_profile(),
        }
    return None
