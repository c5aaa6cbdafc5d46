"""The wheel holds edgekit only (no top-level ``robot``: Robot Framework's import name) plus its data:
the targets, the deploy files (``edgekit deploy`` writes them out) and the LICENSE."""

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
    (wheel,) = (tmp_path / "wheel").glob("edgekit_vision-*.whl")  # the distribution name (import name: edgekit)
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    tops = {n.split("/")[0] for n in names}
    assert tops == {"edgekit", dist_info}
    for member in ("edgekit/cli.py", "edgekit/commands/run.py", "edgekit/serve/daemon.py", "edgekit/targets/cpu.toml",
                   "edgekit/camera/__init__.py", "edgekit/tflite/edgetpu_rules.py", "edgekit/deploy/serve.example.toml",
                   "edgekit/deploy/edgekit.service", "edgekit/deploy/prometheus.yml", "edgekit/deploy/alerts.yml",
                   f"{dist_info}/licenses/LICENSE"):
        assert member in names
    assert archive.read(f"{dist_info}/licenses/LICENSE").startswith(b"\n" + b" " * 33 + b"Apache License")
    metadata = archive.read(f"{dist_info}/METADATA").decode()
    assert "Name: edgekit-vision" in metadata and "License-Expression: Apache-2.0" in metadata
    # OpenCV is an extra: the device install pulls numpy only.
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not any("opencv" in line for line in requires), requires
    assert "console_scripts" in archive.read(f"{dist_info}/entry_points.txt").decode()
