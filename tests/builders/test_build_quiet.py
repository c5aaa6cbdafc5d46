"""``edgekit build -q`` writes nothing to stderr (issue 39 item 5): what TensorFlow, absl and oneDNN print
from C++ straight to file descriptor 2 goes to the log instead. A real process, since only a real fd 2
shows native output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "GLOG_minloglevel")}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from edgekit.cli import main; sys.exit(main())", "build",
         "--model", str(ROOT / "models" / "demo.keras"), "--target", "cpu",
         "--variants", "fp32", "--calib", str(ROOT / "calib" / "fashion"), "--calib-count", "8",
         "--out", str(tmp_path), *flags],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )


def test_a_quiet_build_writes_nothing_to_stderr(tmp_path):
    proc = _build(tmp_path, "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "demo-cpu" in proc.stdout  # the summary table still reaches stdout


#: what native code printed past edgekit's own lines in a default build (make demo's): absl before its
#: InitializeLog, TensorFlow's oneDNN note at import, LiteRT's delegate line for each interpreter
NATIVE_LINE = ("I0000 ", "W0000 ", "WARNING: All log messages before absl::InitializeLog()",
               "INFO: Created TensorFlow Lite")


def test_a_default_build_shows_its_progress_and_no_native_library_lines(tmp_path):
    proc = _build(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "verify fp32" in proc.stderr  # the progress is on stderr, as before
    assert [line for line in proc.stderr.splitlines() if line.startswith(NATIVE_LINE)] == []
