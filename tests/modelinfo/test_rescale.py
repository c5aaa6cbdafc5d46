"""A bare model that divides the image by 255 itself is fed 0-255 pixels by run and bench, as by build.

The ONNX models (tests/helpers/rescale_models.py) put the /255 first, behind a Transpose, as an
initializer or a Constant node; one TFLite form goes through TensorFlow's converter (fp32, fp16
weights, full int8).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.cli import main as cli
from edgekit.model import open_model
from edgekit.modelinfo.rescale import in_graph_rescale, rescale_reason
from tests.helpers.rescale_models import colour_folder, rescale_onnx

pytest.importorskip("PIL")


@pytest.mark.parametrize("kw", [{}, {"constant_node": True}, {"op": "Div", "factor": 255.0}, {"nchw": True},
                                {"big_weight": True}])
def test_an_onnx_first_op_dividing_by_255_is_found_without_the_onnx_package(tmp_path, kw, monkeypatch):
    import sys

    path = rescale_onnx(tmp_path / "m.onnx", **kw)
    monkeypatch.setitem(sys.modules, "onnx", None)  # the device side never needs it
    assert in_graph_rescale(path) == "its first op 'rescaling/mul' divides the image by 255"


@pytest.mark.parametrize("op, factor", [("Mul", 2.0), ("Div", 0.5), ("Mul", 1 / 58.0)])
def test_other_factors_are_not_a_rescale(tmp_path, op, factor):
    """A std of 58 (ImageNet in pixel units) is the model's normalisation, not a /255."""
    assert in_graph_rescale(rescale_onnx(tmp_path / "m.onnx", op, factor)) is None


def test_unreadable_files_are_no_answer_not_an_error(tmp_path):
    (tmp_path / "noise.onnx").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "noise.tflite").write_bytes(b"\0\0\0\0TFL3" + bytes(100))
    (tmp_path / "m.keras").write_bytes(b"PK")
    names = ("noise.onnx", "noise.tflite", "m.keras", "none.onnx")
    assert [in_graph_rescale(tmp_path / n) for n in names] == [None] * 4
    assert rescale_reason([], {}, "x") is None


def test_run_feeds_an_in_graph_rescale_0_255_and_says_why(tmp_path, capsys):
    model = rescale_onnx(tmp_path / "m.onnx")
    (tmp_path / "m.labels.txt").write_text("red\ngreen\nblue\n")
    folder = colour_folder(tmp_path)
    assert cli(["run", str(model), "--camera", f"folder:{folder}", "--json", "--warmup", "0"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["assumed_input"].startswith(
        "NHWC 1x16x16x3 float32; assumed: mean 0, std 1 (model graph: its first op 'rescaling/mul' divides the "
        "image by 255); colour rgb")
    assert lines[0]["input_from"]["std"] == "model graph: its first op 'rescaling/mul' divides the image by 255"
    tops = [r["top"][0] for r in lines[1:-1]]
    assert [t["label"] for t in tops] == ["green"] * 3 and min(t["score"] for t in tops) > 0.98
    # a flag or a sidecar still goes over the graph: std 255 divides twice, as the issue saw
    with open_model(model, preprocess={"std": [255.0]}) as m:
        assert m.runtime.input_spec.std == (255.0,) * 3 and m.origin["std"] == "flag" and "mean" not in m.origin
    (tmp_path / "m.preprocess.json").write_text('{"mean": 127.5}')
    with open_model(model) as m:  # the build's rule: a given mean keeps the default std 255
        assert m.runtime.input_spec.std == (255.0,) * 3 and m.origin["mean"] == "sidecar m.preprocess.json"


def test_bench_eval_scores_a_bare_rescaling_model_as_its_build_would(tmp_path, capsys):
    model = rescale_onnx(tmp_path / "m.onnx", nchw=True)
    (tmp_path / "m.labels.txt").write_text("red\ngreen\nblue\n")
    evalset = tmp_path / "eval"
    evalset.mkdir()
    for colour in ("red", "green", "blue"):
        colour_folder(evalset, colour)
    assert cli(["bench", str(model), "--eval", str(evalset), "--repeats", "1", "--min-duration", "0",
                "--min-count", "3", "--frames", "2", "--json"]) == 0
    [scored] = json.loads(capsys.readouterr().out)["eval"]
    assert scored["accuracy"] == 1.0, scored["predictions"]  # [0, 0, 0, 2, 2, 2, 2, 2, 2] scaled twice


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Statistics for quantized inputs")
def test_tflite_first_mul_is_found_in_fp32_fp16_and_int8_files(tmp_path, capsys):
    """TensorFlow's converter keeps a Mul that cannot fold into a convolution (here a mean
    follows); fp16 reads the factor through a DEQUANTIZE, int8 as a quantised constant."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, 16, 16, 3], tf.float32)])
    def f(x):
        return tf.nn.softmax(tf.reduce_mean(x * (1 / 255.0), axis=[1, 2]) * 8.0)

    def convert(kind: str) -> bytes:
        conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
        if kind != "fp32":
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
        if kind == "fp16":
            conv.target_spec.supported_types = [tf.float16]
        if kind == "int8":
            rng = np.random.default_rng(0)
            conv.representative_dataset = lambda: ([rng.random((1, 16, 16, 3), np.float32) * 255] for _ in range(4))
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        return conv.convert()

    for kind in ("fp32", "fp16", "int8"):
        (tmp_path / f"m_{kind}.tflite").write_bytes(convert(kind))
        assert in_graph_rescale(tmp_path / f"m_{kind}.tflite").startswith("its first op 'mul' divides the image by 255")
    folder = colour_folder(tmp_path)
    assert cli(["run", str(tmp_path / "m_fp32.tflite"), "--camera", f"folder:{folder}", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "std 1 (model graph: its first op 'mul' divides the image by 255)" in lines[0]["assumed_input"]
    assert all(r["top"][0]["index"] == 1 and r["top"][0]["score"] > 0.99 for r in lines[1:-1])
