"""Fit the sign demo's open-set margin on held-out images and write it beside the bundle.

    python -m robot.thresholds --bundle dist/demo-cpu --eval eval/fashion
    python -m robot.thresholds --bundle dist/signs-edgetpu --eval data/signs_eval --background-dir data/scenes

Runs the bundle (device side: never TensorFlow) on every image of an ImageFolder evaluation
set: folders named after a label are items, the folder named ``background`` (and every
``--background-dir``) holds plain scenes, even for a model that has no background class.
It picks the smallest margin over the runner-up at which at most ``--max-false-rate`` of the
scenes would still count toward an announcement, prints what that leaves of the items, and
writes ``<bundle>.signs.json`` beside the bundle, where ``robot.signs`` finds it. Beside, not
inside: every file inside a bundle is hashed in its manifest, and the build side owns it.

``edgekit build --eval`` already fits the margin for a model with a background class and
stores it in the manifest (``openset``), which ``robot.signs`` prefers; this tool is for
models without one, for scenes the eval set lacks (``--background-dir``), or after the build.
``robot.signs --thresholds FILE`` picks such a file over the build's fit.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError, UsageError, print_error
from edgekit.heads.openset import fit_margin, margins
from robot.cli import add_bundle, add_json, emit_json, parse, script_parser
from robot.openset import build_thresholds, thresholds_path, write_thresholds


def load_eval(root: Path, labels: Sequence[str], background: str, extra: Sequence[Path]):
    """``(frames, truth)`` from an ImageFolder: truth is a label index, or -1 for a plain scene."""
    from edgekit.imaging.image import IMAGE_SUFFIXES, ImageReadError, read_image

    if not root.is_dir():
        raise UsageError(f"evaluation set {root} is not a directory", "give an ImageFolder: DIR/<label>/*.png")
    folders: list[tuple[Path, int]] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.name.lower() == background.lower():
            folders.append((folder, -1))
        elif folder.name in labels:
            folders.append((folder, list(labels).index(folder.name)))
    folders += [(Path(p), -1) for p in extra]
    frames, truth = [], []
    for folder, index in folders:
        if not folder.is_dir():
            raise UsageError(f"{folder} is not a directory")
        for path in sorted(folder.iterdir()):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                frames.append(read_image(path))
                truth.append(index)
            except ImageReadError:
                continue
    return frames, np.asarray(truth, dtype=np.int64)


def score_frames(runtime: Any, labels: Sequence[str], frames: Sequence[np.ndarray]) -> np.ndarray:
    """``(N, classes)`` scores through edgekit's one frame loop (dequantised, softmax if logits)."""
    from edgekit.camera import Frame
    from edgekit.pipeline import Pipeline

    pipeline = Pipeline(runtime, labels, top_k=len(labels), warmup=0)
    out = np.zeros((len(frames), len(labels)), dtype=np.float64)
    for i, array in enumerate(frames):
        result = pipeline.step(Frame(array, time.perf_counter_ns(), i))
        if result is None:
            raise UsageError(f"evaluation image {i} is not a usable frame")
        for p in result.classification.predictions:
            out[i, p.index] = p.score
    return out


def fit(scores: np.ndarray, truth: np.ndarray, background: int | None, min_confidence: float,
        max_false_rate: float) -> dict[str, Any]:
    """The fitted thresholds and what they do on this set (see :func:`robot.openset.fit_margin`)."""
    top, score, margin = margins(scores)
    items, scenes = truth >= 0, truth < 0
    if background is not None:
        scenes |= truth == background
        items &= truth != background
    ok = (top == truth) & (score >= min_confidence)
    passes = (top != (background if background is not None else -1)) & (score >= min_confidence)
    fitted = fit_margin(margin[items], ok[items], margin[scenes], passes[scenes], max_false_rate)
    return {
        **fitted,
        "min_confidence": min_confidence,
        "max_false_rate": max_false_rate,
        "background": background,
        "items": int(items.sum()),
        "scenes": int(scenes.sum()),
        "background_false_rate_without_margin": float(passes[scenes].mean()) if scenes.any() else 0.0,
        "item_recall_without_margin": float(ok[items].mean()) if items.any() else 0.0,
    }


EXAMPLES = [
    "python -m robot.thresholds dist/demo-cpu --eval eval/fashion",
    "python -m robot.thresholds dist/demo-cpu:int8 --eval eval/fashion --max-false-rate 0.02 --json",
]
"""Real command lines, shown at the end of --help (tests/test_cli_grammar.py parses each)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m robot.thresholds`` argument parser."""
    p = script_parser("thresholds", __doc__, EXAMPLES)
    add_bundle(p, "bundle from edgekit build (a directory, optionally :variant)")
    p.add_argument("--eval", required=True, metavar="DIR", help="ImageFolder: DIR/<label>/*.png, DIR/background/")
    p.add_argument("--background-dir", action="append", default=[], metavar="DIR",
                   help="more plain-scene images (repeatable)")
    p.add_argument("--background", default="background", metavar="LABEL", help="the no-sign folder/label")
    p.add_argument("--min-confidence", type=float, default=0.8, help="the demo's --min-confidence (default 0.8)")
    p.add_argument("--max-false-rate", type=float, default=0.01,
                   help="share of plain scenes allowed to count toward an announcement (default 0.01)")
    p.add_argument("--out", help="default: <bundle>.signs.json beside the bundle")
    add_json(p, "the fitted thresholds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: 0, or the error's exit code (2: bad input) with one line on stderr."""
    args = parse(build_parser(), argv, bundle_required=True)
    log = sys.stderr if args.json is True else sys.stdout  # --json: stdout holds JSON only
    try:
        from edgekit.model import open_model
        from robot.signs import background_index

        if not 0.0 <= args.max_false_rate <= 1.0 or not 0.0 <= args.min_confidence <= 1.0:
            raise UsageError("--max-false-rate and --min-confidence must be within 0..1")
        with open_model(args.bundle) as model:
            labels = list(model.labels)
            frames, truth = load_eval(Path(args.eval), labels, args.background, args.background_dir)
            if not (truth < 0).any() and background_index(labels) is None:
                raise UsageError(f"no plain scenes in {args.eval}", "add DIR/background/ or --background-dir")
            scores = score_frames(model.runtime, labels, frames)
            bg = background_index(labels)
            result = {"bundle": model.name, **fit(scores, truth, bg, args.min_confidence, args.max_false_rate)}
        out = write_thresholds(args.out or thresholds_path(args.bundle), result)
        emit_json(args, {**result, "written": str(out)})
    except EdgekitError as exc:
        return print_error("robot.thresholds", exc)
    if args.quiet:  # -q: errors and the warning below only
        log = io.StringIO()  # a sink for the lines -q leaves out
    print(f"min margin {result['min_margin']:.3f} (score >= {args.min_confidence}): plain scenes counted "
          f"{result['background_false_rate_without_margin']:.1%} -> {result['background_false_rate']:.1%} "
          f"of {result['scenes']}; items kept {result['item_recall_without_margin']:.1%} -> "
          f"{result['item_recall']:.1%} of {result['items']}; wrote {out}", file=log)
    built = build_thresholds(args.bundle)
    if built is not None and not args.out:
        print(f"note: the build fitted margin {built['min_margin']:.3f} into the bundle's manifest; "
              f"robot.signs uses that one unless given --thresholds {out}", file=log)
    if result["item_recall"] < 0.5 * result["item_recall_without_margin"]:
        print("warning: no margin keeps the items and rejects the plain scenes: this model is confidently "
              "wrong on scenes; train it with a background class (python -m robot.train --background N)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
