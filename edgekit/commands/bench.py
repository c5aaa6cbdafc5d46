"""``edgekit bench``: argparse and printing for the benchmark library (:mod:`edgekit.bench.runner`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgekit.errors import BackendUnavailable, UsageError
from edgekit.modelinfo.preprocessing import add_preprocess_options, preprocess_flags
from edgekit.options import (
    add_bundle_options,
    add_camera_options,
    add_cascade_options,
    add_runtime_options,
    at_least,
    camera_help,
    camera_options,
    cascade_model_options,
    runtime_options,
)
from edgekit.util.finite_json import strict_dumps


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit bench``'s arguments."""
    parser.add_argument(
        "models",
        nargs="*",  # checked in main: at least one (a deprecated `--json FILE` may not eat it)
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
        "--frames", type=_frames, default=32,
        help=f"frames held in memory and replayed (default 32, at most {MAX_FRAMES})"
    )
    g = parser.add_argument_group("measurement")
    g.add_argument(
        "--min-duration", type=at_least(0.0, float), default=2.0, metavar="S", help="seconds per run (default 2)"
    )
    g.add_argument("--min-count", type=at_least(1), default=100, metavar="N", help="frames per run (default 100)")
    g.add_argument("--max-duration", type=at_least(0.0, float), metavar="S",
                   help="give up on a run after S s (marked invalid)")
    g.add_argument("--repeats", type=at_least(1), default=3, help="interleaved repeats (default 3)")
    g.add_argument(
        "--warmup", type=at_least(0), default=10, help="frames left out at the start of each run (default 10)"
    )
    g.add_argument("--max-cv", type=at_least(0.0, float), default=0.25, help="warn above this coefficient of variation")
    add_runtime_options(parser, several_backends=True)
    add_bundle_options(parser)
    add_preprocess_options(parser)
    _add_cascade_gate(add_cascade_options(parser))
    o = parser.add_argument_group("output")
    o.add_argument("--json", nargs="?", const=True, default=None, metavar="",
                   help="the report as JSON on stdout (summary statistics; the table goes to stderr)")
    o.add_argument("--json-file", metavar="FILE", help="full report with raw samples and machine context, to FILE")
    o.add_argument("--csv", metavar="FILE", help="one row per variant and repeat")
    o.add_argument("--plot", metavar="PNG", help="box plot here and a latency-over-time plot beside it")
    o.add_argument("--profile", action="store_true", help="per-op profile (ONNX Runtime: measured; LiteRT: static)")
    o.add_argument("--eval", metavar="DIR", help="accuracy mode: ImageFolder with one subfolder per class; "
                   "for a detector, a COCO (annotations.json) or YOLO (images/ + labels/) set: mAP per variant")
    o.add_argument("--label", action="append", type=_label, metavar="NAME=PATH",
                   help="call PATH (BUNDLE, BUNDLE:VARIANT or a model file, as given) NAME in rows, progress "
                        "and plots; repeatable (two bundles of one name are told apart by their paths anyway)")
    o.add_argument("--set-default", action="store_true", help=SET_DEFAULT_HELP)
    o.add_argument(
        "--skip-unavailable",
        action="store_true",
        help="leave out (with a warning) variants this machine cannot run, e.g. an Edge TPU bundle",
    )


def _label(text: str) -> tuple[str, str]:
    """``--label NAME=PATH`` -> ``(NAME, PATH)`` (edgekit.bench.variants.distinct_labels applies it)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PATH (e.g. new=dist/demo-cpu:int8)")
    return name.strip(), path.strip()


def _add_cascade_gate(g: argparse._ArgumentGroup) -> None:
    """``--max-cascade-error`` and ``--min-cascade-agreement`` (the gate of ``--then ... --eval DIR``),
    in the cascade group add_cascade_options made (defaults: edgekit.bench.cascade_eval's, not imported here)."""
    g.add_argument("--max-cascade-error", type=at_least(0.0, float), default=0.05, metavar="W",
                   help="with --eval: a pair's p90 landmark error, in box widths (default 0.05; exit 3 over it)")
    g.add_argument("--min-cascade-agreement", type=at_least(0.0, float), default=0.95, metavar="F",
                   help="with --eval: detection, presence and sub-label agreement (default 0.95; "
                        "exit 3 under it)")


def _json_flag(args: argparse.Namespace) -> None:
    """``--json`` is a stdout switch. ``--json FILE`` (the old spelling) still works when FILE
    ends in ``.json``, with a note; any other word after ``--json`` is the first model."""
    value = args.json
    if isinstance(value, str):
        if value.lower().endswith(".json") and not Path(value).is_dir():
            print(f"edgekit bench: note: --json FILE is deprecated; use --json-file {value}", file=sys.stderr)
            args.json_file = args.json_file or value
            args.json = False
        else:
            args.models.insert(0, value)
            args.json = True
    args.json = bool(args.json)
    if not args.models:
        raise UsageError("no model to benchmark", "give bundle directories (BUNDLE or BUNDLE:VARIANT) or model files")


SET_DEFAULT_HELP = ("time every variant of one BUNDLE and write the fastest that passed (past 1.05x, by each "
                    "repeat's fastest run) as its default in edgekit.json, with this machine")
MAX_FRAMES = 1000  # held in memory: 1000 VGA frames are ~0.9 GB (1e8 was an endless allocation)
# What matplotlib's savefig writes (its error for anything else came after the whole benchmark)
_PLOT_FORMATS = ("png", "svg", "svgz", "pdf", "jpg", "jpeg", "tif", "tiff", "webp", "eps", "ps", "gif", "avif", "pgf",
                 "raw", "rgba")


def _frames(text: str) -> int:
    value = at_least(1)(text)
    if value > MAX_FRAMES:
        raise argparse.ArgumentTypeError(f"at most {MAX_FRAMES} (they are held in memory), got {text}")
    return value


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (matplotlib takes a second)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: blocked with sys.modules[name] = None
        return False


def _preflight(args: argparse.Namespace) -> None:
    """What would fail after minutes of measuring fails now: unwritable outputs, missing extras."""
    from edgekit.outputs.outpath import check_output_file

    for flag in ("json_file", "csv", "plot"):
        # found after the whole benchmark otherwise: a directory, a path through a file, a FIFO
        if getattr(args, flag):
            check_output_file(getattr(args, flag), f"--{flag.replace('_', '-')}")
    suffix = Path(args.plot).suffix.lower().lstrip(".") if args.plot else ""
    if suffix and suffix not in _PLOT_FORMATS:
        raise UsageError(f"--plot {args.plot}: matplotlib cannot write .{suffix} files",
                         f"end the name in .png (or {', '.join(_PLOT_FORMATS[1:6])} ...)")
    if args.plot and not _installed("matplotlib"):
        raise BackendUnavailable("--plot needs matplotlib, which is not installed",
                                 "pip install 'edgekit-vision[plot]', or leave out --plot")
    if args.set_default:  # one bundle, speed only: refused before minutes of measuring
        from edgekit.bench.set_default import check_request

        check_request(args.models, args.eval)
    if args.eval:
        from edgekit.util.quiet import optional_cv2

        if optional_cv2() is None and not _installed("PIL"):
            raise BackendUnavailable("--eval reads image files and needs Pillow or OpenCV; neither is installed",
                                     "pip install 'edgekit-vision[images]'")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark (or the accuracy evaluation) and print the table."""
    from edgekit.outputs.outstream import guarded_stdout

    _json_flag(args)
    _preflight(args)
    with guarded_stdout():  # `--json > report.json` on a full disk: one error line, not exit 0 and a cut file
        return _evaluate(args) if args.eval else _bench(args)


def _bench(args: argparse.Namespace) -> int:
    from edgekit.bench.runner import BenchConfig, run_bench

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
        names=dict(args.label or []),
        runtime_options=_model_options(args),
        labels=args.labels,
        then=args.then,
        roi=args.roi,
        then_options=cascade_model_options(args),
    )

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    variants = "all" if args.set_default and args.variants == "default" else args.variants  # --set-default: all
    report = run_bench(args.models, config, variants, progress)
    if config.camera:  # the report (stdout, --json-file) names the camera: never a stream's password
        import dataclasses

        from edgekit.camera import redact_uri

        report.config = dataclasses.replace(config, camera=redact_uri(config.camera))
    _print_report(report, args)
    if args.set_default and report.valid:
        from edgekit.bench.set_default import set_default

        for line in set_default(report, args.models[0]).lines():
            print(line, file=sys.stderr if args.json or line.startswith("warning:") else sys.stdout)
    return 0 if report.valid else 1


def _evaluate(args: argparse.Namespace) -> int:
    """``--eval DIR``: the accuracy table (and the JSON report with ``--json``)."""
    from edgekit.bench.accuracy import evaluate, format_eval
    from edgekit.bench.machine import machine_context
    from edgekit.bench.report import jsonable
    from edgekit.util.atomic import write_text_atomic

    options = _model_options(args)
    if args.then:
        return _evaluate_cascade(args, options)
    results = []
    for backend in options.pop("backend", None) or [None]:  # --backend repeats: one pass per backend
        chosen = {**options, "backend": backend} if backend else options
        results += evaluate(args.models, args.eval, args.variants, chosen, args.labels, dict(args.label or []))
    ref = results[0].predictions
    for r in results:  # agreement with the first row over all backends, not only within one pass
        same = r.metric == "top-1" and len(r.predictions) == len(ref) > 0  # detectors: mAP, no top-1 to agree on
        r.agreement = sum(a == b for a, b in zip(r.predictions, ref)) / len(ref) if same else None
    print(format_eval(results), file=sys.stderr if args.json else sys.stdout)
    report = {"machine": machine_context(), "eval": [r.__dict__ for r in results]}
    text = strict_dumps(report, indent=1, default=jsonable) + "\n"
    if args.json:
        sys.stdout.write(text)
    if args.json_file:
        write_text_atomic(Path(args.json_file), text, force=True)
    return 0


def _evaluate_cascade(args: argparse.Namespace, options: dict) -> int:
    """``--then SECOND --eval DIR``: every variant pair's cascade against the first pair's; exit 3
    when a pair misses the gate (:mod:`edgekit.bench.cascade_eval`)."""
    from edgekit.bench.cascade_eval import evaluate_cascade, format_cascade
    from edgekit.errors import EXIT_GATE

    if len(args.models) > 1:
        raise UsageError(f"--then with --eval takes one detector, not {len(args.models)} models",
                         "give DET (its variants per --variants) --then SECOND")
    backends = options.pop("backend", None) or [None]  # one backend here: the first given
    second = cascade_model_options(args)
    result = evaluate_cascade(args.models[0], args.then, args.eval, args.variants, args.roi,
                              {**options, "backend": backends[0]}, second, args.labels,
                              args.max_cascade_error, args.min_cascade_agreement)
    print(format_cascade(result), file=sys.stderr if args.json else sys.stdout)
    text = strict_dumps({"cascade": result.to_dict()}, indent=1) + "\n"
    if args.json:
        sys.stdout.write(text)
    if args.json_file:
        from edgekit.util.atomic import write_text_atomic

        write_text_atomic(Path(args.json_file), text, force=True)
    for pair in result.failed:
        print(f"edgekit bench: cascade gate: {pair.name}: {', '.join(pair.failures)}", file=sys.stderr)
    return EXIT_GATE if result.failed else 0


def _model_options(args: argparse.Namespace) -> dict:
    """The open_model keywords: runtime flags, and a bare model's preprocessing flags (a bundle refuses them)."""
    preprocess = preprocess_flags(args)
    return {**runtime_options(args), **({"preprocess": preprocess} if preprocess else {})}


def _print_report(report, args: argparse.Namespace) -> None:
    """The machine line, what runs each variant, the table, profiles, warnings and files written."""
    from edgekit.bench.report import format_profile
    from edgekit.runtime import describe_runtime

    out = sys.stderr if args.json else sys.stdout  # with --json, stdout is the JSON alone
    m = report.machine
    print(
        f"machine: {m['cpu_model']}, {m['cores_usable']}/{m['cores']} cores, "
        f"governor {m['governor'] or 'unreadable'}, "
        f"load {', '.join(f'{x:.2f}' for x in m['load_average'] or [])}",
        file=out,
    )
    for v in report.variants:
        print(f"  {v.name}: {describe_runtime(v.runtime)}, first inference {v.first_inference_ms or 0:.2f} ms",
              file=out)
    print(report.table(), file=out)
    for v in report.variants:  # where the time goes: a detector's decode and NMS are stages of their own
        stages = v.stage_p50s()
        print(f"  {v.name} stage p50 ms: " + ", ".join(f"{k} {ms:.3f}" for k, ms in stages.items()), file=out)
    if args.profile:
        for v in report.variants:
            print(format_profile(v), file=out)
    for w in [] if args.quiet else report.warnings:  # -q: errors only (the JSON report keeps them)
        print(f"warning: {w}", file=sys.stderr)
    if args.json_file:
        print(f"json: {report.write_json(args.json_file)}", file=out)
    if args.csv:
        print(f"csv: {report.write_csv(args.csv)}", file=out)
    if args.plot:
        from edgekit.bench.plots import write_plots

        print("plots: " + ", ".join(str(p) for p in write_plots(report, args.plot)), file=out)
    if args.json:
        from edgekit.bench.report import jsonable

        sys.stdout.write(strict_dumps(report.to_dict(samples=False), indent=1, default=jsonable) + "\n")
