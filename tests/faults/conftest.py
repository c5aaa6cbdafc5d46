"""Fixtures of the fault catalogue: a private temp dir per case, one real bundle per session."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.conftest import CALIB, DEMO_MODEL


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch) -> Path:
    """The system temp dir of this case (and of the processes it starts) is its own."""
    tmp = tmp_path / "systmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


@pytest.fixture(scope="session")
def cpu_bundle(tmp_path_factory) -> Path:
    """The demo model built for the cpu target (fp32 only, 20 calibration images): a real bundle."""
    from edgekit.builders.build import build

    out = tmp_path_factory.mktemp("fault-dist")
    (result,) = build(DEMO_MODEL, ["cpu"], [CALIB], out=out, calib_count=20, quiet=True, variants=["fp32"])
    return result.bundle
