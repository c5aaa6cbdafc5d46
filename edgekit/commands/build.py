"""The ``edgekit build`` verb (argument parsing and the summary table; the work is in builders/build.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgekit.modelinfo.preprocessing import INTERPOLATION_HELP, INTERPOLATIONS, pad_value, preprocess_flags
from edgekit.options import key_value, target_completer


def configure(p: argparse.ArgumentParser) -> None:
    """Add build's arguments to ``p``: the settings' own flags from builders/request.py (one row
    each), then the few this verb reads itself (lists, the preprocessing flags, ``-T``, sizes)."""
    from edgekit.builders.request import BY_NAME, add_flags

    def helps(name: str) -> str:
        return BY_NAME[name].option.help

    p.add_argument("--model", required=True, help=helps("model"))
    p.add_argument("--target", required=True, action="append", help=helps("targets")).completer = target_completer
    p.add_argument("--calib", action="append", required=True, metavar="DIR_OR_VIDEO", help=helps("calib"))
    add_flags(p)
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
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (also when the gate fails)")
    p.add_argument("-T", "--task-option", dest="task_option", action="append", type=key_value, metavar="KEY=VALUE",
                   help="detect, landmarks or segment head option written into the bundle and used by the gate, e.g. "
                        "-T layout=yolo -T score_threshold=0.4, -T 'landmarks={\"num_landmarks\": 468}' "
                        "(values are JSON); repeatable")
    p.add_argument("--max-memory", metavar="SIZE", type=_memory_size, help=helps("max_memory"))


def main(args: argparse.Namespace) -> int:
    """Run the build and print the summary table."""
    from edgekit.builders.build import build

    # Flags left unset are left out of the request, so its defaults and the target file's values
    # apply (edgekit.target.merge_options).
    from edgekit.builders.request import given
    from edgekit.errors import EdgekitError
    from edgekit.options import option_value

    try:
        results = build(args.model, ",".join(args.target), args.calib, quiet=args.quiet, **given(args),
                        preprocess=preprocess_flags(args), max_memory=args.max_memory,
                        task_options={k: option_value(_shallow(k, v)) for k, v in args.task_option or []})
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
    elif (model.get("rknn") or {}).get("npu"):  # the toolkit's layer table (builders/rknn.py)
        npu = model["rknn"]["npu"]
        deleg = f"NPU {npu.get('npu_ops', '?')}/{npu.get('ops', '?')}"
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
