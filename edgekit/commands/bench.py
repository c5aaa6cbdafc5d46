"""``edgekit bench``: argparse and printing for the benchmark library (:mod:`edgekit.bench`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from edgekit.errors import UsageError
from edgekit.options import (
    add_bundle_options,
    add_camera_options,
    add_runtime_options,
    at_least,
    camera_help,
    camera_options,
    runtime_options,
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit bench``'s arguments."""
    parser.add_argument(
        "models",
        nargs="+",
        metavar="BUNDLE_OR_MODEL",
        help="bundle dirs (BUNDLE or BUNDLE:VARIANT) or .tflite/.onnx files; the first is the reference for ratios",
    )
    parser.add_argument(
        "--variants",
        default="default",
        help="for bundles: 'default', 'all' or a list such as fp32,int8 (default: default)",
    )
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--synthetic", action="store_true", help="synthetic frames (the default input)")
    src.add_argument(
        "--camera",
        metavar="URI",
        help=camera_help("file:clip.mp4, folder:DIR, v4l2:N, rtsp://...")
        + "; --frames frames are taken from it and replayed",
    )
    add_camera_options(parser)
    parser.add_argument(
        "--frames", type=at_least(1), default=32, help="frames held in memory and replayed (default 32)"
    )
    g = parser.add_argument_group("measurement")
    g.add_argument(
        "--min-duration", type=at_least(0.0, float), default=2.0, metavar="S", help="seconds per run (default 2)"
    )
    g.add_argument("--min-count", type=at_least(1), default=100, metavar="N", help="frames per run (default 100)")
    g.add_argument("--max-duration", type=float, metavar="S", help="give up on a run after S s (marked invalid)")
    g.add_argument("--repeats", type=at_least(1), default=3, help="interleaved repeats (default 3)")
    g.add_argument(
        "--warmup", type=at_least(0), default=10, help="frames left out at the start of each run (default 10)"
    )
    g.add_argument("--max-cv", type=float, default=0.25, help="warn above this coefficient of variation")
    add_runtime_options(parser, several_backends=True)
    add_bundle_options(parser)
    o = parser.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help="full report with raw samples and machine context")
    o.add_argument("--csv", metavar="FILE", help="one row per variant and repeat")
    o.add_argument("--plot", metavar="PNG", help="box plot here and a latency-over-time plot beside it")
    o.add_argument("--profile", action="store_true", help="per-op profile (ONNX Runtime: measured; LiteRT: static)")
    o.add_argument("--eval", metavar="DIR", help="accuracy mode: ImageFolder with one subfolder per class")
    o.add_argument(
        "--skip-unavailable",
        action="store_true",
        help="leave out (with a warning) variants this machine cannot run, e.g. an Edge TPU bundle",
    )


def main(args: argparse.Namespace) -> int:
    """Run the benchmark (or the accuracy evaluation) and print the table."""
    for flag in ("json", "csv", "plot"):
        # fail before minutes of measuring, not after
        target = getattr(args, flag)
        if target and not os.access(Path(target).resolve().parent, os.W_OK):
            raise UsageError(
                f"--{flag} {target}: cannot write to {Path(target).resolve().parent}",
                "choose an existing, writable directory",
            )
    if args.eval:
        return _evaluate(args)
    from edgekit.bench import BenchConfig, run_bench

    config = BenchConfig(
        min_duration_s=args.min_duration,
        min_count=args.min_count,
        max_duration_s=args.max_duration,
        repeats=args.repeats,
        warmup=args.warmup,
        max_cv=args.max_cv,
        frames=args.frames,
        camera=args.camera,
        camera_options=camera_options(args),
        profile=args.profile,
        skip_unavailable=args.skip_unavailable,
        runtime_options=runtime_options(args),
        labels=args.labels,
    )

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = run_bench(args.models, config, args.variants, progress)
    _print_report(report, args)
    return 0 if report.valid else 1


def _evaluate(args: argparse.Namespace) -> int:
    """``--eval DIR``: the accuracy table (and the JSON report with ``--json``)."""
    from edgekit.accuracy import evaluate, format_eval
    from edgekit.bench_report import jsonable
    from edgekit.metrics import machine_context

    results = evaluate(args.models, args.eval, args.variants, runtime_options(args), args.labels)
    print(format_eval(results))
    if args.json:
        report = {"machine": machine_context(), "eval": [r.__dict__ for r in results]}
        Path(args.json).write_text(json.dumps(report, indent=1, default=jsonable) + "\n")
    return 0


def _print_report(report, args: argparse.Namespace) -> None:
    """The machine line, what runs each variant, the table, profiles, warnings and files written."""
    from edgekit.bench_report import format_profile
    from edgekit.runtime import describe_runtime

    m = report.machine
    print(
        f"machine: {m['cpu_model']}, {m['cores_usable']}/{m['cores']} cores, "
        f"governor {m['governor'] or 'unreadable'}, "
        f"load {', '.join(f'{x:.2f}' for x in m['load_average'] or [])}"
    )
    for v in report.variants:
        print(f"  {v.name}: {describe_runtime(v.runtime)}, first inference {v.first_inference_ms or 0:.2f} ms")
    print(report.table())
    if args.profile:
        for v in report.variants:
            print(format_profile(v))
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(f"json: {report.write_json(args.json)}")
    if args.csv:
        print(f"csv: {report.write_csv(args.csv)}")
    if args.plot:
        from edgekit.bench_plots import write_plots

        print("plots: " + ", ".join(str(p) for p in write_plots(report, args.plot)))
