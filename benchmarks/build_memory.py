"""Peak memory of real builds against the build's own pre-check estimate (issue 38 item 9).

Runs ``edgekit build`` on each model as its own process and samples, every 0.1 s, the resident
memory of the whole process tree (the build and whatever it starts: onnx2tf's child, the
converter's helpers) from /proc, so a parent and a child that peak together count together.
Prints one row per model: the estimate the build logged ("this build should peak near"), the
measured tree peak, the ratio, and ``ru_maxrss`` of self and children for comparison.

    python benchmarks/build_memory.py --calib /tmp/faces_calib \\
        /tmp/realmodels/mp/mediapipe/modules/face_landmark/face_landmark.tflite ...

Figures, not pass/fail (goal: measured / estimate <= 1.5, and the estimate not above 1.5x the peak).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants now (from /proc)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            parents[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    members, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in members:
                members.add(child)
                frontier.append(child)
    return sum(rss.get(pid, 0) for pid in members)


def measure(model: Path, calib: Path, count: int, extra: list[str]) -> dict:
    """One build; its logged estimate and measured peaks (bytes)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "edgekit.cli", "build", "--model", str(model), "--target", "cpu",
               "--calib", str(calib), "--calib-count", str(count), "--out", out, *extra]
        log = Path(out) / "stderr.txt"
        with log.open("w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
            peak, stop = [0], threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], tree_rss(proc.pid))
                    time.sleep(0.1)

            sampler = threading.Thread(target=sample, daemon=True)
            t0 = time.monotonic()
            sampler.start()
            code = proc.wait()
            stop.set()
            sampler.join()
        text = log.read_text()
    m = re.search(r"should peak near ([\d.]+) GB", text)
    estimate = float(m.group(1)) * (1 << 30) if m else None
    row = {"model": model.name, "exit": code, "seconds": round(time.monotonic() - t0, 1),
           "estimate_gb": round(estimate / (1 << 30), 2) if estimate else None,
           "tree_peak_gb": round(peak[0] / (1 << 30), 2),
           "ratio": round(peak[0] / estimate, 2) if estimate else None,
           "logged": [line for line in text.splitlines() if "peak RSS" in line and line.startswith("build:")]}
    if code != 0:
        row["error"] = text.strip().splitlines()[-3:]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--calib", type=Path, required=True)
    parser.add_argument("--calib-count", type=int, default=40)
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("build_args", nargs=argparse.REMAINDER, help="after --: more build flags")
    args = parser.parse_args()
    extra = [a for a in args.build_args if a != "--"]
    rows = []
    for model in args.models:
        rows.append(measure(model, args.calib, args.calib_count, extra))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
