"""The real RKNN-Toolkit2 on the demo detector, where ``edgekit toolchain install rk3588`` has run.

Marked ``toolchain`` and skipped with the reason when the toolchain is absent (a 5.9 GB install),
so ``make test`` stays fast; the protocol itself is tested on every run with a fake (test_child.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgekit.imaging.image import InputSpec, Preprocessor, read_image
from edgekit.toolchain.child import run_job
from edgekit.toolchain.store import find_toolchain, has_toolchain

ROOT = Path(__file__).resolve().parents[2]
INSTALLED, WHY = has_toolchain("rk3588")
pytestmark = [pytest.mark.toolchain, pytest.mark.slow,
              pytest.mark.skipif(not INSTALLED, reason=f"rk3588 toolchain absent: {WHY}")]
SPEC = InputSpec(shape=(1, 3, 160, 160), layout="NCHW", colour="rgb", resize="letterbox", std=(255.0,))


def tensors(folder: str, count: int) -> np.ndarray:
    pre = Preprocessor(SPEC)
    return np.concatenate([pre(read_image(p)) for p in sorted((ROOT / folder).glob("*.jpg"))[:count]])


def test_the_detector_builds_for_rk3588_and_the_simulator_agrees_with_onnx_runtime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = ROOT / "models" / "detector.onnx"
    job = {"onnx": str(onnx), "platform": "rk3588", "channels": 3, "analyse": 1, "input": "images",
           "input_shape": [1, 3, 160, 160]}
    ev = tensors("eval/detect", 4)
    done = run_job(find_toolchain("rk3588"), "rknn_build", job, tmp_path, {"calib": tensors("calib/detect", 16),
                                                                         "eval": ev}, timeout=1200)
    assert (tmp_path / "model.rknn").stat().st_size > 10_000
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    ref = np.concatenate([session.run(None, {"images": x[None]})[0] for x in ev])
    sim = done.arrays["out_0"].reshape(ref.shape)
    cosine = float((ref * sim).sum() / np.linalg.norm(ref) / np.linalg.norm(sim))
    assert cosine > 0.999, cosine
    worst = done.result["worst_layers"]
    assert worst and all(0 < w["cosine"] <= 1 for w in worst), json.dumps(worst)
