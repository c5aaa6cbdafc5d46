"""Peak RSS and cold start to the first result: ``edgekit run`` vs a loop that uses TensorFlow.

Each contender is a fresh process that loads the demo model, takes one 640x360 frame,
preprocesses it and prints one result; the clock runs from process start to the first
result line on its stdout, and peak RSS comes from ``wait4`` (the kernel's ``ru_maxrss``).
Linux folds the pre-exec memory of a forked child into its ``ru_maxrss``, so the models are
converted in a separate process: the measuring parent never imports TensorFlow, or every
child would report at least the parent's size.

* ``edgekit run BUNDLE --camera synthetic --max-frames 1`` on a bundle with the demo
  model's fp32 and int8 TFLite files (made here with BundleWriter);
* ``tensorflow + keras``: the seed example's way, ``keras.models.load_model`` + ``predict``;
* ``tensorflow tf.lite``: TensorFlow's own (deprecated) ``tf.lite.Interpreter`` on the same
  fp32 file, to show the cost is importing TensorFlow, not the model.

Runs alternate and repeat (``--repeats``); medians are printed. The first run of each
reads cold files; later ones hit the page cache, as on a device that restarts its service.
Goals: RSS ratio <= 0.2, edgekit cold start <= 1.0 s.

    python benchmarks/footprint.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from goals import Goals
from precision import DEMO, build_variants, work_dir

TF_KERAS = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
from PIL import Image
import keras
model = keras.models.load_model(sys.argv[1])
frame = Image.fromarray(np.random.default_rng(0).integers(0, 256, (360, 640, 3), dtype=np.uint8))
gray = frame.convert("L").crop((220, 80, 420, 280)).resize((32, 32))
x = (np.array(gray) / 255).reshape(1, 32, 32, 1)
scores = model.predict(x, verbose=0)[0]
print("frame 0", int(scores.argmax()), float(scores.max()), flush=True)
"""

TF_LITE = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
interp = tf.lite.Interpreter(model_path=sys.argv[1])
interp.allocate_tensors()
x = np.random.default_rng(0).random((1, 32, 32, 1), dtype=np.float32)
interp.set_tensor(interp.get_input_details()[0]["index"], x)
interp.invoke()
scores = interp.get_tensor(interp.get_output_details()[0]["index"])[0]
print("frame 0", int(scores.argmax()), float(scores.max()), flush=True)
"""


def make_bundle(paths: dict[str, Path], dest: Path) -> Path:
    """A cpu-style bundle of the demo model's fp32 and int8 files (the demo's preprocessing)."""
    from edgekit.bundle import BundleWriter
    from edgekit.imaging.image import InputSpec
    from edgekit.runtime.litert import LiteRTRuntime, spec_from_details

    base = InputSpec(shape=(1, 32, 32, 1), colour="gray", crop=(200, 200))
    with BundleWriter(dest) as w:
        models = []
        for v in ("fp32", "int8"):
            shutil.copy(paths[v], w.dir / paths[v].name)
            with LiteRTRuntime(paths[v]) as rt:
                spec = spec_from_details(rt.input_details()[0], base)
            models.append(
                {
                    "name": v,
                    "file": paths[v].name,
                    "format": "tflite",
                    "precision": v,
                    "input": spec.to_dict(),
                    "outputs": [],
                }
            )
        labels = DEMO.with_name("demo.labels.txt")
        if labels.is_file():
            shutil.copy(labels, w.dir / "labels.txt")
        return w.commit(
            {
                "target": "cpu",
                "default_model": "fp32",
                "labels": "labels.txt" if labels.is_file() else None,
                "runtime": {
                    "adapter": "edgekit.runtime.litert:LiteRTRuntime",
                    "options": {"delegate": "xnnpack", "num_threads": 2},
                },
                "models": models,
            }
        )


def measure(cmd: list[str]) -> tuple[float, float, float]:
    """(seconds to the first result line, seconds to exit, peak RSS in MiB) of one fresh process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    first = None
    for line in p.stdout:
        if first is None and line.startswith("frame "):
            first = time.perf_counter() - t0
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    total = time.perf_counter() - t0
    if p.returncode != 0 or first is None:
        raise SystemExit(f"{cmd[:4]} failed (exit {p.returncode})")
    return first, total, usage.ru_maxrss / 1024  # Linux reports KiB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workdir", type=Path, help="keep converted models here (shared with benchmarks/precision.py)")
    ap.add_argument("--prepare-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    workdir = work_dir(args.workdir, "edgekit-footprint-")
    if args.prepare_only:
        build_variants("demo", workdir)
        return 0
    subprocess.run([sys.executable, __file__, "--prepare-only", "--workdir", str(workdir)], check=True)
    paths = build_variants("demo", workdir)  # already converted: reads the files, no TensorFlow
    assert "tensorflow" not in sys.modules, "the measuring parent must stay small (see the module docstring)"
    bundle = make_bundle(paths, workdir / "demo-cpu")
    py = sys.executable
    keras_model = DEMO if DEMO.is_file() else None
    contenders = {
        "edgekit run (fp32)": [
            py,
            "-m",
            "edgekit.cli",
            "run",
            str(bundle),
            "--camera",
            "synthetic",
            "--max-frames",
            "1",
        ],
        "edgekit run (int8)": [
            py,
            "-m",
            "edgekit.cli",
            "run",
            f"{bundle}:int8",
            "--camera",
            "synthetic",
            "--max-frames",
            "1",
        ],
        "tensorflow tf.lite (fp32)": [py, "-c", TF_LITE, str(paths["fp32"])],
    }
    if keras_model:
        contenders["tensorflow + keras"] = [py, "-c", TF_KERAS, str(keras_model)]
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in contenders}
    for _ in range(args.repeats):
        for name, cmd in contenders.items():
            results[name].append(measure(cmd))
    med = {k: tuple(statistics.median(r[i] for r in v) for i in range(3)) for k, v in results.items()}
    ref = med.get("tensorflow + keras") or med["tensorflow tf.lite (fp32)"]
    print(f"{'contender':<28}{'first result':>13}{'exit':>8}{'peak RSS':>11}{'RSS ratio':>11}{'start ratio':>13}")
    goals = Goals("footprint.py")
    for name, (first, total, rss) in med.items():
        marks = ""
        if name.startswith("edgekit"):  # the goals are edgekit's; the other rows are what it is compared with
            marks = " " + " ".join({goals.check(f"{name} RSS ratio", rss / ref[2], "<=", 0.2),
                                     goals.check(f"{name} first result s", first, "<=", 1.0)})
        print(f"{name:<28}{first:>11.2f} s{total:>6.2f} s{rss:>7.0f} MiB{rss / ref[2]:>10.2f}x{first / ref[0]:>12.2f}x"
              + marks)
    print(
        f"medians of {args.repeats} fresh processes each; ratios against "
        f"{'tensorflow + keras' if 'tensorflow + keras' in med else 'tensorflow tf.lite'} "
        "(goals: RSS <= 0.2x, edgekit first result <= 1.0 s)"
    )
    return goals.exit_code()


if __name__ == "__main__":
    sys.exit(main())
