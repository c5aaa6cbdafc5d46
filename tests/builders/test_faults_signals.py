"""Fault catalogue, signals and native crashes: real `edgekit` processes, signalled mid-build.

SIGTERM (timeout, kill, systemd, a CI runner) must clean up as Ctrl-C does: no temporary
bundle directory in --out, no ``edgekit-build-*`` work directory in the temp dir, no
traceback, exit 128 + the signal's number. A manifest asking for 100000 threads must be
refused before LiteRT sees it (it segfaulted the process).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CALIB, DEMO_MODEL, ROOT

EDGEKIT = [sys.executable, "-m", "edgekit.cli"]


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp), "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


def _signal_at(argv: list[str], env: dict, marker: str, signum: int, timeout: float = 120) -> tuple[int, str]:
    """Start ``edgekit ARGV``, send ``signum`` when stderr shows ``marker``; (exit code, stderr)."""
    proc = subprocess.Popen([*EDGEKIT, *argv], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)
    seen, deadline = [], time.monotonic() + timeout
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if marker in line:
            proc.send_signal(signum)
            break
        assert time.monotonic() < deadline, "".join(seen)
    else:
        pytest.fail(f"the build ended before {marker!r}:\n{''.join(seen)}")
    _out, rest = proc.communicate(timeout=timeout)
    return proc.returncode, "".join(seen) + rest


@pytest.mark.slow
@pytest.mark.parametrize("signum,marker", [
    (signal.SIGTERM, "[cpu] convert fp32 ..."),
    (signal.SIGINT, "[cpu] convert fp32 ..."),
    (signal.SIGTERM, "load calibration images ..."),
    (signal.SIGTERM, "export SavedModel"),
])
def test_signal_mid_build_leaves_nothing(tmp_path, signum, marker):
    out, tmp = tmp_path / "dist", tmp_path / "tmp"
    tmp.mkdir()
    argv = ["build", "--model", str(DEMO_MODEL), "--target", "cpu", "--variants", "fp32", "--calib", str(CALIB),
            "--calib-count", "12", "--out", str(out)]
    code, err = _signal_at(argv, _env(tmp), marker, signum)
    assert code == 128 + signum, err
    assert "Traceback" not in err, err
    assert "interrupted; nothing half-written was left behind" in err
    assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())
    left = [p.name for p in tmp.iterdir() if p.name != ".ses" and not p.name.startswith("__autograph")]
    assert left == [], left


@pytest.mark.slow
def test_manifest_asking_for_100000_threads_is_refused_not_a_segfault(tmp_path, cpu_bundle):
    bundle = tmp_path / "b"
    shutil.copytree(cpu_bundle, bundle)
    manifest = json.loads((bundle / "edgekit.json").read_text())
    manifest["runtime"]["options"]["num_threads"] = 100000
    (bundle / "edgekit.json").write_text(json.dumps(manifest))
    proc = subprocess.run([*EDGEKIT, "run", str(bundle), "--camera", "synthetic:64x64", "--max-frames", "2",
                           "--quiet"], capture_output=True, text=True, env=_env(tmp_path), cwd=ROOT, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # -11 was the segfault
    assert "num_threads" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_threads_flag_of_100000_is_refused_not_a_segfault(tmp_path, cpu_bundle):
    proc = subprocess.run([*EDGEKIT, "run", str(cpu_bundle), "--camera", "synthetic:64x64", "--max-frames", "2",
                           "--threads", "100000"], capture_output=True, text=True, env=_env(tmp_path), cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "num_threads" in proc.stderr and "Traceback" not in proc.stderr
