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
from tests.conftest import CALIB, DEMO_MODEL, EVAL, FRAMES, ROOT

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


def test_the_demo_detector_quantises_converts_and_is_gated_on_map(tmp_path):
    """Its Resize and Split are made traceable for MCT; the gate batches (15 images a request) and the
    mAP ratio is what MCT's 8-bit power-of-two activations leave (measured 0.9710: under the default
    0.99, so the build is given 0.97; mAP@.5 keeps 0.6027 of 0.6017)."""
    (result,) = build(ROOT / "models" / "detector.keras", "imx500", [ROOT / "calib" / "detect"], out=tmp_path,
                      eval_dir=ROOT / "eval" / "detect", task="detect", quiet=True, min_map_ratio=0.97)
    assert result.passed, result.error
    ver = result.manifest["verification"]
    assert ver["metric"] == "map" and 0.97 <= ver["ratio"] < 0.99
    facts = result.manifest["models"][0]["imx500"]
    assert facts["gate_run"].startswith("15 images a request") and facts["memory"]["fits"] is True
    assert result.manifest["models"][0]["outputs"][0]["shape"] == [1, 8, 500]  # YOLO [1, 4 + 4 classes, anchors]


TRACE_CHECK = """
import sys
import numpy as np
import onnx
import onnxruntime as ort
import torch
import imx500_build as job

job.stand_in_torchvision()
from onnx2torch import convert

model = convert(onnx.load(sys.argv[1])).eval()
replaced = job.traceable(model)
torch.fx.symbolic_trace(model)  # MCT reads a model this way: onnx2torch's own Resize and Split fail here
x = np.random.default_rng(0).random((3, 4, 5, 6), dtype=np.float32)  # a batch of 3: the gate's requests
want = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
with torch.no_grad():
    got = model(torch.from_numpy(x)).numpy()
print(replaced, got.shape, float(np.abs(got - want).max()))
"""


def test_resize_and_split_are_made_traceable_without_changing_the_outputs(tmp_path):
    """The demo detector's UpSampling2D (Resize, tf_half_pixel_for_nn) and its head's equal Split."""
    import subprocess

    import onnx
    from onnx import TensorProto, helper

    from edgekit.toolchain.child import JOBS_DIR, child_env
    from edgekit.toolchain.store import find_toolchain

    nodes = [helper.make_node("Resize", ["x", "roi", "scales"], ["up"], mode="nearest", nearest_mode="floor",
                              coordinate_transformation_mode="tf_half_pixel_for_nn"),
             helper.make_node("Split", ["up"], ["a", "b"], axis=1),
             helper.make_node("Concat", ["b", "a"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 5, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 10, 12])],
                              [helper.make_tensor("roi", TensorProto.FLOAT, [0], []),
                               helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "t.onnx"))
    (tmp_path / "check.py").write_text(TRACE_CHECK)
    python = find_toolchain("imx500").interpreter
    env = {**child_env(), "PYTHONPATH": str(JOBS_DIR)}
    out = subprocess.run([str(python), "-s", str(tmp_path / "check.py"), str(tmp_path / "t.onnx")], env=env,
                         capture_output=True, text=True, check=False, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("2 (3, 4, 10, 12) ") and float(line.rsplit(" ", 1)[1]) == 0.0, line
