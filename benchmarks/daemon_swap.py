"""Bundle hot-swap figures: the longest frame gap across a swap at 15 fps, and RSS after 1 and
after N swaps (no leak per swap).

Two real bundles (float32 CNNs converted by TensorFlow in a subprocess, written with
BundleWriter) behind a symlink that is flipped atomically; the daemon is asked to reload
after each flip (as SIGHUP does) and must pass its checks, swap between two frames and
finish its probation before the next flip.

    python benchmarks/daemon_swap.py --swaps 100

Figures, not pass/fail (goals: longest gap <= 2 x the frame interval; RSS after N swaps
within 5 % of RSS after 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_throughput import build_models  # noqa: E402

from edgekit.bundle import BundleWriter  # noqa: E402
from edgekit.imaging.image import InputSpec  # noqa: E402
from edgekit.serve.config.load import ServeConfig, override  # noqa: E402
from edgekit.serve.daemon import Daemon  # noqa: E402


def rss_mb() -> float:
    """Resident set size of this process (MB), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_bundle(dest: Path, model: Path, size: int) -> Path:
    """A cpu bundle holding ``model`` (10 classes)."""
    spec = InputSpec(shape=(1, size, size, 3))
    with BundleWriter(dest) as w:
        shutil.copy(model, w.dir / "model.tflite")
        (w.dir / "labels.txt").write_text("".join(f"c{i}\n" for i in range(10)))
        return w.commit({"target": "cpu", "default_model": "fp32", "labels": "labels.txt",
                         "runtime": {"adapter": "edgekit.runtime.litert:LiteRTRuntime", "options": {"num_threads": 1}},
                         "models": [{"name": "fp32", "file": "model.tflite", "format": "tflite", "precision": "fp32",
                                     "input": spec.to_dict(), "outputs": [{"name": "scores"}]}]})


def flip(link: Path, target: Path) -> None:
    tmp = link.with_name(link.name + ".tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def gaps_ms(results: Path) -> list[float]:
    """Gaps between consecutive results (ms), from the JSON lines' time stamps."""
    times = [json.loads(line)["time"] for line in results.read_text().splitlines()]
    return [(b - a) * 1000 for a, b in zip(times, times[1:])]


def run(workdir: Path, swaps: int, fps: float, baseline_s: float) -> dict:
    models = build_models(workdir, (96, 128), width=16)
    bundles = [make_bundle(workdir / f"b{i}", m, s) for i, (m, s) in enumerate(zip(models, (96, 128)))]
    link = workdir / "bundle"
    link.symlink_to(bundles[0])
    results = workdir / "results.jsonl"
    config = ServeConfig()
    for table, values in {
        "model": {"path": str(link), "warmup_frames": 3, "probation_frames": 2},
        "camera": {"uri": f"synthetic:320x240@{fps:g}"},
        "output": {"jsonl": str(results)},
        "http": {"listen": ""},
    }.items():
        config = override(config, table, **values)
    daemon = Daemon(config)
    daemon.start()
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    time.sleep(1.0 + baseline_s)  # frames without swaps: the gaps this machine gives anyway
    baseline_lines = len(results.read_text().splitlines())
    rss, swap_s = {}, []
    for i in range(1, swaps + 1):
        flip(link, bundles[i % 2])
        t0 = time.perf_counter()
        daemon.request_reload("benchmark")
        while daemon.swaps["ok"] < i:  # not stats(): its percentiles would take the loop's CPU
            if daemon.swaps["refused"] or daemon.swaps["rolled_back"]:
                raise RuntimeError(f"swap {i}: {daemon.swaps['last']}")
            time.sleep(0.02)
        swap_s.append(time.perf_counter() - t0)
        if i == 1 or i == swaps:
            time.sleep(0.5)
            rss[i] = rss_mb()
    daemon.stop()
    thread.join(10)
    gaps = gaps_ms(results)
    interval = 1000 / fps
    quiet, swapping = gaps[10:baseline_lines - 1], gaps[baseline_lines - 1:]
    return {
        "swaps": swaps, "fps": fps, "frame_interval_ms": round(interval, 1),
        "longest_gap_ms_without_swaps": round(max(quiet), 1),
        "longest_gap_ms": round(max(swapping), 1), "longest_gap_over_interval": round(max(swapping) / interval, 2),
        # A loaded machine stalls now and then without any swap: the share of gaps over 2 intervals
        # in both periods tells a swap's cost from the machine's.
        "share_over_2x_without_swaps": round(sum(g > 2 * interval for g in quiet) / max(1, len(quiet)), 4),
        "share_over_2x_with_swaps": round(sum(g > 2 * interval for g in swapping) / max(1, len(swapping)), 4),
        "p99_gap_ms_without_swaps": round(sorted(quiet)[int(0.99 * (len(quiet) - 1))], 1),
        "p99_gap_ms_with_swaps": round(sorted(swapping)[int(0.99 * (len(swapping) - 1))], 1),
        "results": len(gaps) + 1, "swap_s_median": round(sorted(swap_s)[len(swap_s) // 2], 3),
        "rss_mb_after_1": round(rss[1], 1), f"rss_mb_after_{swaps}": round(rss[swaps], 1),
        "rss_growth": round(rss[swaps] / rss[1] - 1, 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=100)
    parser.add_argument("--fps", type=float, default=15.0)
    parser.add_argument("--baseline-s", type=float, default=10.0, help="seconds of frames without swaps first")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgekit-swap-") as tmp:
        report = run(Path(tmp), args.swaps, args.fps, args.baseline_s)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
