"""``--backend rknn-sim``: a bundle's .rknn opened through the simulator session of a (fake) rk3588 toolchain.

The child process, its pipe protocol and the job script are real; the toolkit is tests/fakes/rknn,
whose 'model' answers (mean, 1 - mean). The real toolkit's run is in tests/toolchain (marked).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.bundle import BundleWriter
from edgekit.errors import BundleError, TargetError
from edgekit.imaging.image import InputSpec
from edgekit.runtime import describe_runtime, open_runtime
from tests.helpers.toolchains import fake_toolchain  # noqa: F401, F811 - a fixture

SPEC = InputSpec(shape=(1, 1, 8, 8), layout="NCHW", colour="gray")


def rk_bundle(dest, sidecar: dict | None = None):
    with BundleWriter(dest) as w:
        (w.dir / "m.rknn").write_bytes(b"RKNN fake")
        (w.dir / "m.onnx").write_bytes(b"onnx")
        np.save(w.dir / "calib.npy", np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32))
        (w.dir / "m.rknn.sim.json").write_text(json.dumps(sidecar or {"onnx": "m.onnx", "calib": "calib.npy",
                                                                      "platform": "rk3588", "channels": 1}))
        return w.commit({"target": "rk3588", "default_model": "int8", "task": "raw",
                         "runtime": {"adapter": "edgekit.runtime.rknn_lite:RknnLiteRuntime", "options": {}},
                         "models": [{"name": "int8", "file": "m.rknn", "format": "rknn", "precision": "int8",
                                     "input": SPEC.to_dict(), "outputs": [{"name": "scores"}]}]})


def test_a_bundle_runs_in_the_simulator_and_says_it_is_a_simulation(fake_toolchain, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(fake_toolchain.path.parent))
    bundle = rk_bundle(tmp_path / "b")
    x = np.random.default_rng(1).random(SPEC.shape, dtype=np.float32)
    with open_runtime(bundle, backend="rknn-sim") as rt:
        out = rt.infer(x)
        info = rt.describe()
        assert rt.output_details() == [{"name": "output0", "shape": [1, 2]}]
    assert out[0][0, 0] == pytest.approx(float(x.mean()))
    assert info["simulation"] is True and "SIMULATION" in describe_runtime(info)


def test_without_the_toolchain_it_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(tmp_path / "none"))
    with pytest.raises(TargetError, match="rk3588 toolchain is not installed") as info:
        open_runtime(rk_bundle(tmp_path / "b"), backend="rknn-sim")
    assert info.value.hint == "edgekit toolchain install rk3588"


def test_a_sidecar_pointing_out_of_the_bundle_is_refused(tmp_path):
    bundle = rk_bundle(tmp_path / "b", {"onnx": "../../etc/passwd", "calib": "calib.npy", "channels": 1})
    with pytest.raises(BundleError, match="not a file of the bundle"):
        open_runtime(bundle, backend="rknn-sim")
