"""Shared fixtures: the repository's demo model and data, a session-wide demo build, and the fake picamera2."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Builds time their variants for 1.5 s per target by default; the suite builds some eighty
# targets, and only tests/builders/gate/test_speed.py is about those figures (it sets its own budget).
os.environ.setdefault("EDGEKIT_BUILD_TIMING_S", "0.3")

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / "models" / "demo.keras"
CALIB = ROOT / "calib" / "fashion"
FRAMES = ROOT / "calib" / "frames"
EVAL = ROOT / "eval" / "fashion"
FAKES = ROOT / "tests" / "fakes"


REAL_MODELS_ENV = "EDGEKIT_REAL_MODELS"


def real_model_file(name: str) -> Path | None:
    """A published model file found by name under the folder ``$EDGEKIT_REAL_MODELS`` (e.g. the
    unpacked wheels of mediapipe 0.10.14 and rapidocr-onnxruntime, which ship them); None when
    the variable is unset or the file is not there, so the test skips saying so."""
    root = os.environ.get(REAL_MODELS_ENV)
    if not root or not Path(root).is_dir():
        return None
    return next(iter(sorted(Path(root).rglob(name))), None)


@pytest.fixture(scope="session", autouse=True)
def _state_outside_home(tmp_path_factory):
    """Daemons keep a per-install node id (edgekit/serve/node.py) and a fleet follower its versions
    (edgekit/fleet/local.py) in ``$STATE_DIRECTORY``, else ``$XDG_STATE_HOME/edgekit``, else
    ``~/.local/state/edgekit``: the suite's go to a folder of this session, never the real home."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("STATE_DIRECTORY", raising=False)
        mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
        yield


def _edgekit_logger_as_a_fresh_process_has_it() -> None:
    logger = logging.getLogger("edgekit")
    logger.setLevel(logging.NOTSET)
    logger.handlers.clear()
    logger.propagate, logger.disabled = True, False


@pytest.fixture(autouse=True)
def _edgekit_logger_reset():
    """Each case starts, and leaves, the ``edgekit`` logger as a fresh process has it. An in-process
    ``main([...])`` sets it up as the command line does (its level from -q/-v, a stderr handler,
    propagate off). Saving and restoring it around each case was not enough: a module-scoped fixture
    that calls ``main`` (tests/builders/test_build_errors.py, tests/builders/gate/test_segment.py)
    runs before a function fixture saves anything, so its state was saved as the one to restore, and
    every later case on that worker lost its caplog records (CI of stop 44: six cases on one worker,
    which cases depended on how -n 2 dealt the files)."""
    _edgekit_logger_as_a_fresh_process_has_it()
    yield
    _edgekit_logger_as_a_fresh_process_has_it()


def pytest_configure(config):
    """Registers the ``fake_picamera2`` marker (the suite runs with --strict-markers) beside the fixture it
    configures, so the two are read and changed together."""
    config.addinivalue_line("markers", "fake_picamera2(numbered=False): options of the fake_picamera2 fixture")


def _picamera2_options(numbered: bool = False) -> bool:
    # the marker's options, by a signature: a misspelt one fails the case instead of going unused
    return numbered


@pytest.fixture
def fake_picamera2(request, monkeypatch):
    """The fake ``picamera2`` (tests/fakes/picamera2) imported afresh with its knobs at their defaults,
    and dropped from ``sys.modules`` after the case: its knobs, call log and cameras are module state,
    so a fresh import and a reset on both sides keep one case's from reaching the next.

    A module or case marked ``@pytest.mark.fake_picamera2(numbered=True)`` gets the fake with each frame
    numbered: ``STAMP`` writes the frame's number into its top-left pixel and frame ``n``'s outputs make
    class ``n % 10`` win, so a test can tell which frame an image and an output belong to."""
    import numpy as np

    marker = request.node.get_closest_marker("fake_picamera2")
    numbered = _picamera2_options(*marker.args, **marker.kwargs) if marker else False
    monkeypatch.syspath_prepend(str(FAKES))
    for name in ("picamera2", "picamera2.devices"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import picamera2

    picamera2.reset()
    if numbered:
        picamera2.STAMP = True
        picamera2.IMX500_OUTPUTS = lambda n: [np.eye(10, dtype=np.float32)[n % 10]]  # class n % 10 wins
    yield picamera2
    picamera2.reset()
    for name in ("picamera2", "picamera2.devices"):
        sys.modules.pop(name, None)


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
    from tests.helpers import tflite_models

    directory = tmp_path_factory.mktemp("tflite")
    return lambda name: tflite_models.model_path(name, directory)


def _is_fault_case(request) -> bool:
    # the fault catalogue: test_faults_*.py beside each area, test_bundle_faults*.py, and tests/faults/ (the
    # catalogues that cross every area: a full disk, fuzzed loaders)
    return "faults" in request.node.path.stem or request.node.path.parent.name == "faults"


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """The system temp dir of this case (and of the processes it starts) is its own."""
    tmp = tmp_path / "systmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


@pytest.fixture(autouse=True)
def _fault_cases_get_a_private_tmp(request):
    """Every case of the fault catalogue runs with its own system temp dir, so what it leaves behind is found."""
    if _is_fault_case(request):
        request.getfixturevalue("private_tmp")


@pytest.fixture(scope="session")
def cpu_bundle(tmp_path_factory) -> Path:
    """The demo model built for the cpu target (fp32 only, 20 calibration images): a real bundle."""
    from edgekit.builders.build import build

    out = tmp_path_factory.mktemp("fault-dist")
    (result,) = build(DEMO_MODEL, ["cpu"], [CALIB], out=out, calib_count=20, quiet=True, variants=["fp32"])
    return result.bundle
