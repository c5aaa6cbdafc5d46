"""``edgekit build --target imx500`` with Sony's real PyTorch stack, where ``edgekit toolchain install imx500`` has run.

Marked ``toolchain`` and ``slow`` and skipped with the reason when the toolchain is absent (a
1.8 GB install that CI does not have); tests/builders/test_imx500_build.py runs the same recipe
against a fake stack on every run. Here: the demo classifier, its top-1 gate on MCT's quantised
model on the CPU, then imxconv-pt's packerOut.zip and memory report.
"""

from __future__ import annotations

import json

import pytest

from edgekit.builders.build import build
from edgekit.toolchain.store import has_toolchain
from tests.conftest import CALIB, DEMO_MODEL, EVAL, FRAMES

INSTALLED, WHY = has_toolchain("imx500")
pytestmark = [pytest.mark.toolchain, pytest.mark.slow,
              pytest.mark.skipif(not INSTALLED, reason=f"imx500 toolchain absent: {WHY}")]


def test_the_demo_classifier_builds_for_imx500_passes_its_gate_and_fits_the_chip(tmp_path):
    (result,) = build(DEMO_MODEL, "imx500", [CALIB, FRAMES], out=tmp_path, eval_dir=EVAL, quiet=True)
    assert result.passed, result.error
    ver = result.manifest["verification"]
    assert ver["metric"] == "top1" and ver["ratio"] >= 0.99 and ver["agreement"] >= 0.98  # measured: 0.9981, 0.9945
    facts = result.manifest["models"][0]["imx500"]
    assert facts["toolchain"]["model-compression-toolkit"] == "2.5.1" and facts["tpc"] == "imx500/v1"
    assert facts["memory"]["fits"] is True and facts["memory"]["usage_bytes"] < 1024**2  # measured: 234.16KB of 8.00MB
    assert (result.bundle / "packerOut.zip").stat().st_size > 50_000
    report = json.loads((result.bundle / "imx500_memory_report.json").read_text())
    assert report["Memory Report"]["Fit In Chip"] is True
