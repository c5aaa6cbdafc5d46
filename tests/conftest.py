"""Shared fixtures: the repository's demo model and data, and a session-wide demo build."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Builds time their variants for 1.5 s per target by default; the suite builds some eighty
# targets, and only tests/test_build_speed.py is about those figures (it sets its own budget).
os.environ.setdefault("EDGEKIT_BUILD_TIMING_S", "0.3")

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / "models" / "demo.keras"
CALIB = ROOT / "calib" / "fashion"
FRAMES = ROOT / "calib" / "frames"
EVAL = ROOT / "eval" / "fashion"


REAL_MODELS_ENV = "EDGEKIT_REAL_MODELS"


def real_model_file(name: str) -> Path | None:
    """A published model file found by name under the folder ``$EDGEKIT_REAL_MODELS`` (e.g. the
    unpacked wheels of mediapipe 0.10.14 and rapidocr-onnxruntime, which ship them); None when
    the variable is unset or the file is not there, so the test skips saying so."""
    root = os.environ.get(REAL_MODELS_ENV)
    if not root or not Path(root).is_dir():
        return None
    return next(iter(sorted(Path(root).rglob(name))), None)


@pytest.fixture(scope="session")
def demo_bundles(tmp_path_factory):
    """The demo model built for every target once per test session: {target: TargetBuild}."""
    from edgekit.builders.build import build

    out = tmp_path_factory.mktemp("dist")
    results = build(DEMO_MODEL, ["edgetpu", "rpi", "cpu", "jetson"], [CALIB, FRAMES], out=out, eval_dir=EVAL,
                    quiet=True)
    return {r.target: r for r in results}


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """``model(name)`` -> path of a small .tflite from tests/tflite_models.py, converted once per session."""
    from tests import tflite_models

    directory = tmp_path_factory.mktemp("tflite")
    return lambda name: tflite_models.model_path(name, directory)
