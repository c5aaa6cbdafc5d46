"""Shared fixtures: the repository's demo model and data, and a session-wide demo build."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / "models" / "demo.keras"
CALIB = ROOT / "calib" / "fashion"
FRAMES = ROOT / "calib" / "frames"
EVAL = ROOT / "eval" / "fashion"


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
