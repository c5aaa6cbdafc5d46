"""The wheel holds edgekit only (no top-level ``robot``: Robot Framework's import name) plus its data:
the targets, the deploy files (``edgekit deploy`` writes them out) and the LICENSE."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


def test_import_edgekit_loads_no_opencv():
    # OpenCV is an extra (about 150 MB); `python -X importtime -c "import edgekit"` must not list cv2.
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import edgekit"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    modules = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "edgekit" in modules
    assert not modules & {"cv2", "PIL", "tensorflow", "matplotlib"}


LEAN = """
import sys
sys.modules["cv2"] = None  # a device install without OpenCV (and without Pillow)
sys.modules["PIL"] = None
from edgekit.cli import main
code = main(sys.argv[1:])
assert "cv2" not in sys.modules or sys.modules["cv2"] is None
sys.exit(code)
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tests.helpers import tflite_models
    from tests.runtime.test_adapters import write_bundle

    return write_bundle(tmp_path_factory.mktemp("lean") / "demo-cpu", {"fp32": tflite_models.model_path("small_float")})


def test_run_on_synthetic_frames_without_opencv(bundle):
    done = subprocess.run([sys.executable, "-c", LEAN, "run", str(bundle), "--camera", "synthetic", "--max-frames", "3",
                           "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 5  # header, 3 frames, summary
    assert "XNNPACK delegate" not in done.stderr  # LiteRT's banner goes to the DEBUG log


def test_opencv_sources_name_the_extra_when_it_is_missing(bundle, tmp_path):
    (tmp_path / "clip.mp4").write_bytes(b"\0" * 64)
    (tmp_path / "frames").mkdir()
    (tmp_path / "frames" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    for uri, needs in ((f"file:{tmp_path / 'clip.mp4'}", "[opencv]"), ("v4l2:0", "[opencv]"),
                       (f"folder:{tmp_path / 'frames'}", "[images]")):
        done = subprocess.run([sys.executable, "-c", LEAN, "run", str(bundle), "--camera", uri], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert f"pip install 'edgekit-vision{needs}'" in done.stderr, done.stderr
        if uri.startswith("folder:"):  # refused when the source opens, not at its first image
            assert f"{uri} needs Pillow or OpenCV" in done.stderr, done.stderr
