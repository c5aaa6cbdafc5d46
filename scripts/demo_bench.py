"""``make demo``'s benchmark step: the accuracy of every bundle built, then make the demo clip and
benchmark every bundle that runs here.

The accuracy table reads each bundle's edgekit.json ``verification`` (what the build measured
on the eval set, never re-run here): the classifier's top-1 and the detector's mAP@[.5:.95]
(mAP@.5 beside it), original and converted per model, target by target.

The clip (640x360 MJPG, 15 fps) is built from the committed camera-like frames (real photos
from scikit-image) with evaluation items held up in the seed's 200x200 centre window, so the
model sees what the robot demo would show it. Bundles whose runtime is missing on this
machine (the Edge TPU without libedgetpu, say) are listed with the reason and skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import cv2
import numpy as np

from edgekit.bundle import load_bundle
from edgekit.imaging.image import read_image
from edgekit.target import load_target

ROOT = Path(__file__).resolve().parents[1]


def make_clip(dest: Path, seconds: float = 6.0, fps: int = 15) -> Path:
    """Write the demo clip (idempotent: kept when it exists)."""
    if dest.is_file():
        return dest
    backgrounds = [read_image(p) for p in sorted((ROOT / "calib" / "frames").glob("*.jpg"))[::2]]
    items = sorted((ROOT / "eval" / "fashion").glob("*/*.png"))[::25]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.stem + ".part.avi")
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"MJPG"), fps, (640, 360))
    if not writer.isOpened():
        raise RuntimeError("OpenCV cannot write MJPG video here")
    n = int(seconds * fps)
    for i in range(n):
        frame = backgrounds[(i // fps) % len(backgrounds)].copy()
        item = read_image(items[(i // 8) % len(items)])
        item = item if item.ndim == 2 else cv2.cvtColor(item, cv2.COLOR_BGR2GRAY)
        shift = int(6 * np.sin(i / 3))  # a hand is never perfectly still
        top, left = 80 + shift, 220 - shift
        frame[top : top + 200, left : left + 200] = cv2.cvtColor(cv2.resize(item, (200, 200)), cv2.COLOR_GRAY2BGR)
        writer.write(frame)
    writer.release()
    tmp.replace(dest)
    return dest


def runnable_bundles(dist: Path) -> list[Path]:
    """Bundles in ``dist`` whose runtime this machine has; prints why others are skipped."""
    keep = []
    for path in sorted(p for p in dist.iterdir() if (p / "edgekit.json").is_file()):
        bundle = load_bundle(path)
        ok, why = load_target(bundle.target).can_run()
        if bundle.target == "jetson" and importlib.util.find_spec("onnxruntime"):
            ok = True  # no TensorRT here: its ONNX files run on ONNX Runtime's CPU provider instead
        if ok:
            keep.append(path)
        else:
            print(f"skip {path.name}: {why}", file=sys.stderr)
    return keep


METRICS = {"top1": "top-1", "map": "mAP@[.5:.95]", "cosine_worst_output": "cosine"}


def accuracy_rows(dist: Path) -> list[list[str]]:
    """One row per model of every bundle in ``dist``: bundle, target, task, metric, original,
    converted, ratio, gate (and mAP@.5 for a detector), from the bundles' verification."""
    rows = []
    for path in sorted(p for p in dist.iterdir() if (p / "edgekit.json").is_file()):
        bundle = load_bundle(path, check_hashes=False, allow_rejected=True)
        ver = bundle.manifest.get("verification") or {}
        metric = METRICS.get(ver.get("metric"), str(ver.get("metric")))
        for name, per in sorted((ver.get("models") or {}).items()):
            res = per.get("eval") or per.get("holdout") or {}
            at50 = res.get("map50") or {}
            rows.append([path.name, bundle.target, bundle.manifest.get("task", "classify"), name, metric,
                         _num(res.get("original")), _num(res.get("converted", res.get("agreement"))),
                         _num(res.get("ratio")), _num(at50.get("original")), _num(at50.get("converted")),
                         "PASS" if res.get("passed", ver.get("passed")) else "FAIL"])
    return rows


def _num(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def print_accuracy(dist: Path) -> None:
    """Print :func:`accuracy_rows` as a table."""
    head = ["bundle", "target", "task", "model", "metric", "original", "converted", "ratio", "orig@.5", "conv@.5",
            "gate"]
    rows = accuracy_rows(dist)
    if not rows:
        return
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print()


def main(argv: list[str] | None = None) -> int:
    """Print the accuracy table, make the clip, ``edgekit bench`` every runnable bundle; the bench's exit code."""
    from edgekit.cli import main as cli

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", default="dist")
    ap.add_argument("--min-duration", default="3")
    ap.add_argument("--min-count", default="300")
    ap.add_argument("--repeats", default="3")
    args = ap.parse_args(argv)
    dist = Path(args.dist)
    print_accuracy(dist)
    clip = make_clip(dist / "demo_clip.avi")
    bundles = runnable_bundles(dist)
    if not bundles:
        print("no bundle in", dist, "runs on this machine", file=sys.stderr)
        return 1
    return cli(["bench", *map(str, bundles), "--variants", "all", "--backend", "onnxruntime",
                "--camera", f"file:{clip}", "--min-duration", args.min_duration, "--min-count", args.min_count,
                "--repeats", args.repeats, "--json-file", str(dist / "bench.json"), "--csv", str(dist / "bench.csv"),
                "--plot", str(dist / "bench.png")])


if __name__ == "__main__":
    sys.exit(main())
