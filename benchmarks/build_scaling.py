"""How a build's wall time and peak memory grow with the number of calibration images.

Builds MobileNetV2 at 224x224 (a 10-class classifier) and at 640x640 (its backbone with a
20x20x85 sigmoid grid, the shape of a one-scale YOLO head: ``--task raw``) for the ``cpu``
target, int8 only, with N calibration images, each build in its own child process
(``edgekit build``); the child's wall time and peak RSS (``wait4`` rusage) are printed per N,
so the slope is visible. Also the demo build (models/demo.keras, calib/fashion + eval/fashion).

Models come from ``keras.applications`` with ``weights=None`` (nothing downloaded); their
batch-norm statistics are set from one batch of the synthetic images so that activations keep
a realistic range (random weights alone shrink them to 1e-11, which no int8 grid represents).
Calibration images are synthetic smooth-noise JPEGs at the model's size.

    python benchmarks/build_scaling.py                     # 224 and 640, N = 50 150 300 1000
    python benchmarks/build_scaling.py --sizes 224 --counts 50,300

Figures, not pass/fail. The load average is printed beside each row: on a shared machine it
says how far the times can be trusted.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOALS = "goals (issue 19): 224x224 N=300 <= 30 s, <= 2.5 GB; N=1000 <= 2.5 GB, <= 1.5x the N=300 time; " \
        "640x640 N=300 <= 4 GB; demo <= 15 s"


def make_images(folder: Path, count: int, size: int) -> Path:
    """``count`` smooth random JPEGs of ``size`` x ``size`` (deterministic); kept between runs."""
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        path = folder / f"img_{i:05d}.jpg"
        if not path.exists():
            small = rng.integers(0, 256, (max(2, size // 16), max(2, size // 16), 3), dtype=np.uint8)
            cv2.imwrite(str(path), cv2.resize(small, (size, size), interpolation=cv2.INTER_CUBIC))
    return folder


def make_model(path: Path, size: int, images: Path) -> Path:
    """MobileNetV2 at ``size`` (224: classifier; other sizes: backbone + 85-channel sigmoid grid)."""
    if path.exists():
        return path
    code = f"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, keras, cv2
from pathlib import Path
size = {size}
if size == 224:
    model = keras.applications.MobileNetV2(input_shape=(224, 224, 3), weights=None, classes=10)
else:
    inp = keras.Input((size, size, 3))
    base = keras.applications.MobileNetV2(input_tensor=inp, include_top=False, weights=None)
    model = keras.Model(inp, keras.layers.Conv2D(85, 1, activation="sigmoid", name="grid")(base.output))
files = sorted(Path({str(images)!r}).glob("*.jpg"))[:8]
rgb = [cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB) for f in files]
batch = np.stack([cv2.resize(x, (size, size), interpolation=cv2.INTER_AREA) for x in rgb]).astype("float32") / 255
for layer in model.layers:  # batch-norm statistics from one batch: realistic activation ranges
    if isinstance(layer, keras.layers.BatchNormalization):
        layer.momentum = 0.0
model(batch, training=True)
model.save({str(path)!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    return path


def run_build(args: list[str], out: Path, root: Path = ROOT) -> dict:
    """One ``edgekit build`` in a child (the edgekit of checkout ``root``): exit code, wall seconds,
    peak RSS (bytes), the step lines."""
    log = out / "build.stderr"
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="2")
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "build", *args, "--out", str(out / "dist")],
                                stdout=subprocess.DEVNULL, stderr=err, cwd=root, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in log.read_text().splitlines() if "done in" in line or line.startswith("build:")]
    errors = [line.split("error:", 1)[1].strip() for line in log.read_text().splitlines() if "error:" in line]
    return {"rc": proc.returncode, "wall": wall, "rss": usage.ru_maxrss * 1024, "load": (load, os.getloadavg()[0]),
            "steps": lines, "error": errors[-1:] if proc.returncode else []}


def row(name: str, n: int | str, r: dict) -> str:
    gb = r["rss"] / (1 << 30)
    # exit 3: built and verified, but the accuracy gate refused it (the row still measures the build)
    ok = "ok" if r["rc"] == 0 else f"exit {r['rc']}: {' '.join(r['error'])[:100]}"
    return f"{name:<22}{n!s:>6}{r['wall']:>9.1f}{gb:>10.2f}{r['load'][0]:>7.1f}{r['load'][1]:>6.1f}  {ok}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="224,640", help="model input sizes (default 224,640)")
    p.add_argument("--counts", default="50,150,300,1000", help="calibration image counts")
    p.add_argument("--work", type=Path, help="where models and images are kept between runs (default: a temp dir)")
    p.add_argument("--no-demo", action="store_true", help="skip the demo build")
    p.add_argument("--steps", action="store_true", help="print each build's step lines (seconds, peak RSS)")
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the edgekit checkout to run (e.g. an older commit from git worktree, to compare)")
    a = p.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="edgekit-scaling-"))
    counts = [int(c) for c in a.counts.split(",")]
    cores = len(os.sched_getaffinity(0))
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    print(f"{platform.machine()}, {cores} cores, {mem:.0f} GB; python {platform.python_version()}; "
          f"load average at start {os.getloadavg()[0]:.1f}; edgekit from {a.root.name}")
    print(GOALS)
    print(f"{'model':<22}{'N':>6}{'wall s':>9}{'peak GB':>10}{'load':>7}{'->':>6}")
    for size in (int(s) for s in a.sizes.split(",")):
        images = make_images(work / f"calib{size}", max(counts), 256 if size == 224 else size)
        model = make_model(work / f"mobilenetv2_{size}.keras", size, images)
        task = ["--task", "raw"] if size != 224 else []
        for n in counts:
            out = work / f"out{size}_{n}"
            out.mkdir(exist_ok=True)
            r = run_build(["--model", str(model), "--target", "cpu", "--variants", "int8", "--calib", str(images),
                           "--calib-count", str(n), *task], out, a.root)
            print(row(f"mobilenetv2 {size}x{size}", n, r), flush=True)
            if a.steps:
                print("\n".join(f"    {line}" for line in r["steps"]))
    if not a.no_demo:
        out = work / "demo"
        out.mkdir(exist_ok=True)
        r = run_build(["--model", "models/demo.keras", "--target", "cpu", "--variants", "int8", "--calib",
                       "calib/fashion", "--eval", "eval/fashion"], out, a.root)
        print(row("demo 32x32 (+eval)", "400", r), flush=True)
        if a.steps:
            print("\n".join(f"    {line}" for line in r["steps"]))
    print(f"work directory: {work}")


if __name__ == "__main__":
    main()
