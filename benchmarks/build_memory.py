"""Peak memory of real builds against the build's own pre-check estimate (issue 38 item 9).

Runs ``edgekit build`` on each case as its own process and samples, every 0.1 s, every process of
its tree (the build and whatever it starts: onnx2tf's child, edgetpu_compiler) from /proc, so a
parent and a child that peak together count together. Per build it prints the estimate the build
logged ("this build should peak near"), the measured *tree peak* (the largest sum of the tree's
RSS at one instant; its anonymous part beside it, the pages a second process does not share),
the parent's own peak (``VmHWM``) and the largest child's (``VmHWM`` read while it ran), and the
build's step that was running at the tree's peak (the last line it had logged).

    python benchmarks/build_memory.py                      # the real-model suite below
    python benchmarks/build_memory.py --cases mp_face,ocr_cls --json rows.json
    python benchmarks/build_memory.py --estimate-only      # the estimates alone (stops each build there)
    python benchmarks/build_memory.py --model M.onnx --calib calib/frames -- --input-size 64x64

The suite needs the MediaPipe and RapidOCR files under ``$EDGEKIT_REAL_MODELS`` (the unpacked wheels of
mediapipe 0.10.14 and rapidocr-onnxruntime 1.4.4, found by file name, as the tests do; cases whose model is
missing are skipped). Figures, not pass/fail (goal: estimate >= tree peak, within 1.5x).
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GB = 1 << 30


def _real(name: str) -> Path:
    """A published model file found by name under ``$EDGEKIT_REAL_MODELS`` (a path that does not exist
    when the variable is unset or the file is not there: that case is skipped)."""
    root = os.environ.get("EDGEKIT_REAL_MODELS")
    found = next(iter(sorted(Path(root).rglob(name))), None) if root and Path(root).is_dir() else None
    return found or Path("missing") / name


PAGE = os.sysconf("SC_PAGE_SIZE")
OCR_NORM = ["--mean", "127.5", "--std", "127.5"]

#: name -> (model, calibration images, build flags); each is built for --targets (cpu, edgetpu)
CASES: dict[str, tuple[Path, str, list[str]]] = {
    "demo": (ROOT / "models/demo.keras", "calib/fashion", ["--eval", "eval/fashion"]),
    "detector": (ROOT / "models/detector.keras", "calib/detect", ["--task", "detect", "--eval", "eval/detect"]),
    "mp_face": (_real("face_detection_short_range.tflite"), "calib/frames",
                ["-T", "preset=mediapipe_face_short", "--task", "detect"]),
    "mp_landmark": (_real("face_landmark.tflite"), "calib/frames", ["--task", "raw"]),
    "mp_palm": (_real("palm_detection_lite.tflite"), "calib/frames", ["--task", "raw"]),
    "mp_selfie": (_real("selfie_segmentation.tflite"), "calib/frames", ["--task", "segment"]),
    "ocr_cls": (_real("ch_ppocr_mobile_v2.0_cls_infer.onnx"), "calib/frames",
                ["--input-size", "48x192", *OCR_NORM, "--task", "raw"]),
    "ocr_det160": (_real("ch_PP-OCRv4_det_infer.onnx"), "calib/frames",
                   ["--input-size", "160x160", *OCR_NORM, "--task", "raw"]),
    "ocr_det320": (_real("ch_PP-OCRv4_det_infer.onnx"), "calib/frames",
                   ["--input-size", "320x320", *OCR_NORM, "--task", "raw"]),
    # 214 images: the converter calibrates on 150 (--calib-steps), so the first int8 takes longer and
    # recovery's time budget (3x it) runs more attempts
    "ocr_det320_214": (_real("ch_PP-OCRv4_det_infer.onnx"), "calib/frames",
                       ["--calib", "calib/detect", "--input-size", "320x320", *OCR_NORM, "--task", "raw"]),
}
# the same builds with a gate no int8 model meets, so int8 recovery (and its per-layer probe) runs:
# build them for cpu (the Edge TPU keeps no layer in float, so it never probes)
FORCED = {"demo": "--min-accuracy-ratio", "detector": "--min-detect-agreement", "mp_face": "--min-detect-agreement",
          "mp_landmark": "--min-cosine", "ocr_cls": "--min-cosine"}
CASES.update({f"{name}_rec": (CASES[name][0], CASES[name][1], [*CASES[name][2], flag, "0.99999"])
              for name, flag in FORCED.items()})
DEFAULT_CASES = "demo,detector,mp_face,mp_landmark,mp_palm,mp_selfie,ocr_cls,ocr_det160"


@dataclass
class Tree:
    """What the sampler saw of one build's process tree (bytes)."""

    root: int
    peak: int = 0  # largest sum of RSS at one instant
    peak_anon: int = 0  # the anonymous (RssAnon + RssShmem) part of that sum at the same instant
    peak_parts: list[int] = field(default_factory=list)  # each process's RSS at the tree's peak, root first
    peak_at: float = 0.0  # seconds after the start
    hwm: dict[int, int] = field(default_factory=dict)  # pid -> its last VmHWM
    names: dict[int, str] = field(default_factory=dict)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (s, root's RSS, the others' RSS)


def _status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssShmem of ``pid`` in bytes ({} once it is gone)."""
    found = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssShmem"):
                    found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


def descendants(root: int) -> list[int]:
    """``root`` and every process under it now, ``root`` first (from each /proc/PID/stat's parent)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    members, frontier = [root], [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            members.append(child)
            frontier.append(child)
    return members


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants now (from /proc)."""
    return sum(_status(pid).get("VmRSS", 0) for pid in descendants(root))


def _name(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    m = re.search(r"-m (\S+)", text)
    return m.group(1).rsplit(".", 1)[-1] if m else Path(text.split(" ")[0]).name


def sample(tree: Tree, t0: float) -> None:
    """One look at the tree: its sum of RSS now, each member's VmHWM."""
    total = anon = 0
    parts = []
    for pid in descendants(tree.root):
        s = _status(pid)
        if not s:
            continue
        tree.hwm[pid] = max(tree.hwm.get(pid, 0), s.get("VmHWM", 0))
        if pid not in tree.names:
            tree.names[pid] = _name(pid)
        total += s.get("VmRSS", 0)
        anon += s.get("RssAnon", 0) + s.get("RssShmem", 0)
        parts.append(s.get("VmRSS", 0))
    if parts:
        tree.timeline.append((round(time.monotonic() - t0, 1), parts[0], total - parts[0]))
    if total > tree.peak:
        tree.peak, tree.peak_anon, tree.peak_parts, tree.peak_at = total, anon, parts, time.monotonic() - t0


def _estimate(line: str) -> float | None:
    m = re.search(r"should peak near ([\d.]+) GB", line)
    return float(m.group(1)) if m else None


def measure(label: str, model: Path, calib: str, target: str, flags: list[str], estimate_only: bool,
            trace: Path | None = None) -> dict:
    """One build of ``model`` for ``target``; its logged estimate, measured peaks and the step at the peak."""
    with tempfile.TemporaryDirectory(prefix="edgekit-mem-") as out:
        cmd = [sys.executable, "-m", "edgekit.cli", "build", "--model", str(model), "--target", target,
               "--calib", calib, "--out", out, "--no-memory-check", *flags]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=env, text=True)
        tree, lines, stop, t0 = Tree(proc.pid), [], threading.Event(), time.monotonic()

        def watch() -> None:
            while not stop.is_set():
                sample(tree, t0)
                time.sleep(0.1)

        sampler = threading.Thread(target=watch, daemon=True)
        sampler.start()
        for line in proc.stderr:
            lines.append((time.monotonic() - t0, line.rstrip()))
            if estimate_only and _estimate(line) is not None:
                proc.kill()
                break
        _, status, usage = os.wait4(proc.pid, 0)
        stop.set()
        sampler.join()
    if trace:
        trace.mkdir(parents=True, exist_ok=True)
        (trace / f"{label}_{target}.json").write_text(json.dumps({"timeline": tree.timeline, "log": lines}))
    estimate = next((e for _, line in lines if (e := _estimate(line)) is not None), None)
    before = [line for t, line in lines if t <= tree.peak_at and line.strip()]
    children = {pid: hwm for pid, hwm in tree.hwm.items() if pid != tree.root}
    top = max(children, key=children.get) if children else None
    code = os.waitstatus_to_exitcode(status)
    row = {"case": label, "model": model.name, "input": _input(lines), "target": target, "exit": code,
           "seconds": round(time.monotonic() - t0, 1), "predicted_gb": estimate,
           "tree_peak_gb": round(tree.peak / GB, 2), "tree_anon_gb": round(tree.peak_anon / GB, 2),
           "parent_peak_gb": round(tree.hwm.get(tree.root, 0) / GB, 2),
           "child_peak_gb": round(children[top] / GB, 2) if top else 0.0,
           "child": tree.names.get(top, "") if top else "",
           "at_peak": [round(p / GB, 2) for p in tree.peak_parts], "peak_step": before[-1][:160] if before else "",
           "ru_maxrss_gb": round(usage.ru_maxrss * 1024 / GB, 2),
           "logged": [line for _, line in lines if line.startswith("build:") and "peak" in line]}
    if code not in (0, 3) and not estimate_only:  # exit 3: built, the gate refused it; still a measurement
        row["error"] = [line for _, line in lines][-3:]
    return row


def _input(lines: list[tuple[float, str]]) -> str:
    for _, line in lines:
        m = re.search(r"(\d+x\d+) input", line)
        if m:
            return m.group(1)
    return "?"


def table(rows: list[dict]) -> str:
    """The rows as a fixed-width table."""
    head = (f"{'case':<12}{'input':>9}{'target':>9}{'predicted':>10}{'tree peak':>10}{'(anon)':>8}{'ratio':>7}"
            f"{'parent':>8}{'child':>8}  {'secs':>6}  step at the tree's peak")
    out = [head]
    for r in rows:
        pred = r["predicted_gb"]
        ratio = f"{pred / r['tree_peak_gb']:.2f}" if pred and r["tree_peak_gb"] else "-"
        out.append(f"{r['case']:<12}{r['input']:>9}{r['target']:>9}{pred or 0:>10.2f}{r['tree_peak_gb']:>10.2f}"
                   f"{r['tree_anon_gb']:>8.2f}{ratio:>7}{r['parent_peak_gb']:>8.2f}{r['child_peak_gb']:>8.2f}  "
                   f"{r['seconds']:>6.0f}  {r['peak_step'][:70]}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"from {', '.join(CASES)} (default {DEFAULT_CASES})")
    parser.add_argument("--targets", default="cpu,edgetpu", help="each case is built once per target")
    parser.add_argument("--model", type=Path, help="one model instead of the suite (with --calib and -- flags)")
    parser.add_argument("--calib", default="calib/frames")
    parser.add_argument("--estimate-only", action="store_true", help="stop each build once it logged its estimate")
    parser.add_argument("--json", type=Path, help="append the rows here (one JSON object a line)")
    parser.add_argument("--trace", type=Path, help="write each build's RSS timeline and timed log lines here")
    parser.add_argument("build_args", nargs=argparse.REMAINDER, help="after --: more build flags")
    args = parser.parse_args()
    extra = [a for a in args.build_args if a != "--"]
    if args.model:
        cases = {args.model.stem: (args.model, args.calib, [])}
    else:
        cases = {name: CASES[name] for name in args.cases.split(",")}
    rows = []
    for name, (model, calib, flags) in cases.items():
        if not model.exists():
            print(f"{name}: {model} missing, skipped", file=sys.stderr)
            continue
        for target in args.targets.split(","):
            rows.append(measure(name, model, calib, target, [*flags, *extra], args.estimate_only, args.trace))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if args.json:
                with args.json.open("a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
