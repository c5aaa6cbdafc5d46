"""The ``edgekit build`` verb (argument parsing and the summary table; the work is in builders/build.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgekit.modelinfo.preprocessing import INTERPOLATION_HELP, INTERPOLATIONS, pad_value, preprocess_flags
from edgekit.options import key_value, target_completer


def configure(p: argparse.ArgumentParser) -> None:
    """Add build's arguments to ``p``."""
    p.add_argument("--model", required=True, help=".keras, .h5, SavedModel dir, or .onnx (jetson)")
    p.add_argument("--target", required=True, action="append",
                   help="edgetpu, rpi, cpu, jetson (comma-separated or repeated)").completer = target_completer
    p.add_argument("--calib", action="append", required=True, metavar="DIR_OR_VIDEO",
                   help="calibration images; repeat to mix in real camera frames (folder or video)")
    p.add_argument("--eval", dest="eval_dir", metavar="DIR",
                   help="labelled ImageFolder (a detector: COCO annotations.json or YOLO images/ + labels/): "
                        "enables the accuracy gate")
    p.add_argument("--out", default="dist", help="output directory (default: dist)")
    p.add_argument("--name", help="bundle name prefix (default: the model's file name)")
    p.add_argument("--labels", help="labels.txt (default: <model>.labels.txt or the --eval classes)")
    p.add_argument("--min-accuracy-ratio", type=float, default=0.99,
                   help="fail when converted/original top-1 is below this (default 0.99, the MLPerf bar)")
    p.add_argument("--calib-count", type=int, default=500, help="calibration images to draw (default 500)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--calib-steps", type=int, default=150,
                   help="images the int8 converter calibrates on, at most (default 150; ~0.1 s each at 224x224)")
    p.add_argument("--variants", help="override the target's variants, e.g. fp32,int8")
    p.add_argument("--io-dtype", choices=["uint8", "int8"], help="int8 model input/output type (default uint8)")
    p.add_argument("--colour", choices=["gray", "rgb", "bgr"], help="override the model's input colour")
    p.add_argument("--crop", help="'square', 'none' or HxW centre crop in pixels, e.g. 200x200")
    p.add_argument("--mean", help="per-channel mean in pixel units, e.g. 127.5 or 123.7,116.3,103.5")
    p.add_argument("--std", help="per-channel std in pixel units, e.g. 127.5")
    p.add_argument("--resize", choices=["stretch", "letterbox", "crop"],
                   help="stretch, letterbox (aspect kept, borders padded) or crop (centre crop to the input's aspect)")
    p.add_argument("--interpolation", choices=list(INTERPOLATIONS),
                   help=INTERPOLATION_HELP + "; recorded in the bundle")
    p.add_argument("--pad-value", type=pad_value, metavar="0-255",
                   help="letterbox border grey (Ultralytics: 114)")
    p.add_argument("--compiler", help="edgetpu_compiler executable (default: search PATH)")
    p.add_argument("--min-runtime-version", type=int, help="edgetpu_compiler -m (minimum Edge TPU runtime)")
    p.add_argument("--min-tpu-ops", type=float, help="warn when the share of ops on the Edge TPU is below this")
    p.add_argument("--strict-tpu-ops", action="store_true", help="fail instead of warn for --min-tpu-ops")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (also when the gate fails)")
    p.add_argument("--task", choices=["classify", "detect", "raw", "landmarks", "segment"],
                   help="task head (default: detect for a detection --eval set, else classify for one 1-D output, "
                        "raw otherwise; landmarks: -T landmarks={...}, gated in pixels; segment: by mask IoU)")
    p.add_argument("--min-map-ratio", type=float, default=0.99,
                   help="detect: fail when converted/original mAP@[.5:.95] on --eval is below this (default 0.99)")
    _fidelity_flags(p)
    _memory_flags(p)
    p.add_argument("-T", "--task-option", dest="task_option", action="append", type=key_value, metavar="KEY=VALUE",
                   help="detect, landmarks or segment head option written into the bundle and used by the gate, e.g. "
                        "-T layout=yolo -T score_threshold=0.4, -T 'landmarks={\"num_landmarks\": 468}' "
                        "(values are JSON); repeatable")
    p.add_argument("--background-class", metavar="LABEL",
                   help="classify: the label meaning 'nothing there' (default: background); with --eval the "
                        "open-set thresholds are fitted on it and stored in the manifest")
    p.add_argument("--input-size", metavar="HxW", help="image size for an ONNX input with symbolic height/width")
    p.add_argument("--min-cosine", type=float, default=0.98,
                   help="raw task: fail when the worst output's cosine similarity is below this (default 0.98)")
    p.add_argument("--allow-partial", action="store_true",
                   help="exit 0 when a target's bundle was written without a variant that missed the gate "
                        "(kept in <bundle>.rejected); without it such a build exits 3")
    p.add_argument("--no-recover", dest="recover", action="store_false",
                   help="build int8 once: no retries (worst layers in float on cpu/rpi, all calibration images) "
                        "when it misses the gate")


def _memory_flags(p: argparse.ArgumentParser) -> None:
    """The memory pre-check's override and --max-memory, the user's cap (a CI runner, a shared board)."""
    p.add_argument("--no-memory-check", action="store_true",
                   help="build even when the estimated memory or temporary disk exceeds what is available")
    p.add_argument("--max-memory", metavar="SIZE", type=_memory_size,
                   help="cap the build's memory (4G, 512M): refused up front when the estimate is over it, "
                        "int8 recovery attempts skipped once the build has peaked over it")


def _fidelity_flags(p: argparse.ArgumentParser) -> None:
    """The gate's figures beyond the ratio: a detector's (builders/gate/fidelity.py), a classifier's
    top-1 agreement (builders/gate/verify.py: classify_gate), a landmark model's pixels, a segmenter's mask IoU."""
    p.add_argument("--max-map-gain", type=float, default=0.05,
                   help="detect: fail when converted/original mAP on --eval is above 1 + this: a conversion does not "
                        "improve a model, its scores or boxes moved (default 0.05)")
    p.add_argument("--min-detect-agreement", type=float, default=0.9,
                   help="detect: fail when the detections at the bundle's score threshold on --eval agree less than "
                        "this with the original's (2 x matched / both counts; default 0.9, 0 turns it off)")
    p.add_argument("--min-score-levels", type=int, default=20,
                   help="detect: fail when the detections on --eval have fewer distinct scores than this (or than "
                        "the original's, when it has fewer; default 20, 0 turns it off)")
    p.add_argument("--min-score-cosine", type=float, default=0.95,
                   help="detect: fail when the score output's cosine similarity with the original's on --eval is "
                        "below this (default 0.95, 0 turns it off)")
    p.add_argument("--max-landmark-error", type=float, metavar="PX",
                   help="landmarks: fail when the mean over images of each image's mean point distance to the "
                        "original's, in pixels of the model input, is above this (default 1 %% of its longer side)")
    p.add_argument("--max-landmark-p95", type=float, metavar="PX",
                   help="landmarks: the same for the 95th percentile over images (default 2.5 %% of the longer side)")
    p.add_argument("--min-presence-agreement", type=float, default=0.97,
                   help="landmarks with a presence output: fail when fewer images than this share are on the "
                        "original's side of the presence threshold (default 0.97, 0 turns it off)")
    p.add_argument("--min-top1-agreement", type=float, default=0.97,
                   help="classify: when the original's top-1 on --eval is 0.9 or more, fail a model whose top-1 is "
                        "the original's on fewer of the images than this (default 0.97, 0 turns it off)")
    p.add_argument("--min-mask-iou", type=float, default=0.9,
                   help="segment: fail when the mean over images of the mask IoU with the original's (at the head's "
                        "threshold; both empty: 1) is below this (default 0.9)")
    p.add_argument("--min-mask-iou-p5", type=float, default=0.7,
                   help="segment: the same for the 5th percentile over images (default 0.7)")


def main(args: argparse.Namespace) -> int:
    """Run the build and print the summary table."""
    from edgekit.builders.build import build
    from edgekit.errors import EdgekitError
    from edgekit.options import option_value

    # Flags left unset arrive as None (or False): the request leaves them out, so the target
    # file's values apply (edgekit.target.merge_options).
    try:
        results = build(args.model, ",".join(args.target), args.calib, out=args.out, eval_dir=args.eval_dir,
                        name=args.name, labels=args.labels, preprocess=preprocess_flags(args),
                        min_accuracy_ratio=args.min_accuracy_ratio, calib_count=args.calib_count,
                        seed=args.seed, quiet=args.quiet, variants=args.variants, io_dtype=args.io_dtype,
                        compiler=args.compiler, min_runtime_version=args.min_runtime_version,
                        min_tpu_ops=args.min_tpu_ops, strict_tpu_ops=args.strict_tpu_ops,
                        task=args.task, input_size=args.input_size, min_cosine=args.min_cosine,
                        calib_steps=args.calib_steps, memory_check=not args.no_memory_check, max_memory=args.max_memory,
                        min_map_ratio=args.min_map_ratio, background_class=args.background_class,
                        task_options={k: option_value(_shallow(k, v)) for k, v in args.task_option or []},
                        allow_partial=args.allow_partial, recover=args.recover,
                        min_detect_agreement=args.min_detect_agreement, min_score_levels=args.min_score_levels,
                        min_score_cosine=args.min_score_cosine, max_map_gain=args.max_map_gain,
                        min_top1_agreement=args.min_top1_agreement, max_landmark_error=args.max_landmark_error,
                        max_landmark_p95=args.max_landmark_p95,
                        min_presence_agreement=args.min_presence_agreement, min_mask_iou=args.min_mask_iou,
                        min_mask_iou_p5=args.min_mask_iou_p5)
    except EdgekitError as exc:
        # The report matters most when the gate failed or a target did not build: the same
        # table (or JSON) on stdout as on success, then the one-line error on stderr.
        results = getattr(exc, "results", None)
        if results:
            print(format_json(results) if args.json else format_table(results))
        raise
    print(format_json(results) if args.json else format_table(results))
    return 0


def _shallow(key: str, value: str) -> str:
    """A ``-T`` value nested past edgekit.util.userjson.MAX_DEPTH is refused before json.loads recurses
    into a RecursionError (options.option_value parses it)."""
    from edgekit.errors import UsageError
    from edgekit.util.userjson import MAX_DEPTH, nesting_depth

    if nesting_depth(value)[0] > MAX_DEPTH:
        raise UsageError(f"-T {key}: its value is nested deeper than {MAX_DEPTH} levels",
                         "give a number, a string or a short JSON list, e.g. -T outputs=[0,1]")
    return value


def format_json(results) -> str:
    """The results as a JSON list: target, bundle (null when rejected), gate, the variants that
    missed it, time, verification."""
    return json.dumps([{"target": r.target, "bundle": str(r.bundle) if r.bundle else None, "passed": r.passed,
                        "rejected_variants": list(r.rejected), "error": r.error, "seconds": r.seconds,
                        "verification": r.manifest.get("verification")} for r in results], indent=2)


def _size(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def format_table(results) -> str:
    """One row per model in every bundle (and per variant a partial bundle left out): files,
    sizes, accuracy (raw: the worst output's cosine and mean absolute error; landmarks: the pixel error
    and presence agreement against the original's; segment: the mask IoU), ratio, gate, delegation, time."""
    task = results[0].manifest.get("task") if results else None
    if task == "raw":  # MAE: the worst output's mean absolute error in its own units (reported, not gated)
        header = ("target", "model file", "size", "worst output", "cosine", "MAE", "gate", "delegated", "build s")
    elif task == "segment":  # builders/gate/segment.py: vs the original's masks
        header = ("target", "model file", "size", "mask IoU", "mask cosine", "gate", "delegated", "build s")
    elif task == "landmarks":  # builders/gate/landmarks.py: vs the original's points, in model-input pixels
        header = ("target", "model file", "size", "landmark error", "presence", "cosine", "gate", "delegated",
                  "build s")
    else:
        metric = "mAP" if task == "detect" else "top-1"  # a detector's: mAP@[.5:.95]; agree: vs the original
        header = ("target", "model file", "size", f"orig {metric}", f"conv {metric}", "ratio", "agree", "gate",
                  "delegated", "build s")
    rows = [header]
    for r in results:
        m = r.manifest
        ver = m.get("verification", {})
        for model in m.get("models", []):
            rows.append(_row(r, model, ver.get("models", {}).get(model["name"], {}),
                             (m.get("delegation") or {}).get(model["name"]), task))
        for name, lost in (ver.get("rejected") or {}).items():  # a partial bundle's missing variants
            model = {"name": name, "file": f"{lost.get('kept_in')}/{lost.get('file')}", "bytes": lost.get("bytes", 0)}
            rows.append(_row(r, model, lost.get("verification") or {}, lost.get("delegation"), task))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        if r.partial:
            lines.append(f"{r.target}: {r.bundle} without {', '.join(r.rejected)} ({r.error})")
        elif r.bundle:
            lines.append(f"{r.target}: {r.bundle}")
        else:
            lines.append(f"{r.target}: REJECTED ({r.error})")
    return "\n".join(lines)


def _row(r, model: dict, v: dict, cov: dict | None, task: str | None) -> tuple:
    """One model's row of :func:`format_table`."""
    m = r.manifest
    ev = v.get("eval") or v.get("holdout") or {}
    # a detector's: its detections at the bundle's threshold vs the original's (the gated figure), else the
    # held-back agreement; a classifier's: top-1 agreement
    detections = (ev.get("fidelity") or {}).get("detections") or {}
    agree = detections.get("agreement", ev.get("agreement", (v.get("holdout") or {}).get("agreement")))
    if cov:
        deleg = f"{cov['delegated_nodes']}/{cov['total_nodes']} XNNPACK"
    elif m.get("edgetpu"):
        et = m["edgetpu"]
        off, real = et.get("offline", {}), et.get("compiler") or {}
        deleg = (f"TPU {real.get('tpu_ops', '?')}/{real.get('total_ops', '?')} compiled" if real else
                 f"TPU {off.get('tpu_ops', '?')}/{off.get('total_ops', '?')} predicted, {et.get('status')}")
    elif model.get("format") == "onnx" or model["file"].endswith(".onnx"):
        deleg = "TensorRT on device"
    else:
        deleg = "-"
    gate = "PASS" if ev.get("passed") else ("FAIL" if "passed" in ev else "n/a")
    cosine = f"{ev['cosine']:.6f}" if ev.get("cosine") is not None else "-"
    if task == "raw":
        mae = ((ev.get("outputs") or {}).get(ev.get("worst_output")) or {}).get("mean_abs_diff")
        figures = (ev.get("worst_output") or "-", cosine, f"{mae:.4g}" if mae is not None else "-")
    elif task == "segment":
        from edgekit.builders.gate.segment import table_figure as mask_figure

        mask = (ev.get("outputs") or {}).get(ev.get("mask_output")) or {}  # the mask's, not another output's
        figures = (mask_figure(ev), f"{mask['cosine']:.6f}" if mask.get("cosine") is not None else cosine)
    elif task == "landmarks":
        from edgekit.builders.gate.landmarks import table_figure

        agreement = ev.get("presence_agreement")
        figures = (table_figure(ev), f"{agreement:.4f}" if agreement is not None else "-", cosine)
    else:
        figures = (f"{ev['original']:.4f}" if ev.get("original") is not None else "-",
                   f"{ev['converted']:.4f}" if ev.get("converted") is not None else "-",
                   f"{ev['ratio']:.4f}" if ev.get("ratio") is not None else "-",
                   f"{agree:.4f}" if agree is not None else "-")
    return (r.target, model["file"], _size(model.get("bytes") or 0), *figures, gate, deleg, f"{r.seconds:.1f}")


__all__ = ["configure", "main", "format_table", "Path"]


def _memory_size(text: str) -> int:
    """``--max-memory``'s value in bytes; argparse says what is wrong with it (exit 2, usage)."""
    from edgekit.builders.host.resources import parse_size
    from edgekit.errors import UsageError

    try:
        return parse_size(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message} ({exc.hint})") from exc
