"""ONNX in, every target out; a two-output model through every target (real onnx2tf, TF converter, LiteRT, ORT).

The ONNX model is the demo classifier exported with tf2onnx as a PyTorch user would hand it
over (NCHW, symbolic batch); the two-output model is the demo trunk with a class head and a
regression head (``scripts/bundled_models.py``). Both are made from ``models/demo.keras``
here, so they never go stale.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgekit.bundle import load_bundle
from edgekit.imaging.image import Preprocessor, read_image
from edgekit.runtime import open_runtime
from tests.conftest import CALIB, DEMO_MODEL, EVAL, FRAMES

TARGETS = ["edgetpu", "rpi", "cpu", "jetson"]
pytestmark = pytest.mark.slow
# the two-output model's class head has one score per demo label (it is made from demo.keras)
N_CLASSES = len(DEMO_MODEL.with_suffix(".labels.txt").read_text().split())


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The bundled second models, made from models/demo.keras: {"onnx": path, "two_head": path}."""
    from scripts.bundled_models import export_onnx, make_two_head

    d = tmp_path_factory.mktemp("models")
    return {"onnx": export_onnx(out=d / "demo.onnx"), "two_head": make_two_head(out=d / "two_head.keras"),
            "dynamic": export_onnx(out=d / "demo_dyn.onnx", dynamic_hw=True)}


@pytest.fixture(scope="module")
def onnx_bundles(made, tmp_path_factory):
    """demo.onnx built for every target: {target: TargetBuild}."""
    from edgekit.builders.build import build

    out = tmp_path_factory.mktemp("dist-onnx")
    return {r.target: r for r in build(made["onnx"], TARGETS, [CALIB, FRAMES], out=out, eval_dir=EVAL, quiet=True)}


@pytest.fixture(scope="module")
def two_head_bundles(made, tmp_path_factory):
    """two_head.keras built for every target: {target: TargetBuild}."""
    from edgekit.builders.build import build

    out = tmp_path_factory.mktemp("dist-two")
    return {r.target: r for r in build(made["two_head"], TARGETS, [CALIB, FRAMES], out=out, eval_dir=EVAL,
                                       quiet=True)}


def test_onnx_builds_for_every_target_through_the_accuracy_gate(onnx_bundles):
    assert set(onnx_bundles) == set(TARGETS)
    for target, r in onnx_bundles.items():
        m = load_bundle(r.bundle).manifest
        v = m["verification"]
        assert r.passed and v["metric"] == "top1" and v["ratio"] >= 0.99 and v["original"] >= 0.88, (target, v)
        assert m["task"] == "classify"
        assert m["source"]["format"] == "onnx" and m["source"]["layout"] == "NCHW"
        assert m["source"]["input_shape"][1:] == [1, 32, 32] and isinstance(m["source"]["input_shape"][0], str)
        for model in m["models"]:
            assert v["models"][model["name"]]["eval"]["outputs"]["scores"]["cosine"] >= 0.99


def test_onnx_route_bundles_take_camera_layout_and_edgetpu_int8(onnx_bundles):
    for target in ("edgetpu", "rpi", "cpu"):
        for model in load_bundle(onnx_bundles[target].bundle).models:
            assert model.input.layout == "NHWC" and list(model.input.shape) == [1, 32, 32, 1], (target, model)
            assert model.input.colour == "gray" and model.input.crop == (200, 200)
    [int8] = load_bundle(onnx_bundles["edgetpu"].bundle).models
    assert int8.precision == "int8" and int8.input.dtype == "uint8" and int8.outputs[0]["dtype"] == "uint8"
    jetson = load_bundle(onnx_bundles["jetson"].bundle).model("fp32")
    assert jetson.input.layout == "NCHW" and list(jetson.input.shape) == [1, 1, 32, 32]  # static batch for TensorRT


def test_onnx_conversion_log_goes_to_build_log_with_our_sample_data(onnx_bundles):
    log = (onnx_bundles["cpu"].bundle / "build.log").read_text()
    assert "onnx2tf| " in log  # the converter's own lines, in the bundle's log
    assert "calibration_image_sample_data_20x128x128x3_float32.npy" in log and "network blocked" in log


def test_onnx_int8_classifies_eval_images_on_the_device_runtime(onnx_bundles):
    path = onnx_bundles["cpu"].bundle
    with open_runtime(path, model="int8") as rt:
        prep = Preprocessor(rt.input_spec)
        labels = load_bundle(path).labels
        files = [(c, f) for c in ("trouser", "bag", "sneaker") for f in sorted((EVAL / c).glob("*.png"))[:10]]
        hits = sum(labels[int(np.argmax(rt.infer(prep(read_image(f)))[0]))] == c for c, f in files)
    assert hits / len(files) >= 0.85


def test_two_output_model_keeps_every_output_named_on_every_target(two_head_bundles):
    shapes = {"scores": N_CLASSES, "appearance": 3}
    for target, r in two_head_bundles.items():
        m = load_bundle(r.bundle).manifest
        assert r.passed and m["task"] == "raw" and m["verification"]["metric"] == "cosine_worst_output", target
        assert m["verification"]["gated"] and m["verification"]["cosine"] >= 0.98
        for model in m["models"]:
            named = {o["name"]: o for o in model["outputs"]}
            assert set(named) == set(shapes), (target, model["name"])
            for name, size in shapes.items():
                assert int(np.prod(named[name]["shape"])) == size, (target, model["name"], name)
            per_output = m["verification"]["models"][model["name"]]["eval"]["outputs"]
            # a swapped pair of outputs could not reach these similarities
            assert min(o["cosine"] for o in per_output.values()) >= 0.99, (target, model["name"], per_output)
            assert "task_options" not in model  # raw: no class output to point at


def test_int8_outputs_are_matched_by_name_not_position(two_head_bundles):
    """TF's converter names the outputs StatefulPartitionedCall:N in its own order; each model
    file's manifest names its outputs in its runtime's order, so int8 and fp32 agree by name."""
    from edgekit.heads.tensors import dequantize

    path = two_head_bundles["cpu"].bundle
    frames = [read_image(f) for f in sorted(CALIB.glob("*.png"))[:20]]
    named = {}
    for variant in ("fp32", "int8"):
        entry = load_bundle(path).model(variant)
        assert all(o["tensor"].startswith("StatefulPartitionedCall") for o in entry.outputs)
        with open_runtime(path, model=variant) as rt:
            prep, quant = Preprocessor(rt.input_spec), rt.output_quantization
            rows = [rt.infer(prep(f)) for f in frames]
        named[variant] = {o["name"]: np.stack([dequantize(r[i], *(quant[i] or (None, None)))[0] for r in rows])
                          for i, o in enumerate(entry.outputs)}
    for name in ("scores", "appearance"):
        fp32, int8 = named["fp32"][name], named["int8"][name]
        assert fp32.shape == int8.shape
        cosine = float((fp32 * int8).sum() / np.linalg.norm(fp32) / np.linalg.norm(int8))
        assert cosine > 0.99, (name, cosine)


def test_output_renamed_in_conversion_is_one_error(two_head_bundles):
    from edgekit.builders.tflite import output_order
    from edgekit.errors import ModelError

    path = two_head_bundles["cpu"].bundle / "two_head_int8.tflite"
    assert sorted(output_order(path, ["scores", "appearance"])) == [0, 1]
    with pytest.raises(ModelError, match="output\\(s\\) box were renamed or dropped in conversion"):
        output_order(path, ["scores", "box"])


def test_symbolic_height_width_needs_input_size(made, tmp_path):
    from edgekit.builders.build import build
    from edgekit.errors import ModelError

    with pytest.raises(ModelError, match=r"input 'image' has shape \[\?,1,\?,\?\]"):
        build(made["dynamic"], "cpu", [CALIB], out=tmp_path, variants="fp32", quiet=True)
    [r] = build(made["dynamic"], "cpu", [CALIB, FRAMES], out=tmp_path, eval_dir=EVAL, variants="int8",
                input_size="32x32", quiet=True)
    m = load_bundle(r.bundle).manifest
    assert r.passed and m["input"]["shape"] == [1, 32, 32, 1] and m["input"]["layout"] == "NHWC"
    assert [isinstance(d, str) for d in m["source"]["input_shape"]] == [True, False, True, True]  # as exported


def test_conversion_process_cannot_reach_the_network(tmp_path):
    """The guard the onnx2tf child runs under stops onnx2tf's real download function; with our
    sample file in the working directory, that function reads ours and never connects."""
    code = (
        "import numpy as np, sys\n"
        "from edgekit.builders.convert.onnx2tf_job import SAMPLE_FILE, NetworkBlocked, block_network\n"
        "block_network()\n"
        "from onnx2tf.utils.common_functions import download_test_image_data\n"
        "try:\n"
        "    download_test_image_data(); print('downloaded')\n"
        "except NetworkBlocked as exc:\n"
        "    print('blocked', exc)\n"
        "np.save(SAMPLE_FILE, np.full((20, 8, 8, 3), 0.25, np.float32))\n"
        "print('ours', float(download_test_image_data().mean()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("blocked name lookup of 'github.com' refused") and lines[1] == "ours 0.25"


def test_conversion_job_refuses_to_run_without_our_sample_file(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"onnx": "model.onnx", "input": "x", "layout": "NCHW",
                                                   "keys": ["y"]}))
    proc = subprocess.run([sys.executable, "-m", "edgekit.builders.convert.onnx2tf_job", "job.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    result = json.loads((tmp_path / "result.json").read_text())
    assert proc.returncode == 3 and not result["ok"] and "is missing: onnx2tf would download it" in result["error"]


def test_run_and_bench_refuse_a_symbolic_onnx_without_input_size_and_say_what_they_assume(made, capsys):
    from edgekit.cli import main

    dyn = str(made["dynamic"])
    for verb in (["run", dyn, "--camera", "synthetic", "--max-frames", "3"],
                 ["bench", dyn, "--min-duration", "0", "--min-count", "5", "--repeats", "1"]):
        assert main(verb) == 2
        err = capsys.readouterr().err
        assert "error: input 'image' has shape [?,1,?,?]: its height/width are not fixed" in err
        assert "--input-size" in err and "Traceback" not in err
    assert main(["run", dyn, "--camera", "synthetic", "--max-frames", "3", "--every", "0",
                 "--input-size", "32x32"]) == 0
    out = capsys.readouterr().out
    assert "task classify" in out and "input: NCHW 1x1x32x32 float32; assumed: colour gray" in out
    assert "std 255 (" in out  # each value says where it came from (flag, sidecar, model metadata, default)
    assert main(["bench", dyn, "--input-size", "32x32", "--min-duration", "0", "--min-count", "5",
                 "--repeats", "1"]) == 0
    assert "demo_dyn.onnx: input NCHW 1x1x32x32 float32; assumed: colour gray" in capsys.readouterr().err


def test_run_decodes_a_two_output_bundle_with_the_raw_head(two_head_bundles, capsys):
    from edgekit.cli import main

    bundle = f"{two_head_bundles['cpu'].bundle}:int8"
    assert main(["run", bundle, "--camera", "synthetic", "--max-frames", "2", "--json", "--tensors"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["task"] == "raw"
    frames = [line for line in lines if "frame" in line]
    assert len(frames) == 2 and all("top" not in f for f in frames)
    outputs = frames[0]["outputs"]
    assert [o["name"] for o in outputs] == [o["name"] for o in load_bundle(two_head_bundles["cpu"].bundle)
                                            .model("int8").outputs]
    assert {o["name"]: len(o["values"][0]) for o in outputs} == {"scores": N_CLASSES, "appearance": 3}
    assert main(["run", bundle, "--camera", "synthetic", "--max-frames", "2", "--every", "0"]) == 0
    assert "appearance 1x3 mean" in capsys.readouterr().out


def test_serve_supervisor_decodes_with_the_bundle_task(two_head_bundles):
    from edgekit.heads.raw import RawResult
    from edgekit.model import open_model

    with open_model(two_head_bundles["edgetpu"].bundle) as model:
        assert model.task == "raw" and model.task_options["names"] == [o["name"] for o in
                                                                        load_bundle(model.path).model().outputs]
    from edgekit.camera import Frame
    from edgekit.metrics import PipelineMetrics
    from edgekit.serve.config.load import from_dict
    from edgekit.serve.supervisor import ModelSupervisor

    config = from_dict({"model": {"path": str(two_head_bundles["cpu"].bundle)}})
    sup = ModelSupervisor(config, None, None, PipelineMetrics(), _Counters(), clock=lambda: 0)
    sup.open()
    result = sup.pipeline.step(Frame(np.zeros((64, 64, 3), np.uint8), 0, 0))
    assert isinstance(result.result, RawResult)
    assert sorted(o.name for o in result.result.outputs) == ["appearance", "scores"]


class _Counters:
    def add(self, *args, **kwargs):
        pass
