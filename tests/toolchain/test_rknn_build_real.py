"""``edgekit build --target rk3588`` with the real RKNN-Toolkit2, where ``edgekit toolchain install rk3588`` has run.

Marked ``toolchain`` and skipped with the reason when the toolchain is absent (a 5.9 GB install,
which CI does not have), so ``make test`` stays fast there; tests/builders/test_rknn.py runs the
same recipe against a fake toolkit on every run. Here: the demo classifier (top-1 gate in the
simulator, then ``--backend rknn-sim``) and the demo detector (mAP gate in the simulator).
"""

from __future__ import annotations

import pytest

from edgekit.builders.build import build
from edgekit.cli import main
from edgekit.toolchain.store import has_toolchain
from tests.conftest import CALIB, DEMO_MODEL, EVAL, FRAMES, ROOT

INSTALLED, WHY = has_toolchain("rk3588")
pytestmark = [pytest.mark.toolchain, pytest.mark.slow,
              pytest.mark.skipif(not INSTALLED, reason=f"rk3588 toolchain absent: {WHY}")]


def test_the_demo_classifier_builds_for_rk3588_passes_its_gate_and_runs_in_the_simulator(tmp_path, capsys):
    (result,) = build(DEMO_MODEL, "rk3588", [CALIB, FRAMES], out=tmp_path, eval_dir=EVAL, quiet=True)
    assert result.passed, result.error
    ver = result.manifest["verification"]
    assert ver["metric"] == "top1" and ver["ratio"] >= 0.99 and ver["agreement"] >= 0.98  # measured: 0.9961, 0.9945
    rknn = result.manifest["models"][0]["rknn"]
    assert rknn["toolkit"] == "2.5.0" and rknn["npu"]["ops"] and rknn["npu"]["npu_ops"] >= rknn["npu"]["ops"] - 1
    assert (result.bundle / "demo.rknn").stat().st_size > 100_000
    capsys.readouterr()
    assert main(["run", str(result.bundle), "--backend", "rknn-sim", "--camera", f"folder:{EVAL / 'bag'}",
                 "--max-frames", "3"]) == 0
    out = capsys.readouterr().out
    assert "SIMULATION" in out and out.count(" bag ") == 3


def test_the_demo_detector_builds_for_rk3588_with_an_map_gate_from_the_simulator(tmp_path):
    (result,) = build(ROOT / "models" / "detector.keras", "rk3588", [ROOT / "calib" / "detect"], out=tmp_path,
                      eval_dir=ROOT / "eval" / "detect", task="detect", quiet=True)
    assert result.passed, result.error
    ver = result.manifest["verification"]
    assert ver["metric"] == "map" and ver["ratio"] >= 0.98  # measured: 0.9995 (mAP@[.5:.95] 0.3836 vs 0.3838)
    cpu = [c["op"] for c in result.manifest["models"][0]["rknn"]["npu"]["cpu_ops"]]
    assert set(cpu) <= {"Reshape"}  # the NCHW Transpose edgekit puts in front is fused, not left on the CPU
