"""``edgekit build --target rk3588`` with a fake RKNN-Toolkit2 (tests/fakes/rknn) in a real venv.

The build, the child session, its pipe protocol and the job script are real; the toolkit is the
fake, whose 'model' answers (mean, 1 - mean) for any input. The source here is an ONNX model
that computes exactly that, so the simulator agrees with the original and the gate passes;
``FAKE_RKNN_SWAP`` makes the fake swap the two scores (a quantisation that broke the model) and
the gate fail. The real toolkit's build is tests/toolchain/test_rknn_build_real.py (marked).
"""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from edgekit.builders.build import build
from edgekit.builders.rknn import layer_table
from edgekit.bundle import load_bundle
from edgekit.cli import main
from edgekit.errors import ModelError, TargetError, VerificationFailed
from tests.helpers.toolchains import fake_toolchain  # noqa: F401 - a fixture

onnx = pytest.importorskip("onnx")
SIZE = 16


def mean_model(path, nhwc: bool = False):
    """An ONNX classifier of one gray input whose scores are (mean, 1 - mean): the fake toolkit's answer."""
    from onnx import TensorProto, helper

    shape = [1, SIZE, SIZE, 1] if nhwc else [1, 1, SIZE, SIZE]
    nodes = [helper.make_node("ReduceMean", ["x"], ["m4"], axes=[1, 2, 3], keepdims=1),
             helper.make_node("Reshape", ["m4", "shape"], ["m"]),
             helper.make_node("Sub", ["one", "m"], ["rest"]),
             helper.make_node("Concat", ["m", "rest"], ["scores"], axis=1)]
    graph = helper.make_graph(
        nodes, "mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [1, 1]),
         helper.make_tensor("one", TensorProto.FLOAT, [1, 1], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def data(tmp_path):
    """calib/ (mixed brightness), eval/bright and eval/dark (class 0 scores the mean, class 1 the rest)."""
    rng = np.random.default_rng(0)
    for folder, low, high, n in (("calib/a", 0, 255, 24), ("eval/bright", 170, 255, 6), ("eval/dark", 0, 80, 6)):
        (tmp_path / folder).mkdir(parents=True)
        for i in range(n):
            cv2.imwrite(str(tmp_path / folder / f"{i}.png"), rng.integers(low, high, (SIZE, SIZE), dtype=np.uint8))
    return tmp_path


@pytest.fixture
def toolchains(fake_toolchain, monkeypatch):  # noqa: F811
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(fake_toolchain.path.parent))
    return fake_toolchain


def rk_build(model, data, **settings):
    return build(model, "rk3588", [data / "calib"], out=data / "dist", eval_dir=data / "eval", quiet=True,
                 preprocess={"colour": "gray", "mean": [0.0], "std": [255.0]}, **settings)


def calls_in(log_text: str) -> list[str]:
    """The fake toolkit's calls, in order, from the log the bundle keeps."""
    return [json.loads(line.split("FAKE RKNN CALL ", 1)[1])[0] for line in log_text.splitlines()
            if "FAKE RKNN CALL " in line]


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
def test_the_recipe_builds_exports_and_gates_in_the_simulator(toolchains, data, nhwc):
    model = mean_model(data / "tiny.onnx", nhwc)
    (result,) = rk_build(model, data)
    assert result.passed and result.bundle == data / "dist" / "tiny-rk3588"
    bundle = load_bundle(result.bundle)
    entry = bundle.manifest["models"][0]
    assert (entry["file"], entry["format"], entry["precision"]) == ("tiny.rknn", "rknn", "int8")
    assert (result.bundle / "tiny.rknn").read_bytes() == b"RKNN fake model"
    # the toolkit's steps in order, in one child: the build, export_rknn, then the simulator
    calls = calls_in((result.bundle / "tiny.rknn.log").read_text())
    assert calls == ["config", "load_onnx", "build", "export_rknn", "init_runtime", "release"]
    # the gate: every eval and held-back image through the simulator, the figures of BuildContext.verify
    ev = bundle.manifest["verification"]["models"]["int8"]["eval"]
    assert ev["n"] == 12 and ev["ratio"] == 1.0 and ev["passed"] and ev["cosine"] > 0.9999
    # the input the .rknn takes (NCHW, whatever the source's layout) and the sidecar rknn-sim rebuilds from
    assert entry["input"]["layout"] == "NCHW" and entry["input"]["shape"] == [1, 1, SIZE, SIZE]
    sidecar = json.loads((result.bundle / "tiny.rknn.sim.json").read_text())
    assert sidecar["input_shape"] == [1, 1, SIZE, SIZE] and sidecar["onnx"] == "tiny.onnx"
    assert np.load(result.bundle / sidecar["calib"])["calib"].shape[1:] == (1, SIZE, SIZE)
    # the ops the NPU cannot run, from the toolkit's layer table, in the manifest and the log
    npu = entry["rknn"]["npu"]
    assert (npu["ops"], npu["npu_ops"]) == (3, 1) and [c["name"] for c in npu["cpu_ops"]] == ["TopK:topk_1",
                                                                                                "Reshape:scores-rs"]
    build_log = (result.bundle / "build.log").read_text()
    assert "the NPU cannot run TopK:topk_1" in build_log and "Reshape:scores-rs" not in build_log.split(
        "cannot run", 1)[1].splitlines()[0]
    assert entry["rknn"]["on_device"] and "accuracy_analysis" not in bundle.manifest["verification"]["models"]["int8"]


def test_the_bundle_runs_in_rknn_sim_and_inspect_shows_gate_and_board_steps(toolchains, data, capsys):
    (result,) = rk_build(mean_model(data / "tiny.onnx"), data)
    capsys.readouterr()
    assert main(["run", str(result.bundle), "--backend", "rknn-sim", "--camera", f"folder:{data / 'eval' / 'dark'}",
                 "--max-frames", "2"]) == 0
    assert "SIMULATION" in capsys.readouterr().out
    assert main(["inspect", str(result.bundle)]) == 0
    out = capsys.readouterr().out
    assert "ops on the NPU (the toolkit's layer table): 1/3" in out and "ratio 1.0" in out and ": PASS" in out
    assert "still to do on the board: pip install rknn-toolkit-lite2" in out and "not proven here" in out


def test_a_gate_miss_is_rejected_naming_accuracy_analysis_worst_layers(toolchains, data, monkeypatch):
    monkeypatch.setenv("FAKE_RKNN_SWAP", "1")
    with pytest.raises(VerificationFailed):
        rk_build(mean_model(data / "tiny.onnx"), data)
    rejected = data / "dist" / "tiny-rk3588.rejected"
    manifest = json.loads((rejected / "edgekit.json").read_text())
    int8 = manifest["verification"]["models"]["int8"]
    assert int8["eval"]["passed"] is False and int8["eval"]["ratio"] == 0.0
    assert int8["accuracy_analysis"]["worst_layers"][0]["layer"] == "conv_2"
    assert "accuracy_analysis" in calls_in((rejected / "tiny.rknn.log").read_text())
    line = next(ln for ln in (rejected / "build.log").read_text().splitlines() if "worst layers by cosine" in ln)
    assert "WARNING" in line and "Conv conv_2 cosine 0.9123 (alone 0.9500)" in line


def test_a_failed_toolkit_step_is_one_line_and_its_log_is_kept(toolchains, data, monkeypatch):
    monkeypatch.setenv("FAKE_RKNN_FAIL", "build")
    with pytest.raises(ModelError, match=r"rk3588 rknn_sim: StepFailed: build returned -1") as info:
        rk_build(mean_model(data / "tiny.onnx"), data)
    assert "\n" not in str(info.value)
    kept = data / "dist" / "tiny-rk3588.rknn.failed.log"
    assert kept.is_file() and info.value.hint == f"the toolkit's log is kept in {kept}"


def test_without_the_toolchain_the_build_is_refused_before_the_model_loads(data, monkeypatch, capsys):
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(data / "none"))
    with pytest.raises(TargetError, match="cannot build rk3588 here: the rk3588 toolchain is not installed "
                                          r"\(edgekit toolchain install rk3588\)"):
        rk_build(data / "missing.onnx", data)
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "build: the rk3588 toolchain is not installed (edgekit toolchain install rk3588)" in out


def test_the_layer_table_of_a_real_verbose_build_is_read():
    log = "\n".join([
        "D RKNN: [02:29:34.525]                 Network Layer Information Table",
        "D RKNN: [02:29:34.525] " + "-" * 40,
        "D RKNN: [02:29:34.525] ID   OpType             DataType Target InputShape      OutputShape   "
        "Cycles(DDR/NPU/Total)    RW(KB)       FullName        ",
        "D RKNN: [02:29:34.525] " + "-" * 40,
        "D RKNN: [02:29:34.525] 0    InputOperator      INT8     CPU    \\               (1,3,160,160) "
        "0/0/0                    0            InputOperator:images",
        "D RKNN: [02:29:34.525] 1    ConvRelu           INT8     NPU    (1,3,160,160),(16,3,3,3),(16)   "
        "(1,16,80,80)           7685/57600/57600         77           Conv:Conv__86   ",
        "D RKNN: [02:29:34.525] 23   Reshape            INT8     CPU    (1,8,10,10),(4)  (1,8,5,20)     "
        "0/0/0                    1            Reshape:detector_1/concat_1:0-rs",
        "D RKNN: [02:29:34.525] " + "-" * 40,
        "D RKNN: [02:29:34.531] 1   ConvRelu           images   INT8      NC1HWC2      (1,3,160,160)",
    ])
    rows = layer_table(log)
    assert [(r["id"], r["op"], r["target"], r["name"]) for r in rows] == [
        (0, "InputOperator", "CPU", "InputOperator:images"), (1, "ConvRelu", "NPU", "Conv:Conv__86"),
        (23, "Reshape", "CPU", "Reshape:detector_1/concat_1:0-rs")]
