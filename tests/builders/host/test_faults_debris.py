"""Fault catalogue 3, item 8: debris of builds killed with SIGKILL (the OOM killer, a power cut).

Nothing runs in a process killed that way, so its work directory ``edgekit-build-*`` stays in
the temp dir and a half-written bundle ``.NAME.tmp-PID-*`` in ``--out``. The next build removes
what belongs to dead processes (the PID recorded inside or in the name), says so in one line,
and leaves a live process's alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.builders.host.debris import OWNER, WORK_PREFIX, sweep
from tests.conftest import CALIB, DEMO_MODEL, ROOT

EDGEKIT = [sys.executable, "-m", "edgekit.cli"]


class _Log:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp), "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


def _killed_bundle_writer(out: Path, tmp: Path) -> None:
    """A real process that opens a bundle in ``out`` and a work dir in ``tmp``, then is SIGKILLed."""
    code = ("import os, signal, sys\n"
            "from edgekit.builders.host.debris import work_dir\n"
            "from edgekit.bundle import BundleWriter\n"
            "w = BundleWriter(sys.argv[1]).__enter__()\n"
            "(w.dir / 'model.tflite').write_bytes(b'half')\n"
            "held = work_dir(); held.__enter__()  # kept referenced: no cleanup before the kill\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, str(out / "demo-cpu")], env=_env(tmp), cwd=ROOT, timeout=60)
    assert done.returncode == -signal.SIGKILL


def test_a_killed_processes_debris_is_swept_and_a_live_ones_kept(tmp_path, monkeypatch):
    out, tmp = tmp_path / "dist", tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    _killed_bundle_writer(out, tmp)
    dead = sorted(p.name for p in [*out.iterdir(), *tmp.iterdir()])
    assert any(n.startswith(".demo-cpu.tmp-") for n in dead) and any(n.startswith(WORK_PREFIX) for n in dead)
    live = tmp / f"{WORK_PREFIX}live"  # a running build's (this process stands in for it)
    live.mkdir()
    (live / OWNER).write_text(f"{os.getppid()}\n")
    unknown = tmp / f"{WORK_PREFIX}old"  # no owner recorded: an older edgekit's, left alone
    unknown.mkdir()
    log = _Log()
    removed = sweep(out, log)  # started now: after the killed process
    assert sorted(p.name for p in removed) == dead
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp.iterdir()) == [live.name, unknown.name]
    assert len(log.lines) == 1 and "removed 2 leftover(s) of killed builds" in log.lines[0]
    assert sweep(out, _Log()) == []  # nothing more: no line


def test_nothing_newer_than_the_running_build_is_touched(tmp_path, monkeypatch):
    out, tmp = tmp_path / "dist", tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    _killed_bundle_writer(out, tmp)
    assert sweep(out, _Log(), started=1.0) == []  # made after the sweeping build began (1 s past the epoch)


@pytest.mark.slow
def test_a_build_after_a_sigkilled_build_leaves_only_the_new_bundle(tmp_path):
    out, tmp = tmp_path / "dist", tmp_path / "tmp"
    tmp.mkdir()
    argv = [*EDGEKIT, "build", "--model", str(DEMO_MODEL), "--target", "cpu", "--variants", "fp32",
            "--calib", str(CALIB), "--calib-count", "12", "--out", str(out)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=_env(tmp), cwd=ROOT)
    assert proc.stderr is not None
    for line in proc.stderr:  # converting: the work dir exists
        if "[cpu] convert fp32 ..." in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    _killed_bundle_writer(out, tmp)  # and one killed while its bundle was half-written
    assert [p for p in tmp.iterdir() if p.name.startswith(WORK_PREFIX)]
    done = subprocess.run(argv, capture_output=True, text=True, env=_env(tmp), cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    swept = [line for line in done.stderr.splitlines() if "leftover(s) of killed builds" in line]
    # the killed build's work dir and half-written bundle, the killed writer's two
    assert len(swept) == 1 and "removed 4 leftover(s)" in swept[0], done.stderr
    assert [p.name for p in out.iterdir()] == ["demo-cpu"]
    left = [p.name for p in tmp.iterdir() if p.name != ".ses" and not p.name.startswith("__autograph")]
    assert left == [], left
