"""P8: the detect head's decode + NMS p50, alone and beside the int8 inference it follows.

Part 1, always: 2,000 candidate boxes x 10 classes in the YOLOv8 layout ``[1, 14, 2000]`` (and
``[1, 2000, 14]``), float and uint8, two score distributions:

- ``realistic``: what a trained detector emits: 8 objects, each seen by ~15 neighbouring boxes
  with high scores for its class, every other score small (Beta(0.5, 20): mean 0.024);
- ``worst``: every score uniform in [0.3, 1], so all 2,000 boxes pass the 0.25 threshold and go
  to NMS (scattered, mostly non-overlapping boxes: greedy NMS keeps many);
- ``crowded``: all 2,000 pass too, piled on 30 objects (NMS suppresses nearly all of them).

Also YOLOv8n-640's size, 8,400 x 80, realistic scores, to show where the work goes at scale.

Then NMS alone on each scene's candidates, OpenCV's (``cv2.dnn.NMSBoxes``) beside the numpy one a
``[litert]`` install without OpenCV runs (:mod:`edgekit.detect.nms_numpy`, the same boxes kept),
class-aware and agnostic, timed alternately call by call; goal: numpy within 1.5x of OpenCV.

``uint8, dequantise all`` is the same uint8 tensor dequantised whole before decoding (what the
head did before it thresholded in the quantised domain), for comparison.

Part 2, given a model (``BUNDLE``, ``BUNDLE:VARIANT`` or a ``.tflite``/``.onnx`` file with
``--task-options``): that model's inference p50 and the detect head's decode + NMS p50 on the
outputs of the same frames, measured alternately in one run, and their ratio (goal <= 0.25).
Frames are the images of ``--images`` (default: the repository's calib/detect) through the
model's own preprocessing.

    python benchmarks/detect_decode.py [MODEL] [--count 1000] [--images DIR] [--task-options JSON]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
N, NC, SIDE = 2000, 10, 640


class Outputs:
    """The runtime contract the detect head reads: input spec, output shapes and quantisation."""

    def __init__(self, shape, quant):
        from edgekit.imaging.image import InputSpec

        self.input_spec = InputSpec.from_dict({"shape": [1, SIDE, SIDE, 3], "dtype": "float32"})
        self._shape = shape
        self.output_quantization = [quant]

    def output_details(self):
        return [{"shape": list(self._shape)}]


def synthetic(kind: str, seed: int = 0, n: int = N, nc: int = NC) -> np.ndarray:
    """``[1, 4 + nc, n]`` float32: boxes cx, cy, w, h in pixels, then class scores in [0, 1]."""
    rng = np.random.default_rng(seed)
    out = np.zeros((1, 4 + nc, n), np.float32)
    if kind == "crowded":  # every box passes, piled on 30 objects: NMS suppresses most of them
        obj = rng.integers(0, 30, n)
        centres, sizes = rng.random((30, 2)) * SIDE, rng.random((30, 2)) * 100 + 20
        out[0, :2] = (centres[obj] + rng.normal(0, 3, (n, 2))).T
        out[0, 2:4] = (sizes[obj] * rng.normal(1, 0.05, (n, 2))).T
        out[0, 4:] = rng.uniform(0.0, 0.2, (nc, n))
        out[0, 4 + obj % nc, np.arange(n)] = rng.uniform(0.3, 1.0, n)
        return out
    if kind == "worst":
        out[0, :2] = rng.random((2, n)) * SIDE
        out[0, 2:4] = rng.random((2, n)) * 40 + 10
        out[0, 4:] = rng.uniform(0.3, 1.0, (nc, n))
        return out
    out[0, :2] = rng.random((2, n)) * SIDE
    out[0, 2:4] = rng.random((2, n)) * 120 + 10
    out[0, 4:] = rng.beta(0.5, 20, (nc, n))
    for _ in range(8):  # objects: ~15 boxes around each with a high score for its class
        centre, size, cls = rng.random(2) * SIDE, rng.random(2) * 150 + 30, rng.integers(nc)
        idx = rng.choice(n, 15, replace=False)
        out[0, :2, idx] = (centre + rng.normal(0, 4, (15, 2))).astype(np.float32)
        out[0, 2:4, idx] = (size * rng.normal(1, 0.05, (15, 2))).astype(np.float32)
        out[0, 4 + cls, idx] = rng.uniform(0.5, 0.95, 15)
    return out


def quantise(out: np.ndarray) -> tuple[np.ndarray, tuple[float, int]]:
    """Boxes normalised to [0, 1] and the whole tensor as uint8 with scale 1/255: the export that
    keeps int8 scores usable (a pixel-box tensor would give the scores a step of 2.5)."""
    norm = out.copy()
    norm[0, :4] /= SIDE
    scale = 1 / 255
    return np.clip(np.round(norm / scale), 0, 255).astype(np.uint8), (scale, 0)


def p50(samples: list[int]) -> float:
    return float(np.percentile(samples, 50)) / 1e6


def time_decoder(decode, make_outputs, count: int) -> dict[str, float]:
    """p50 ms of the whole call, its decode and nms stages; counts of the last call."""
    total, dec, sup = [], [], []
    for i in range(count + 20):
        t0 = time.perf_counter_ns()
        found = decode(make_outputs())  # timed with the call: "dequantise all" dequantises here
        t = time.perf_counter_ns() - t0
        if i >= 20:  # warm-up dropped
            total.append(t)
            dec.append(t - decode.stage_ns["nms"])  # everything but NMS (+ the map to the frame)
            sup.append(decode.stage_ns["nms"])
    return {"total": p50(total), "decode": p50(dec), "nms": p50(sup), "found": len(found)}


def part1(count: int, sizes=((N, NC, ("realistic", "worst", "crowded")), (8400, 80, ("realistic",)))) -> None:
    print(f"decode + NMS, p50 over {count} calls (score 0.25, IoU 0.45, max_detections 100); "
          f"goal: <= 1 ms for {N} candidates x {NC} classes")
    print(f"{'scores':<11}{'layout':<16}{'outputs':<22}{'pass':>6}{'kept':>6}{'decode':>10}{'nms':>10}{'total':>10}")
    for n, nc, kinds in sizes:
        for kind in kinds:
            _size(count, n, nc, kind)


def _size(count: int, n: int, nc: int, kind: str) -> None:
    from edgekit.detect.head import detector
    from edgekit.detect.scores import real

    labels = [f"c{i}" for i in range(nc)]
    out = synthetic(kind, n=n, nc=nc)
    q, quant = quantise(out)
    passing = int((out[0, 4:].max(axis=0) > 0.25).sum())
    for layout, transpose in ((f"[1, {4 + nc}, {n}]", False), (f"[1, {n}, {4 + nc}]", True)):
        f = out.transpose(0, 2, 1).copy() if transpose else out
        u = q.transpose(0, 2, 1).copy() if transpose else q
        rows = [("float32", detector(labels, Outputs(f.shape, None)), lambda f=f: [f]),
                ("uint8", detector(labels, Outputs(u.shape, quant)), lambda u=u: [u]),
                ("uint8, dequantise all", detector(labels, Outputs(u.shape, None)), lambda u=u: [real(u, quant)])]
        for name, decode, make in rows:
            r = time_decoder(decode, make, count)
            print(f"{kind:<11}{layout:<16}{name:<22}{passing:>6}{r['found']:>6}{r['decode']:>7.3f} ms"
                  f"{r['nms']:>7.3f} ms{r['total']:>7.3f} ms", flush=True)


def nms_backends(count: int) -> None:
    """p50 of ``nms()`` with each backend on the same candidates, calls alternated (same load), in
    thread CPU time: on a shared machine wall time also counts the time the process waits for a
    core, which a longer call catches more often (the numpy path's calls varied 1.6-10 ms here)."""
    from edgekit.detect.head import detector
    from edgekit.detect.nms import nms

    print(f"\nNMS alone, p50 thread CPU time over {count} alternated calls (IoU 0.45, max_detections 100); "
          "goal: numpy <= 1.5x OpenCV")
    print(f"{'scores':<11}{'classes':<13}{'boxes':>6}{'kept':>6}{'opencv':>12}{'numpy':>12}{'ratio':>8}")
    for kind in ("realistic", "worst", "crowded"):
        out = synthetic(kind)
        decode = detector([f"c{i}" for i in range(NC)], Outputs(out.shape, None))
        cand = decode._candidates([out], decode.config, decode.quantization)
        for agnostic in (False, True):
            calls = {b: partial(nms, cand.boxes, cand.scores, cand.classes, 0.45, 100, agnostic, backend=b)
                     for b in ("opencv", "numpy")}
            kept = {b: f() for b, f in calls.items()}
            assert all((k == kept["opencv"]).all() and len(k) == len(kept["opencv"]) for k in kept.values())
            times: dict[str, list[int]] = {b: [] for b in calls}
            for i in range(count + 20):
                for b, f in calls.items():
                    t0 = time.thread_time_ns()
                    f()
                    if i >= 20:
                        times[b].append(time.thread_time_ns() - t0)
            cv, npy = p50(times["opencv"]), p50(times["numpy"])
            print(f"{kind:<11}{'agnostic' if agnostic else 'class-aware':<13}{len(cand.scores):>6}"
                  f"{len(kept['numpy']):>6}{cv:>9.3f} ms{npy:>9.3f} ms{npy / cv:>7.2f}x", flush=True)


def _frames(images: Path, spec) -> list[np.ndarray]:
    import cv2

    from edgekit.imaging.image import Preprocessor

    pre = Preprocessor(spec)
    paths = sorted(p for p in images.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:50]
    frames = [pre(cv2.imread(str(p))) for p in paths]
    return [f for f in frames if f is not None]


def part2(model: str, images: Path, count: int, task_options: dict) -> None:
    from edgekit.heads.table import make_decoder
    from edgekit.model import open_model

    with open_model(model, task="detect", task_options=task_options or None) as m:
        decode = make_decoder("detect", m.labels, m.runtime, **m.task_options)
        tensors = _frames(images, m.runtime.input_spec)
        if not tensors:
            raise SystemExit(f"no images in {images}")
        for t in tensors[:10]:
            decode(m.runtime.infer(t))
        infer, dec, found = [], [], []
        for i in range(count):
            tensor = tensors[i % len(tensors)]
            t0 = time.perf_counter_ns()
            outputs = m.runtime.infer(tensor)
            t1 = time.perf_counter_ns()
            result = decode(outputs)
            infer.append(t1 - t0)
            dec.append(time.perf_counter_ns() - t1)
            found.append(len(result))
        shapes = [[int(v) if str(v).isdigit() else v for v in d["shape"]] for d in m.runtime.output_details()]
        print(f"\n{m.name} ({m.precision or 'bare file'}), layout {decode.layout}, outputs {shapes}, "
              f"{len(tensors)} images x {count // len(tensors)} rounds, "
              f"threads {getattr(m.runtime, 'num_threads', '?')}")
        print(f"inference p50 {p50(infer):.3f} ms   decode + NMS p50 {p50(dec):.3f} ms   "
              f"ratio {p50(dec) / p50(infer):.3f} (goal <= 0.25)   objects per frame (median) {np.median(found):g}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="BUNDLE, BUNDLE:VARIANT or a model file (part 2)")
    ap.add_argument("--count", type=int, default=1000, help="calls per row (default 1000)")
    ap.add_argument("--images", type=Path, default=ROOT / "calib" / "detect")
    ap.add_argument("--task-options", default="{}", help="detect options as JSON, for a bare model file")
    args = ap.parse_args(argv)
    from edgekit.bench.machine import machine_context

    ctx = machine_context(["opencv-python-headless", "numpy", "ai-edge-litert"])
    keys = ("cpu_model", "cores_usable", "governor", "load_average", "libraries")
    print(json.dumps({k: ctx[k] for k in keys}, default=str))
    part1(args.count)
    nms_backends(args.count)
    if args.model:
        part2(args.model, args.images, args.count, json.loads(args.task_options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
