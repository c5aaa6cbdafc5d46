"""When an int8 model misses the gate, the build says where: the worst layers by RMSE/scale
(TensorFlow's QuantizationDebugger on real conversions) and the mixed-range hint
(ultralytics/yolov5#10164), in edgekit.json, build.log and on stderr."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.builders.int8.report import (
    IDEAL_RMSE_OVER_SCALE,
    MIXED_RANGE_RATIO,
    hint_text,
    mixed_ranges,
    report_lines,
    summary,
    worst_layers,
)
from tests.conftest import CALIB, DEMO_MODEL, EVAL


def _detector_output(pixels: bool, anchors: int = 50, classes: int = 6, channels_first: bool = True):
    """A YOLO-style head made in Keras: boxes (sigmoid, times 640 when ``pixels``) concatenated
    with class scores (sigmoid, [0, 1]) into one ``[4+nc, N]`` (or ``[N, 4+nc]``) output."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((10, 5, 3))
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    x = layers.Reshape((anchors, 16))(x)
    boxes = layers.Dense(4, activation="sigmoid", kernel_initializer=keras.initializers.RandomNormal(stddev=2.0))(x)
    if pixels:
        boxes = layers.Rescaling(640.0)(boxes)
    scores = layers.Dense(classes, activation="sigmoid")(x)
    out = layers.Concatenate(axis=-1)([boxes, scores])  # [N, 4+nc]
    if channels_first:
        out = layers.Permute((2, 1))(out)  # [4+nc, N], as YOLOv8 exports
    model = keras.Model(inp, out)
    images = np.random.default_rng(1).random((16, 10, 5, 3), dtype=np.float32)
    return model.predict(images, verbose=0)


@pytest.mark.parametrize("channels_first", [True, False])
def test_pixel_boxes_beside_scores_fire_the_hint_naming_the_output(channels_first):
    out = _detector_output(pixels=True, channels_first=channels_first)
    found = mixed_ranges({"scores": np.zeros((16, 3)) + 0.5, "output0": out})
    assert [f["output"] for f in found] == ["output0"]
    f = found[0]
    assert f["axis"] == (1 if channels_first else 2)
    assert f["wide"]["channels"] == [0, 4] and f["narrow"]["channels"] == [4, 10]
    assert f["wide"]["max"] > 100 and f["narrow"]["min"] >= 0 and f["narrow"]["max"] <= 1
    assert f["ratio"] >= MIXED_RANGE_RATIO and f["narrow_levels"] < 256 / MIXED_RANGE_RATIO
    text = hint_text(f)
    assert text.startswith(f"output output0 mixes ranges on axis {f['axis']}: channels 0-3 span")
    assert "channels 4-9 only" in text
    assert "split the outputs before quantisation, or normalise the boxes to [0, 1]" in text


def test_normalised_boxes_beside_scores_give_no_hint():
    assert mixed_ranges({"output0": _detector_output(pixels=False)}) == []


def test_mixed_range_check_on_arrays():
    rng = np.random.default_rng(0)
    # SSD-style boxes [N, 4] in similar ranges, and scores whose classes differ but interleave
    boxes = rng.uniform(0, 300, (8, 100, 4))
    probs = rng.dirichlet(np.ones(5), (8, 100)) * np.array([1, 0.01, 1, 0.01, 1])
    assert mixed_ranges({"boxes": boxes, "scores": probs}) == []
    # boxes last, logits first: the split may sit anywhere and the wide group may be either side
    logits = rng.uniform(-0.5, 0.5, (8, 3))
    mixed = np.concatenate([logits, rng.uniform(0, 640, (8, 4))], axis=1)
    (f,) = mixed_ranges({"raw": mixed})
    assert f["wide"]["channels"] == [3, 7] and f["narrow"]["channels"] == [0, 3] and f["axis"] == 1
    # a constant channel loses nothing; one output value, NaN, or no rows: nothing to say
    assert mixed_ranges({"pad": np.concatenate([rng.uniform(0, 640, (8, 4)), np.zeros((8, 2))], 1)}) == []
    assert mixed_ranges({"a": np.ones((4, 1)), "b": np.full((2, 3), np.nan), "c": np.zeros((0, 5))}) == []
    # below the documented ratio: no hint
    near = np.concatenate([rng.uniform(0, 10, (8, 4)), rng.uniform(0, 1, (8, 4))], axis=1)
    assert mixed_ranges({"near": near}) == [] and mixed_ranges({"near": near}, ratio=5) != []


def _ssd_regressors(images: int = 8, channels_first: bool = False) -> np.ndarray:
    """An SSD regressor output as MediaPipe's pose detector gives it: ``[n, 2254, 12]``, the anchors of
    the finest feature maps (the first 1960) regressing up to its clamp (+-448 px), the coarsest
    map's 294 within +-0.7: a split along the anchors, not between quantities."""
    rng = np.random.default_rng(0)
    out = np.concatenate([rng.uniform(-448, 448, (images, 1960, 12)), rng.uniform(-0.7, 0.7, (images, 294, 12))], 1)
    return np.swapaxes(out, 1, 2) if channels_first else out


@pytest.mark.parametrize("layout", [None, "ssd"])
def test_no_hint_along_an_ssd_regressors_anchors(layout):
    regressors = _ssd_regressors()
    assert mixed_ranges({"Identity": regressors}, layout=layout) == []
    assert mixed_ranges({"Identity": _ssd_regressors(channels_first=True)}) == []  # the longer axis counts anchors
    # the check itself would find the split on the anchor axis: what fired before
    assert mixed_ranges({"Identity": regressors[:, :, :1].reshape(8, 2254)})[0]["axis"] == 1


def test_the_hint_still_fires_on_yolo_channels_beside_its_anchors():
    out = _detector_output(pixels=True, anchors=50, classes=6)  # [n, 10, 50]
    for layout in (None, "yolo"):
        (f,) = mixed_ranges({"output0": out}, layout=layout, num_classes=6)
        assert f["axis"] == 1 and f["wide"]["channels"] == [0, 4]
    # a YOLO output with more channels than anchors: the detect head's class count says which axis
    few = np.concatenate([np.random.default_rng(0).uniform(0, 640, (4, 4, 8)),
                          np.random.default_rng(1).uniform(0, 1, (4, 20, 8))], 1)  # [n, 4 + 20, 8 anchors]
    assert mixed_ranges({"output0": few}) == []  # the longer axis taken for the anchors: no finding
    assert mixed_ranges({"output0": few}, layout="yolo", num_classes=20)[0]["axis"] == 1


def test_channel_axes():
    from edgekit.builders.int8.report import channel_axes

    assert channel_axes((1, 84, 8400)) == [1] and channel_axes((1, 8400, 84)) == [2]
    assert channel_axes((1, 2254, 12)) == [2] and channel_axes((1, 12, 2254), "ssd") == [2]
    assert channel_axes((1, 14)) == [1] and channel_axes((1, 64, 64, 3)) == [1, 2, 3]  # no axis stands out
    assert channel_axes((1, 24, 8), "yolo", 20) == [1] and channel_axes((1, 24, 8), "yolo") == [2]


def test_worst_layers_from_a_statistics_dump():
    rows = [{"op_name": "CONV_2D", "tensor_name": "a", "mean_squared_error": "4e-6", "scale": "0.004"},
            {"op_name": "TANH", "tensor_name": "b", "mean_squared_error": "0.0001", "scale": "0.0078125",
             "mean_abs_error": "0.009", "max_abs_error": "nan"},
            {"op_name": "ADD", "tensor_name": "c", "mean_squared_error": "1", "scale": "0"},  # no scale: left out
            {"op_name": "MUL", "tensor_name": "d", "mean_squared_error": "x", "scale": "1"}]
    worst = worst_layers(rows, worst=5, outputs={"b": "logits"})
    assert [w["tensor"] for w in worst] == ["b", "a"]
    assert worst[0] == {"tensor": "b", "op": "TANH", "rmse_over_scale": 1.28, "scale": 0.0078125,
                        "mean_abs_error": 0.009, "output": "logits"}
    assert worst[1]["rmse_over_scale"] == 0.5 and "output" not in worst[1]
    assert worst_layers(rows, worst=1) == worst_layers(rows)[:1]
    # a clamped tensor is judged against the float values clipped to its clamp, else left out
    assert [w["tensor"] for w in worst_layers(rows, clamped={"b": (-1.0, 1.0)})] == ["a"]
    clipped = [{**r, "clipped_mse": "6.103515625e-07"} if r["tensor_name"] == "b" else r for r in rows]
    b = worst_layers(clipped, clamped={"b": (-1.0, 1.0)})[-1]
    assert b["tensor"] == "b" and b["rmse_over_scale"] == 0.1 and b["clamp"] == [-1.0, 1.0]


def test_report_lines_and_summary_name_layers_and_hints():
    report = {"images": 32, "worst_layers": [
        {"tensor": "model/steep/Tanh;model/steep/x", "op": "TANH", "rmse_over_scale": 0.8, "output": None},
        {"tensor": "StatefulPartitionedCall:0", "op": "CONCATENATION", "rmse_over_scale": 0.33, "output": "det"}],
        "hints": ["output det mixes ranges ..."],
        "mixed_ranges": [{"output": "det", "axis": 1, "wide": {"channels": [0, 4]}, "narrow": {"channels": [4, 14]},
                          "ratio": 341.8}]}
    lines = report_lines(report)
    assert lines[0].startswith("worst layers on 32 calibration images") and f"{IDEAL_RMSE_OVER_SCALE:.2f}" in lines[0]
    assert lines[1:] == ["  1. TANH model/steep/Tanh (+1 fused): RMSE/scale 0.80",
                         "  2. CONCATENATION StatefulPartitionedCall:0 (output det): RMSE/scale 0.33",
                         "hint: output det mixes ranges ..."]
    assert summary(report) == ("worst int8 layers by RMSE/scale: model/steep/Tanh (TANH) 0.80, "
                               "output det (CONCATENATION) 0.33; output det mixes ranges "
                               "(channels 0-3 vs 4-13, 341.8x): split the outputs or normalise the boxes to [0, 1]")
    assert summary({"worst_layers": [], "hints": [], "mixed_ranges": []}) == ""


# --- the debugger on a real conversion ------------------------------------------------------


@pytest.fixture(scope="module")
def steep(tmp_path_factory):
    """A small CNN with one badly quantised layer (tanh of a 200x gain), its SavedModel, the
    debugger's report, and the tensor names of its int8 conversion by edgekit's converter."""
    import keras
    import tensorflow as tf
    from keras import layers

    from edgekit.builders.convert.to_tflite import convert, converter
    from edgekit.builders.int8.report import layer_errors

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    x = layers.Conv2D(8, 3, activation="relu", name="conv_a")(inp)
    x = layers.Conv2D(8, 3, activation="relu", name="conv_b")(x)
    x = layers.Conv2D(8, 3, name="conv_c")(x)
    x = layers.Activation("tanh", name="steep")(layers.Rescaling(200.0, name="gain")(x))
    x = layers.Conv2D(8, 3, activation="relu", name="conv_d")(x)
    x = layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inp, layers.Dense(6, name="head")(x))
    saved = tmp_path_factory.mktemp("steep") / "saved_model"
    model.export(saved, input_signature=[tf.TensorSpec((1, 16, 16, 3), tf.float32)], verbose=False)
    images = np.random.default_rng(0).random((40, 16, 16, 3), dtype=np.float32)
    worst, n = layer_errors(converter(saved, "int8", images), images, debug_images=24)
    from ai_edge_litert.interpreter import Interpreter

    int8 = Interpreter(model_content=convert(saved, "int8", images))
    # what a build reports: the int8 as built (edgekit's quantiser on the float graph), instrumented
    from edgekit.builders.int8.quantize import quantize_int8

    built = layer_errors(quantize_int8(convert(saved, "fp32"), images, numeric_verify=True), images, debug_images=24)
    return worst, n, {t["name"] for t in int8.get_tensor_details()}, built


@pytest.mark.slow
def test_debugger_report_names_real_tensors_worst_first(steep):
    worst, n, names, _ = steep
    assert n == 24 and 1 <= len(worst) <= 5
    assert len(worst) == 5  # the model has more quantised layers than that: the report keeps five
    assert all(w["tensor"] in names for w in worst), [w["tensor"] for w in worst]
    scores = [w["rmse_over_scale"] for w in worst]
    assert scores == sorted(scores, reverse=True)
    # the layer we broke is named first, well above plain rounding; the others near it
    assert worst[0]["op"] == "TANH" and "steep" in worst[0]["tensor"]
    assert scores[0] > 2 * IDEAL_RMSE_OVER_SCALE and all(s < 2 * IDEAL_RMSE_OVER_SCALE for s in scores[1:])
    assert all(w["scale"] > 0 and w["mean_abs_error"] >= 0 for w in worst)


@pytest.mark.slow
def test_the_report_of_the_int8_as_built_names_the_same_broken_layer(steep):
    worst, n = steep[3]
    assert n == 24 and len(worst) == 5 and worst[0]["op"] == "TANH" and "steep" in worst[0]["tensor"]
    assert worst[0]["rmse_over_scale"] > 2 * IDEAL_RMSE_OVER_SCALE


# --- end to end: edgekit build --------------------------------------------------------------


@pytest.fixture(scope="module")
def gate_failures(tmp_path_factory):
    """Two builds whose int8 model misses the gate, through the CLI: a raw detector-style model
    with pixel boxes beside scores (--min-cosine above what int8 reaches) and the demo
    classifier (--min-accuracy-ratio 1.5, which no model reaches). {case: (code, err, dist)}."""
    import contextlib
    import io

    import keras
    from keras import layers

    from edgekit.cli import main

    tmp = tmp_path_factory.mktemp("gate")
    keras.utils.set_random_seed(0)
    inp = keras.Input((32, 32, 1))
    x = layers.GlobalAveragePooling2D()(layers.Conv2D(8, 3, activation="relu", name="conv_a")(inp))
    boxes = layers.Rescaling(640.0)(layers.Dense(4, activation="sigmoid", name="box_head")(x))
    scores = layers.Dense(10, activation="sigmoid", name="class_head")(x)
    keras.Model(inp, layers.Concatenate(name="det")([boxes, scores])).save(tmp / "mixed.keras")
    cases = {"raw": [tmp / "mixed.keras", "--task", "raw", "--min-cosine", "0.999999", "--no-recover"],  # 16x8 passes
             "classify": [DEMO_MODEL, "--eval", str(EVAL), "--min-accuracy-ratio", "1.5"]}
    results = {}
    for case, (model, *extra) in cases.items():
        dist = tmp / case
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["build", "--model", str(model), "--target", "cpu", "--calib", str(CALIB), "--out", str(dist),
                         "--variants", "fp32,int8", "--calib-count", "120", *extra])
        results[case] = (code, err.getvalue(), dist)
    return results


def _rejected(dist, name):
    bundle = dist / f"{name}-cpu.rejected"
    return json.loads((bundle / "edgekit.json").read_text()), (bundle / "build.log").read_text()


@pytest.mark.slow
def test_raw_gate_failure_names_worst_layers_and_the_mixed_output(gate_failures):
    code, err, dist = gate_failures["raw"]
    assert code == 3 and "Traceback" not in err
    assert json.loads((dist / "mixed-cpu" / "edgekit.json").read_text())["default_model"] == "fp32"  # int8 left out
    manifest, log = _rejected(dist, "mixed")
    models = manifest["verification"]["models"]
    assert "quantization" not in models["fp32"]  # only int8 is reported
    report = models["int8"]["quantization"]
    assert report["metric"] == "rmse_over_scale" and report["images"] == 32 and "error" not in report
    worst = report["worst_layers"]
    assert 1 <= len(worst) <= 5 and [w["rmse_over_scale"] for w in worst] == sorted(
        (w["rmse_over_scale"] for w in worst), reverse=True)
    assert all(w["tensor"].startswith(("functional", "StatefulPartitionedCall")) for w in worst)
    assert all(w.get("output") == "det" for w in worst if w["op"] == "CONCATENATION")  # the model's output
    assert [f["output"] for f in report["mixed_ranges"]] == ["det"] and "output det mixes ranges" in report["hints"][0]
    # the names reach the user: stderr and the bundle's build.log
    for text in (err, log):
        assert "[cpu] int8 missed the gate: per-layer quantisation error" in text
        assert all(f"{w['op']} {w['tensor'].split(';')[0]}" in text for w in worst)
        assert "hint: output det mixes ranges on axis 1: channels 0-3" in text
    # and the one error line the build ends with (builders/publish.py adds the report's summary)
    (error,) = [line for line in err.splitlines() if line.startswith("edgekit build: error:")]
    first = f"output {worst[0]['output']}" if worst[0].get("output") else worst[0]["tensor"].split(";")[0]
    assert f"worst int8 layers by RMSE/scale: {first} ({worst[0]['op']})" in error
    assert "output det mixes ranges (channels 0-3 vs 4-13" in error


@pytest.mark.slow
def test_classifier_gate_failure_gets_the_report_without_a_range_hint(gate_failures):
    code, err, dist = gate_failures["classify"]
    assert code == 3 and "Traceback" not in err
    manifest, log = _rejected(dist, "demo")
    report = manifest["verification"]["models"]["int8"]["quantization"]
    assert len(report["worst_layers"]) == 5 and report["hints"] == []  # class scores are meant to differ
    assert all(f"{w['op']} {w['tensor'].split(';')[0]}" in log for w in report["worst_layers"])
    assert "quantization" not in manifest["verification"]["models"]["fp32"]


@pytest.mark.slow
def test_target_option_reports_on_every_int8_build(tmp_path, capsys):
    """``quant_report = true`` in a target's [build] table: the report also when int8 passes."""
    import edgekit

    target = tmp_path / "cpu-report.toml"
    target.write_text('name = "cpu-report"\nsummary = "cpu, with the quantisation report"\n'
                      'builder = "edgekit.builders.tflite:build"\nadapter = "edgekit.runtime.litert:LiteRTRuntime"\n'
                      '[build]\nvariants = ["int8"]\nquant_report = true\n')
    [r] = edgekit.build(DEMO_MODEL, str(target), [CALIB], out=tmp_path / "out", calib_count=60)
    assert r.passed and r.bundle.name == "demo-cpu-report"
    report = json.loads((r.bundle / "edgekit.json").read_text())["verification"]["models"]["int8"]["quantization"]
    assert len(report["worst_layers"]) == 5 and report["images"] == 32 and report["hints"] == []
    err = capsys.readouterr().err
    assert "[cpu-report] int8: per-layer quantisation error" in err and "missed the gate" not in err
