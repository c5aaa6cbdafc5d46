"""``edgekit build -q`` writes nothing to stderr (issue 39 item 5): what TensorFlow, absl and oneDNN print
from C++ straight to file descriptor 2 goes to the log instead. A real process, since only a real fd 2
shows native output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_quiet_build_writes_nothing_to_stderr(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "GLOG_minloglevel")}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from edgekit.cli import main; sys.exit(main())", "build",
         "--model", str(ROOT / "models" / "demo.keras"), "--target", "cpu",
         "--variants", "fp32", "--calib", str(ROOT / "calib" / "fashion"), "--calib-count", "8",
         "--out", str(tmp_path), "-q"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "demo-cpu" in proc.stdout  # the summary table still reaches stdout
