"""The child-process protocol, run for real against a fake toolchain (fake ``rknn``, real venv).

The job scripts in edgekit/toolchain/jobs/ run in the fake toolchain's interpreter exactly as in
an installed one; only the vendor package is fake (tests/fakes/rknn checks the calls).
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from edgekit.errors import ModelError
from edgekit.toolchain.child import ToolchainJobError, child_argv, child_env, run_job
from edgekit.toolchain.session import ChildSession

CALIB = np.random.default_rng(0).random((6, 1, 8, 8), dtype=np.float32)  # NCHW, as the ONNX takes it
EVAL = np.random.default_rng(1).random((4, 1, 8, 8), dtype=np.float32)


@pytest.fixture
def onnx_file(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"not read by the fake")
    return path


def build_job(onnx_file) -> dict:
    return {"onnx": str(onnx_file), "platform": "rk3588", "channels": 1, "analyse": 2,
            "disable_rules": ["fuse_pad_into_conv"]}


def test_a_build_job_runs_every_step_in_order_and_returns_the_simulators_outputs(fake_toolchain, onnx_file, tmp_path):
    work = tmp_path / "job"
    done = run_job(fake_toolchain, "rknn_build", build_job(onnx_file), work, {"calib": CALIB, "eval": EVAL})
    calls = json.loads((work / "calls.json").read_text())
    assert [c[0] for c in calls] == ["config", "load_onnx", "build", "export_rknn", "init_runtime",
                                     "accuracy_analysis", "release"]
    assert calls[0][1:] == ["rk3588", [[0.0]], [[1.0]], ["fuse_pad_into_conv"]]
    assert calls[2][1:] == [6, [1, 1, 8, 8]]  # six calibration files, each one tensor in the model's layout
    assert (work / "model.rknn").read_bytes() == b"RKNN fake model"
    out = done.arrays["out_0"]
    assert out.shape == (4, 2) and np.allclose(out[:, 0], EVAL.reshape(4, -1).mean(axis=1))
    worst = done.result["worst_layers"]
    assert worst[0]["layer"] == "conv_2" and worst[0]["cosine"] == pytest.approx(0.91234)
    assert done.result["toolkit"] == "2.5.0-fake" and done.log.is_file()


@pytest.mark.parametrize("step", ["load_onnx", "build", "export_rknn", "init_runtime"])
def test_a_failed_step_is_one_line_naming_it(fake_toolchain, onnx_file, tmp_path, monkeypatch, step):
    monkeypatch.setenv("FAKE_RKNN_FAIL", step)
    with pytest.raises(ModelError, match=f"rk3588: .*{step}.* returned -1") as info:
        run_job(fake_toolchain, "rknn_build", build_job(onnx_file), tmp_path / "job", {"calib": CALIB})
    assert "\n" not in str(info.value)


def test_a_child_that_dies_without_a_result_says_so_with_its_last_line(fake_toolchain, onnx_file, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("FAKE_RKNN_FAIL", "crash")
    with pytest.raises(ToolchainJobError, match="exited 139 without a result: Segmentation fault"):
        run_job(fake_toolchain, "rknn_build", build_job(onnx_file), tmp_path / "job", {"calib": CALIB})


def test_the_child_never_sees_edgekits_pythonpath_and_runs_with_an_argument_list(fake_toolchain, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/edgekit")
    assert "PYTHONPATH" not in child_env()
    argv = child_argv(fake_toolchain, "rknn_build", "job.json")
    assert argv[0] == str(fake_toolchain.interpreter) and argv[1] == "-s" and argv[2].endswith("jobs/rknn_build.py")


def test_the_toolchain_interpreter_cannot_import_edgekit_s_vendor_free_parent_packages(fake_toolchain):
    # the job scripts import only their siblings: a script that needed edgekit would fail here
    code = "import sys; sys.path.insert(0, sys.argv[1]); import jobwire, rknn_build, rknn_sim; print('ok')"
    from edgekit.toolchain.child import JOBS_DIR

    out = subprocess.run([str(fake_toolchain.interpreter), "-s", "-c", code, str(JOBS_DIR)], capture_output=True,
                         text=True, env=child_env(), check=False)
    assert out.stdout.strip() == "ok", out.stderr


def test_a_session_answers_many_requests_over_its_pipes_and_closes(fake_toolchain, onnx_file, tmp_path):
    np.save(tmp_path / "calib.npy", CALIB)
    job = {**build_job(onnx_file), "calib": str(tmp_path / "calib.npy")}
    with ChildSession(fake_toolchain, "rknn_sim", job, tmp_path / "sim", start_timeout=120) as session:
        assert session.ready["op"] == "ready"
        for x in EVAL:
            _, outs = session.request({"op": "infer"}, [x[None].transpose(0, 2, 3, 1)])
            assert outs[0][0, 0] == pytest.approx(float(x.mean()))
        with pytest.raises(ModelError, match="AttributeError|IndexError"):  # a bad request: an error answer
            session.request({"op": "infer"}, [])
        _, outs = session.request({"op": "infer"}, [EVAL[0][None].transpose(0, 2, 3, 1)])  # still up
        proc = session._proc
    assert proc.wait(timeout=10) == 0


def test_a_session_whose_build_fails_says_why(fake_toolchain, onnx_file, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_RKNN_FAIL", "build")
    np.save(tmp_path / "calib.npy", CALIB)
    job = {**build_job(onnx_file), "calib": str(tmp_path / "calib.npy")}
    with pytest.raises(ModelError, match="build returned -1"):
        ChildSession(fake_toolchain, "rknn_sim", job, tmp_path / "sim", start_timeout=120)
