"""The wheel holds edgekit only (no top-level ``robot``: Robot Framework's import name) plus its data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_has_edgekit_only(tmp_path):
    # Build from a copy so the checkout gains no build/ or egg-info litter; no build isolation: offline.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "dist", "build", "*.egg-info",
                                                               "__pycache__", ".pytest_cache", ".ruff_cache"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           str(src), "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "wheel").glob("edgekit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"edgekit", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    for member in ("edgekit/cli.py", "edgekit/commands/run.py", "edgekit/serve/daemon.py", "edgekit/targets/cpu.toml",
                   "edgekit/camera/__init__.py", "edgekit/tflite/edgetpu_rules.py"):
        assert member in names
