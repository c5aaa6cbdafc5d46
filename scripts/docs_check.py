"""``make docs-check``: every command in README.md and docs/*.md, run as written.

Commands are the lines of fenced code blocks that start with a program a reader would type
(``edgekit``, ``python -m``, ``make``, ``pip``, ``curl``, ...), continuation lines joined. Each is
either run from the repository root (after ``make demo``: the bundles in dist/ are what the
text refers to) with a time limit, or skipped with the reason: hardware this machine lacks (a
camera, a Vector, a Coral, a Jetson), root (``sudo``), the network (``pip install``), a file the
reader brings (``yolov8n.onnx``), or a long-running service. Prints one line per command and
exits non-zero when any command that ran failed.

    python -m scripts.docs_check [--list] [--only TEXT] [--timeout S]

The cheap half (every ``edgekit`` command parses with its verb, in the current grammar) runs
in ``make test``: tests/house/test_docs_commands.py.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/*.md")
PROGRAMS = {"edgekit", "python", "python3", "make", "pip", "curl", "sudo", "mosquitto_sub"}
EXPECTED_EXIT = re.compile(r"#.*\bexits (\d+)\b")  # a comment that says what a failing example returns
FENCE = re.compile(r"^```[\w-]*\n(.*?)^```", re.S | re.M)

SKIPS = (  # (pattern in the command, why it is not run here)
    (r"^sudo ", "needs root and changes the system (the service install of docs/serve.md)"),
    (r"^pip install|^python3 -m venv", "installs packages (the network; checked by make test's fresh venv)"),
    (r"v4l2:|rtsp://|--serial|usb:0|picamera2", "needs a camera, a Coral or a Vector"),
    (r"tensorrt|onnxruntime-cuda|onnxruntime-trt|nvidia", "needs a Jetson (TensorRT, CUDA)"),
    (r"demo-jetson", "a Jetson bundle runs on a Jetson (make demo builds no jetson bundle here)"),
    (r"mosquitto_sub|curl ", "talks to a running service"),
    (r"/etc/|/opt/edgekit", "reads or writes the installed service's files"),
    (r"yolov8n\.onnx|exported\.onnx|mobilenetv2\.keras|signs\.keras|face_detection|data/signs|frames/"
     r"|selfie_segmentation|pose_detection|o/seg-cpu|bf-cpu",
     "a file the reader brings"),
    (r"^make (demo|test|pi-check|docs-check|mutate)\b", "one of the long make targets (run on their own)"),
    (r"^make (model|data)\b", "retrains or regenerates from the dataset package (minutes; make test covers it)"),
    (r"^make bench\b", "the benchmark scripts (long; run on their own)"),
    (r"anki_vector\.configure|robot\.collect|robot\.train", "needs a Vector or its recorded data"),
    (r"^edgekit serve: error", "an example of output, not a command"),
    (r"^edgekit toolchain install|rknn-sim|-rk3588|-imx500|--target \S*(rk3588|imx500)",
     "installs a vendor toolchain (GBs from PyPI) or needs one and a bundle make demo does not build"),
    (r"s3://|^edgekit (keygen|sign|verify) .*keys/",
     "writes keys or signatures into the checkout, or needs an object store with credentials (tests/fleet runs "
     "these against SeaweedFS)"),
)
TIMEOUT_S = {"edgekit build": 900, "edgekit bench": 600}


@dataclass(frozen=True)
class Command:
    """One command of the docs: where it is and what it says."""

    file: str
    line: int
    text: str
    exit_code: int = 0

    def skip_reason(self) -> str | None:
        """Why it is not run here, or None to run it."""
        return next((why for pattern, why in SKIPS if re.search(pattern, self.text)), None)

    def timeout(self, default: float) -> float:
        return next((s for prefix, s in TIMEOUT_S.items() if self.text.startswith(prefix)), default)


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and docs/*.md."""
    return [p for pattern in DOCS for p in sorted(root.glob(pattern))]


def commands(root: Path = ROOT) -> list[Command]:
    """Every command in a fenced block of the docs, comments cut, continuations joined."""
    found = []
    for path in doc_files(root):
        text = path.read_text()
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            found += _block_commands(str(path.relative_to(root)), first, block.group(1))
    return found


def _block_commands(name: str, first_line: int, body: str) -> list[Command]:
    out, pending, start, code = [], "", 0, 0
    for offset, raw in enumerate(body.splitlines()):
        line = re.sub(r"\s+#\s.*$", "", raw).rstrip()
        if not pending:
            start = first_line + offset
            first = (line.split() or [""])[0]
            if first not in PROGRAMS and not first.startswith(".venv/bin/"):
                continue
        expected = EXPECTED_EXIT.search(raw)
        code = int(expected.group(1)) if expected else code
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        if not _complete(pending + line.strip()):  # a quoted option value that spans lines
            pending += line.strip() + " "
            continue
        out.append(Command(name, start, (pending + line.strip()).strip(), code))
        pending, code = "", 0
    return out


def _complete(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:  # "No closing quotation"
        return False
    return True


def run(command: Command, timeout_s: float) -> tuple[bool, str]:
    """Run one command from the repository root; (passed, last line of output or the reason)."""
    import shutil

    # bash, as the reader's terminal would: the docs use pipes and `&&` (the text is the
    # repository's own, never user input)
    shell = shutil.which("bash") or "/bin/bash"
    try:
        done = subprocess.run([shell, "-o", "pipefail", "-c", command.text], cwd=ROOT, capture_output=True,
                              text=True, timeout=command.timeout(timeout_s), env=_env())
    except subprocess.TimeoutExpired:
        return False, f"no result within {command.timeout(timeout_s):.0f} s"
    tail = (done.stdout + done.stderr).strip().splitlines()
    said = tail[-1][:160] if tail else "(no output)"
    return done.returncode == command.exit_code, f"exit {done.returncode}: {said}"


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"  # `edgekit` as `make install` put it
    return env


def main(argv: list[str] | None = None) -> int:
    """Run (or --list) the documented commands; 1 when any that ran failed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="say what would run and what is skipped, run nothing")
    ap.add_argument("--only", help="run the commands containing this text")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per command (builds and benches: more)")
    args = ap.parse_args(argv)
    failed = ran = 0
    before = _untracked()
    try:
        for c in commands():
            ran, failed = _one(c, args, ran, failed)
    finally:
        _remove_new(before)  # serve.toml, deploy-out/, out.json ...: what the commands wrote outside dist/
    if not args.list:
        print(f"docs-check: {ran - failed} of {ran} commands ran as written" + (f"; {failed} FAILED" if failed else ""))
    return 1 if failed else 0


def _one(c: Command, args: argparse.Namespace, ran: int, failed: int) -> tuple[int, int]:
    """List, skip or run one command; the running counts."""
    if args.only and args.only not in c.text:
        return ran, failed
    where = f"{c.file}:{c.line}"
    why = c.skip_reason()
    if why or args.list:
        print(f"{'skip' if why else 'run '}  {where:<22} {c.text[:90]}" + (f"\n      ({why})" if why else ""))
        return ran, failed
    t0 = time.monotonic()
    ok, said = run(c, args.timeout)
    print(f"{'ok  ' if ok else 'FAIL'}  {where:<22} {time.monotonic() - t0:6.1f} s  {c.text[:90]}\n      {said}",
          flush=True)
    return ran + 1, failed + (not ok)


def _untracked() -> set[str]:
    import shutil

    git = shutil.which("git") or "/usr/bin/git"
    listed = subprocess.run([git, "ls-files", "--others", "--exclude-standard", "--directory"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    return set(listed.stdout.splitlines())


def _remove_new(before: set[str]) -> None:
    import shutil

    for name in sorted(_untracked() - before):
        path = ROOT / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
