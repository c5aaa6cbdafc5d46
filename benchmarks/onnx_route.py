"""The same network built from Keras and from its ONNX export: is the ONNX route as good?

The demo classifier (``models/demo.keras``) is exported to ONNX as a PyTorch user would hand
it over (NCHW, symbolic batch; ``scripts/bundled_models.py``), then both are built by edgekit
for the ``cpu`` target as full-integer int8 with the same calibration images. Reported side by
side, from one run:

- int8 inference latency on XNNPACK (``LiteRTRuntime.infer``, interleaved rounds, p50 and
  p90) and the ratio ONNX-route / Keras-route;
- top-1 on the eval set of the original model and of both int8 models (edgekit's gate);
- the op counts of both int8 graphs (TRANSPOSE called out: onnx2tf's NCHW -> NHWC must
  not leave run-time transposes the Keras route does not have);
- the Edge TPU offline lint (``edgekit.tflite.edgetpu_rules``): ops predicted on the TPU.

    python benchmarks/onnx_route.py [--rounds 15] [--per-round 200] [--threads 1]

A host script (TensorFlow, tf2onnx, onnx2tf); ``--workdir`` keeps the models and bundles.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _eval_dir(work: Path, labels: list[str]) -> Path:
    """The eval set's class folders that the model has labels for (a folder being added by a
    retraining in progress must not stop the comparison)."""
    src = ROOT / "eval" / "fashion"
    dest = work / "eval"
    dest.mkdir(exist_ok=True)
    for d in src.iterdir():
        if d.is_dir() and d.name in labels and not (dest / d.name).exists():
            (dest / d.name).symlink_to(d.resolve())
    return dest


def rgb_model(work: Path) -> Path:
    """A MobileNetV2 (alpha 0.35, 96x96 RGB, random weights: fine for ops and latency) as .keras:
    a 3-channel NCHW export is where layout transposes would show."""
    import keras

    net = keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10)
    path = work / "mobilenetv2.keras"
    net.save(path)
    return path


def build_both(work: Path, rgb: bool) -> dict[str, Path]:
    """Build the model and its NCHW ONNX export for cpu int8; returns {route: bundle dir}.

    The demo is gated on the eval set; the random-weight RGB model has no meaningful top-1.
    """
    from edgekit.builders.build import build
    from edgekit.bundle import read_labels
    from scripts.bundled_models import DEMO, export_onnx

    keras_model = rgb_model(work) if rgb else DEMO
    onnx_model = export_onnx(keras_model, out=work / f"{keras_model.stem}.onnx")
    labels = read_labels(DEMO.with_suffix(".labels.txt"))
    calib = [ROOT / "calib" / "fashion", ROOT / "calib" / "frames"]
    bundles = {}
    for route, model in (("keras", keras_model), ("onnx", onnx_model)):
        extra = {"preprocess": {"crop": "square"}} if rgb else {"eval_dir": _eval_dir(work, labels)}
        [r] = build(model, "cpu", calib, out=work / route, variants="int8", quiet=True, **extra)
        bundles[route] = r.bundle
    return bundles


def latency(paths: dict[str, Path], tensor: np.ndarray, rounds: int, per_round: int, threads: int) -> dict:
    """p50/p90 (ms) of ``infer`` per route, routes interleaved round by round."""
    from edgekit.runtime.litert import LiteRTRuntime

    runtimes = {k: LiteRTRuntime(p, delegate="xnnpack", num_threads=threads) for k, p in paths.items()}
    samples: dict[str, list[float]] = {k: [] for k in paths}
    try:
        for rt in runtimes.values():
            for _ in range(20):  # warm-up, not recorded
                rt.infer(tensor)
        for _ in range(rounds):
            for k, rt in runtimes.items():
                for _ in range(per_round):
                    t = time.perf_counter_ns()
                    rt.infer(tensor)
                    samples[k].append((time.perf_counter_ns() - t) / 1e6)
    finally:
        for rt in runtimes.values():
            rt.close()
    return {k: {"p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)), "n": len(v)}
            for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    """Build both routes, measure, print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="keep the models and bundles here")
    parser.add_argument("--rgb", action="store_true",
                        help="a 3-channel MobileNetV2 (random weights) instead of the demo")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        bundles = build_both(work, args.rgb)
        report(bundles, args)
    return 0


def report(bundles: dict[str, Path], args: argparse.Namespace) -> None:
    """Print accuracy, op counts, Edge TPU lint and latency for both routes."""
    from edgekit.bundle import load_bundle
    from edgekit.imaging.image import Preprocessor, read_image
    from edgekit.tflite.edgetpu_rules import check_model
    from edgekit.tflite.graph import read_graph

    paths = {k: b / load_bundle(b).model("int8").file for k, b in bundles.items()}
    print("route  orig top-1  int8 top-1  ratio   ops  TRANSPOSE  op counts                                   TPU lint")
    for route, path in paths.items():
        ver = load_bundle(bundles[route]).manifest["verification"]
        v = {k: float("nan") if ver.get(k) is None else ver[k] for k in ("original", "converted", "ratio")}
        ops = Counter(op.opcode for op in read_graph(path).operators)
        lint = check_model(path)
        counts = ", ".join(f"{k} {n}" for k, n in sorted(ops.items()))
        print(f"{route:<6} {v['original']:<11.4f} {v['converted']:<11.4f} {v['ratio']:<7.4f} {sum(ops.values()):<4} "
              f"{ops.get('TRANSPOSE', 0):<10} {counts:<43} {lint.tpu_ops}/{lint.total_ops} on the TPU")
    spec = load_bundle(bundles["keras"]).model("int8").input
    tensor = Preprocessor(spec)(read_image(sorted((ROOT / "calib" / "fashion").glob("*.png"))[0]))
    lat = latency(paths, tensor, args.rounds, args.per_round, args.threads)
    for route, s in lat.items():
        print(f"int8 XNNPACK {args.threads} thread(s), {route}: p50 {s['p50']:.4f} ms  p90 {s['p90']:.4f} ms  "
              f"(n {s['n']})")
    print(f"latency ratio onnx/keras: p50 {lat['onnx']['p50'] / lat['keras']['p50']:.3f}  "
          f"p90 {lat['onnx']['p90'] / lat['keras']['p90']:.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
