"""A bundle's model file run bare is fed as the bundle feeds it: its edgekit.json is the model layer.

TensorFlow's converter folds a Keras ``Rescaling(1/255)`` into the first convolution, so the fp32
.tflite of such a model has no /255 to find: only the bundle's record says it takes 0-255 pixels.
"""

from __future__ import annotations

import json
import shutil

import pytest

from edgekit.bundle import BundleWriter, sha256_file
from edgekit.cli import main as cli
from edgekit.imaging.image import InputSpec
from edgekit.model import open_model
from edgekit.modelinfo.bundled import bundle_record
from tests.helpers.rescale_models import colour_folder, rescale_onnx

pytest.importorskip("PIL")


def folded_bundle(tmp_path):
    """A bundle around a model whose /255 is folded into its weights, recorded as std 1."""
    work = tmp_path / "work"
    work.mkdir()
    model = rescale_onnx(work / "m.onnx", factor=1.0, gain=8 / 255)
    spec = InputSpec(shape=(1, 16, 16, 3), mean=(0.0,) * 3, std=(1.0,) * 3, colour="rgb")
    with BundleWriter(tmp_path / "folded-cpu") as w:
        shutil.copy(model, w.dir / "m_fp32.onnx")
        (w.dir / "labels.txt").write_text("red\ngreen\nblue\n")
        w.commit({"name": "folded", "target": "cpu", "task": "classify", "default_model": "fp32",
                  "models": [{"name": "fp32", "file": "m_fp32.onnx", "format": "onnx", "precision": "fp32",
                              "input": spec.to_dict(), "outputs": [{"shape": [1, 3], "dtype": "float32"}],
                              "task_options": {"output_index": 0}}],
                  "labels": "labels.txt",
                  "runtime": {"adapter": "edgekit.runtime.onnxrt:OnnxRuntime", "options": {"providers": ["cpu"]}}})
    return tmp_path / "folded-cpu"


def test_a_bundles_file_run_bare_takes_the_bundles_preprocessing_labels_and_task(tmp_path, capsys):
    bundle = folded_bundle(tmp_path)
    folder = colour_folder(tmp_path)
    assert cli(["run", str(bundle / "m_fp32.onnx"), "--camera", f"folder:{folder}", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert ("assumed: colour rgb, crop none, resize stretch, interpolation area, mean 0, std 1 (bundle folded-cpu's "
            "edgekit.json); labels 3 (bundle folded-cpu's edgekit.json), task classify (bundle folded-cpu's "
            "edgekit.json)") in lines[0]["assumed_input"]
    assert all(r["top"][0]["label"] == "green" and r["top"][0]["score"] > 0.98 for r in lines[1:-1])
    with open_model(bundle / "m_fp32.onnx", preprocess={"std": [255.0]}) as m:  # a flag still goes over it
        assert m.runtime.input_spec.std == (255.0,) * 3 and m.task_options == {"output_index": 0}


def test_a_copy_outside_the_bundle_or_a_changed_file_has_no_record(tmp_path):
    bundle = folded_bundle(tmp_path)
    copy = tmp_path / "copy.onnx"
    shutil.copy(bundle / "m_fp32.onnx", copy)
    assert bundle_record(copy) is None
    assert bundle_record(bundle / "m_fp32.onnx").preprocess["std"] == [1.0, 1.0, 1.0]
    manifest = json.loads((bundle / "edgekit.json").read_text())
    manifest["files"]["m_fp32.onnx"] = "0" * 64  # the file is not the one the bundle was built with
    (bundle / "edgekit.json").write_text(json.dumps(manifest))
    assert bundle_record(bundle / "m_fp32.onnx") is None
    (bundle / "edgekit.json").write_text("{")  # an unreadable manifest: the bare run goes on without it
    assert bundle_record(bundle / "m_fp32.onnx") is None
    with open_model(copy) as m:
        assert m.runtime.input_spec.std == (255.0,) * 3 and m.origin["labels"] == "default"
    assert sha256_file(copy) == sha256_file(bundle / "m_fp32.onnx")


@pytest.mark.slow
def test_a_keras_rescaling_models_fp32_tflite_run_bare_scores_as_its_bundle(tmp_path, capsys):
    """Issue 39's acceptance check: Keras with Rescaling(1/255) built for cpu; its fp32 .tflite run
    bare on a folder gives the bundle's top scores within 0.02 (it gave 1/3 each)."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np

    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(3, 1, use_bias=False, name="c")(keras.layers.Rescaling(1 / 255)(inp))
    out = keras.layers.Dense(3, activation="softmax", name="d")(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inp, out)
    model.get_layer("c").set_weights([np.eye(3, dtype=np.float32).reshape(1, 1, 3, 3)])
    model.get_layer("d").set_weights([np.eye(3, dtype=np.float32) * 6, np.array([0, 0, 0.5], np.float32)])
    model.save(tmp_path / "m.keras")
    (tmp_path / "m.labels.txt").write_text("red\ngreen\nblue\n")
    calib = tmp_path / "calib"
    calib.mkdir()
    for colour in ("red", "green", "blue"):
        colour_folder(calib, colour)
    folder = calib / "green"
    assert cli(["build", "--model", str(tmp_path / "m.keras"), "--target", "cpu", "--variants", "fp32",
                "--calib", str(calib), "--out", str(tmp_path / "dist"), "--interpolation", "linear", "-q"]) == 0
    capsys.readouterr()
    manifest = json.loads((tmp_path / "dist/m-cpu/edgekit.json").read_text())
    assert manifest["models"][0]["input"]["interpolation"] == "linear"  # --interpolation is recorded
    scores, headers = {}, {}
    for spec in (tmp_path / "dist/m-cpu", tmp_path / "dist/m-cpu/m_fp32.tflite"):
        assert cli(["run", str(spec), "--camera", f"folder:{folder}", "--json"]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        headers[spec.name], scores[spec.name] = lines[0], [r["top"][0] for r in lines[1:-1]]
    assert "interpolation linear, mean 0, std 1 (bundle m-cpu's edgekit.json)" in headers["m_fp32.tflite"][
        "assumed_input"]
    bundled, bare = scores["m-cpu"], scores["m_fp32.tflite"]
    assert [t["label"] for t in bare] == [t["label"] for t in bundled] == ["green"] * 3
    assert max(abs(a["score"] - b["score"]) for a, b in zip(bare, bundled)) <= 0.02 and bare[0]["score"] > 0.9
