"""A fake toolchain (the ``fake_toolchain`` fixture, imported by the conftest.py of tests/toolchain and
tests/runtime): a real venv (no pip) whose interpreter sees numpy and tests/fakes/rknn only.

The job scripts run in it exactly as in an installed toolchain (``venv/bin/python -s SCRIPT.py``,
edgekit's PYTHONPATH dropped); a ``.pth`` file gives it numpy from edgekit's environment and the
fake vendor package, so the protocol is tested on every run without the 5 GB install.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit.toolchain.store import Installed, write_record

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@pytest.fixture(scope="session")
def fake_toolchain(tmp_path_factory) -> Installed:
    """An installed-looking rk3588 toolchain whose ``rknn`` is the fake."""
    root = tmp_path_factory.mktemp("toolchains")
    folder = root / "rk3588"
    folder.mkdir()
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    site = next((folder / "venv" / "lib").glob("python3*/site-packages"))
    numpy_site = Path(np.__file__).resolve().parents[1]
    # only the fake rknn package, not all of tests/fakes (its picamera2 etc. are not the toolchain's)
    fake_only = root / "fake-site"
    fake_only.mkdir()
    (fake_only / "rknn").symlink_to(FAKES / "rknn")
    (site / "edgekit-test.pth").write_text(f"{numpy_site}\n{fake_only}\n")
    installed = Installed(name="rk3588", path=folder, python="3.11", versions={"rknn-toolkit2": "2.5.0-fake"})
    write_record(installed)
    return installed
