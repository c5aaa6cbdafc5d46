"""int8 vs fp16 vs fp32 on XNNPACK, edgekit's runtime against a bare LiteRT interpreter.

For the demo model (``models/demo.keras``) and a MobileNetV2-class model (Keras
architecture, random weights: fine for latency), each converted by edgekit's own TFLite
builder to fp32, fp16 (float16 weights) and int8 (full integer, uint8 I/O), this measures
inference p50 with 1 and 2 threads through ``LiteRTRuntime.infer`` and through a bare
``ai_edge_litert`` interpreter (set_tensor + invoke + get_tensor) on the same file,
interleaved in rounds. It prints the edgekit/bare ratio and the speedup over fp32 for
both, so a lost int8 speedup would show.

    python benchmarks/precision.py [--models demo,mobilenetv2] [--rounds 10] [--per-round 20]

A host script: it imports TensorFlow to convert (``--workdir`` keeps the converted files).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo.keras"
VARIANTS = ("fp32", "fp16", "int8")


def keras_model(name: str):
    """The Keras model called ``name`` (demo: the repository's demo model; mobilenetv2: random weights)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    if name == "demo":
        if DEMO.is_file():
            return keras.models.load_model(DEMO)
        sys.path.insert(0, str(ROOT))
        from robot.models import build_model

        return build_model("edge", (32, 32, 1), 10)
    if name == "mobilenetv2":
        keras.utils.set_random_seed(0)
        return keras.applications.MobileNetV2(input_shape=(224, 224, 3), weights=None, classes=1000)
    raise SystemExit(f"unknown model {name!r}: use demo or mobilenetv2")


def work_dir(given: Path | None, prefix: str) -> Path:
    """``given`` (kept), or a temporary directory removed when the script ends: normally, on an
    error, on Ctrl-C or on SIGTERM (turned into SystemExit so the atexit hook runs)."""
    import atexit
    import shutil
    import signal

    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        return given
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    return path


def build_variants(name: str, workdir: Path, variants=VARIANTS, calib: int = 16) -> dict[str, Path]:
    """Convert model ``name`` with edgekit's builder (``edgekit.builders.tflite.convert``), cached in ``workdir``."""
    paths = {v: workdir / f"{name}_{v}.tflite" for v in variants}
    if all(p.is_file() for p in paths.values()):
        return paths
    import tensorflow as tf

    from edgekit.builders.tflite import convert

    model = keras_model(name)
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    saved = workdir / f"{name}_saved"
    model.export(str(saved), input_signature=[tf.TensorSpec((1, *shape), tf.float32)], verbose=False)
    rng = np.random.default_rng(0)
    # Random calibration data is fine for latency; accuracy is not measured here.
    representative = rng.random((calib, *shape), dtype=np.float32)
    for v, p in paths.items():
        t0 = time.perf_counter()
        p.write_bytes(convert(saved, v, representative if v == "int8" else None, "uint8"))
        print(
            f"  converted {p.name} in {time.perf_counter() - t0:.1f} s ({p.stat().st_size / 1024:.0f} KiB)",
            file=sys.stderr,
        )
    return paths


def random_input(detail: dict) -> np.ndarray:
    rng = np.random.default_rng(1)
    dtype = np.dtype(detail["dtype"])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=detail["shape"], endpoint=True).astype(dtype)
    return rng.random(detail["shape"], dtype=np.float32).astype(dtype)


class Bare:
    """A bare interpreter: the three calls every LiteRT program makes."""

    def __init__(self, path: Path, threads: int):
        from ai_edge_litert.interpreter import Interpreter

        self.interp = Interpreter(model_path=str(path), num_threads=threads)
        self.interp.allocate_tensors()
        self.input = self.interp.get_input_details()[0]["index"]
        self.outputs = [d["index"] for d in self.interp.get_output_details()]

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        self.interp.set_tensor(self.input, x)
        self.interp.invoke()
        return [self.interp.get_tensor(i) for i in self.outputs]


def measure(paths: dict[str, Path], threads: int, rounds: int, per_round: int) -> dict[tuple[str, str], float]:
    """p50 (ms) per (variant, 'edgekit'|'bare').

    Variants take turns round by round; within a round, edgekit and the bare interpreter
    alternate call by call (who goes first flips every call), so drift and a busy
    neighbour hit both alike.
    """
    from edgekit.runtime.litert import LiteRTRuntime

    pairs = {}
    for v, p in paths.items():
        rt = LiteRTRuntime(p, num_threads=threads, delegate="xnnpack")
        bare = Bare(p, threads)
        x = random_input(bare.interp.get_input_details()[0])
        for _ in range(5):  # warm-up: first invokes allocate and pack weights
            rt.infer(x)
            bare.infer(x)
        pairs[v] = ((rt.infer, "edgekit"), (bare.infer, "bare"), x)
    samples: dict[tuple[str, str], list[int]] = {(v, k): [] for v in paths for k in ("edgekit", "bare")}
    clock = time.perf_counter_ns
    for r in range(rounds):
        order = list(pairs) if r % 2 == 0 else list(pairs)[::-1]
        for v in order:
            first, second, x = pairs[v]
            for i in range(per_round):
                for fn, kind in (first, second) if i % 2 == 0 else (second, first):
                    t0 = clock()
                    fn(x)
                    samples[(v, kind)].append(clock() - t0)
    return {k: float(np.percentile(v, 50)) / 1e6 for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,mobilenetv2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=20)
    ap.add_argument("--workdir", type=Path, help="keep converted models here (default: a temporary directory)")
    args = ap.parse_args(argv)
    workdir = work_dir(args.workdir, "edgekit-precision-")

    from edgekit.bench.machine import machine_context

    ctx = machine_context()
    print(
        f"machine: {ctx['cpu_model']}, {ctx['cores_usable']} cores, load {ctx['load_average']}, "
        f"ai-edge-litert {ctx['libraries'].get('ai-edge-litert')}"
    )
    print(
        f"{'model':<12}{'thr':>4}{'variant':>8}{'edgekit p50':>13}{'bare p50':>10}{'edgekit/bare':>14}"
        f"{'speedup vs fp32: edgekit':>26}{'bare':>7}"
    )
    for name in args.models.split(","):
        paths = build_variants(name, workdir)
        for threads in (int(t) for t in args.threads.split(",")):
            p50 = measure(paths, threads, args.rounds, args.per_round)
            for v in paths:
                e, b = p50[(v, "edgekit")], p50[(v, "bare")]
                se, sb = p50[("fp32", "edgekit")] / e, p50[("fp32", "bare")] / b
                print(
                    f"{name:<12}{threads:>4}{v:>8}{e:>10.3f} ms{b:>7.3f} ms{e / b:>13.3f}x{se:>25.2f}x{sb:>6.2f}x",
                    flush=True,
                )
    print("p50 of interleaved single inferences; speedup = fp32 p50 / variant p50 (same implementation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
