"""A float .tflite as the model to build (as MediaPipe, TF Hub and Model Maker ship them).

The demo classifier is exported to float .tflite files the way publishers make them (float32
weights; float16 weights read through DEQUANTIZE, as every MediaPipe model is) and built for
every target with the real converters. Its int8 must be the graph a Keras build makes (no
TRANSPOSE added: the Edge TPU op count is the same), and the gate must hold on the eval set.
"""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import pytest

from edgekit.bundle import load_bundle
from edgekit.errors import ModelError
from tests.conftest import CALIB, DEMO_MODEL, EVAL, FRAMES

TARGETS = ["edgetpu", "rpi", "cpu", "jetson"]
pytestmark = pytest.mark.slow


def _export(keras_model, shape, fp16: bool) -> bytes:
    import tempfile

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as saved:
        keras_model.export(saved, input_signature=[tf.TensorSpec(shape, tf.float32)], verbose=False)
        conv = tf.lite.TFLiteConverter.from_saved_model(saved)
        if fp16:
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.target_spec.supported_types = [tf.float16]
        return conv.convert()


def _ops(blob: bytes) -> Counter:
    from ai_edge_litert.interpreter import Interpreter

    return Counter(op["op_name"] for op in Interpreter(model_content=blob)._get_ops_details())


@pytest.fixture(scope="module")
def demo_tflite(tmp_path_factory):
    """models/demo.keras as float .tflite files with its sidecars: {"fp32": path, "fp16": path}."""
    import keras

    d = tmp_path_factory.mktemp("tflite-src")
    model = keras.models.load_model(DEMO_MODEL, compile=False)
    paths = {}
    for kind in ("fp32", "fp16"):
        path = d / f"demo_{kind}.tflite"
        path.write_bytes(_export(model, (1, *model.inputs[0].shape[1:]), fp16=kind == "fp16"))
        for side in (".labels.txt", ".preprocess.json"):
            shutil.copy(DEMO_MODEL.with_suffix(side), d / f"demo_{kind}{side}")
        paths[kind] = path
    return paths


@pytest.fixture(scope="module")
def tflite_bundles(demo_tflite, tmp_path_factory):
    """The float16-weight demo .tflite built for every target: {target: TargetBuild}."""
    from edgekit.builders.build import build

    out = tmp_path_factory.mktemp("dist-tflite")
    return {r.target: r for r in build(demo_tflite["fp16"], TARGETS, [CALIB, FRAMES], out=out, eval_dir=EVAL,
                                       quiet=True)}


def test_float_tflite_builds_for_every_target_through_the_accuracy_gate(tflite_bundles):
    assert set(tflite_bundles) == set(TARGETS)
    for target, r in tflite_bundles.items():
        assert r.passed, (target, r.error)
        m = load_bundle(r.bundle).manifest
        v = m["verification"]
        assert v["metric"] == "top1" and v["ratio"] >= 0.98 and v["original"] >= 0.85, (target, v)
        assert m["source"]["format"] == "tflite" and m["task"] == "classify"
    precisions = {m.name: m.precision for m in load_bundle(tflite_bundles["cpu"].bundle).models}
    assert precisions == {"fp32": "float32", "fp16": "float16-weights", "int8": "int8"}
    [int8] = load_bundle(tflite_bundles["edgetpu"].bundle).models
    assert int8.input.dtype == "uint8" and int8.outputs[0]["dtype"] == "uint8"
    assert int8.input.colour == "gray" and int8.input.crop == (200, 200)  # the sidecar's preprocessing


def test_tflite_int8_is_the_graph_a_keras_build_makes(tflite_bundles, demo_bundles):
    """Same ops and the same Edge TPU prediction as the Keras build of the same network: no TRANSPOSE."""
    mine = tflite_bundles["edgetpu"]
    keras_built = demo_bundles["edgetpu"]
    ours = _ops((mine.bundle / load_bundle(mine.bundle).models[0].file).read_bytes())
    theirs = _ops((keras_built.bundle / load_bundle(keras_built.bundle).models[0].file).read_bytes())
    assert ours == theirs and "TRANSPOSE" not in ours and "DEQUANTIZE" not in ours
    a, b = mine.manifest["edgetpu"]["offline"], keras_built.manifest["edgetpu"]["offline"]
    assert (a["tpu_ops"], a["total_ops"]) == (b["tpu_ops"], b["total_ops"]) and a["tpu_ops"] == a["total_ops"]


def test_fp32_and_fp16_variants_hold_the_source_values(demo_tflite):
    """float16 weights dequantised to float32 are exact; float32 weights stored as float16 run the
    same graph with every DEQUANTIZE folded by XNNPACK (outputs within float16 rounding)."""
    from edgekit.builders.graph import edit
    from edgekit.runtime.litert import LiteRTRuntime

    half = demo_tflite["fp16"].read_bytes()
    full = edit.float32_weights(half)
    assert edit.weight_precision(half) == "float16-weights"
    assert edit.weight_precision(full) == "float32" and "DEQUANTIZE" not in _ops(full)
    again = edit.float16_weights(full)
    assert edit.weight_precision(again) == "float16-weights"
    assert _ops(again)["DEQUANTIZE"] == _ops(half)["DEQUANTIZE"]
    x = np.random.default_rng(0).random((1, 32, 32, 1), dtype=np.float32)
    outs = []
    for blob in (half, full, again):
        path = demo_tflite["fp16"].parent / "check.tflite"
        path.write_bytes(blob)
        with LiteRTRuntime(path) as rt:
            outs.append(rt.infer(x)[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_multi_output_tflite_keeps_its_own_output_order_and_names(tmp_path):
    """Four outputs whose order differs by name, by shape and by index: the bundle lists them as
    the file does, and the runtime returns them in that order on every TFLite target."""
    import keras
    from keras import layers

    from edgekit.builders.build import build
    from edgekit.runtime import open_runtime

    inp = keras.Input((16, 16, 3), batch_size=1)
    x = layers.Conv2D(4, 3, activation="relu")(inp)
    pooled = layers.GlobalAveragePooling2D()(x)
    outs = [layers.Dense(7, name="zeta")(pooled), layers.Dense(2, name="alpha")(pooled),
            layers.Dense(5, name="mid")(pooled), layers.Flatten(name="beta")(x)]
    model = keras.Model(inp, outs)
    path = tmp_path / "four.tflite"
    path.write_bytes(_export(model, (1, 16, 16, 3), fp16=False))
    from ai_edge_litert.interpreter import Interpreter

    declared = [(d["name"], int(np.prod(d["shape"]))) for d in Interpreter(model_path=str(path)).get_output_details()]
    results = build(path, ["cpu"], [FRAMES], out=tmp_path / "dist", quiet=True, variants=["fp32", "fp16"])
    [r] = results
    assert r.passed, r.error
    entries = load_bundle(r.bundle).model("fp32").outputs
    assert [(o["name"], int(np.prod(o["shape"]))) for o in entries] == declared
    with open_runtime(r.bundle, model="fp16") as rt:
        got = rt.infer(np.zeros(rt.input_spec.shape, np.float32))
    assert [g.size for g in got] == [size for _, size in declared]
    # the same network from Keras: TensorFlow's converter lists outputs by key (alpha, beta, mid,
    # zeta); every variant's file and manifest carry the model's own order again
    model.save(tmp_path / "four.keras")
    [r] = build(tmp_path / "four.keras", ["cpu"], [FRAMES], out=tmp_path / "dist-keras", quiet=True,
                variants=["fp32", "int8"], task="raw", min_cosine=0.5)
    assert r.bundle is not None, r.error
    for variant in ("fp32", "int8"):
        entry = load_bundle(r.bundle).model(variant)
        assert [o["name"].split("/")[0] for o in entry.outputs] == ["zeta", "alpha", "mid", "beta"], entry.outputs
        with open_runtime(r.bundle, model=variant) as rt:
            got = rt.infer(np.zeros(rt.input_spec.shape, rt.input_spec.dtype))
        assert [g.size for g in got] == [7, 2, 5, 14 * 14 * 4]
        assert entry.extra.get("task_options", {}).get("output_index") in (None, 0)


def test_bad_tflite_sources_are_one_line_errors(tmp_path, demo_tflite):
    from edgekit.builders.sources.load import load_source_model

    cases = {"truncated.tflite": demo_tflite["fp32"].read_bytes()[:2000], "text.tflite": b"not a model at all"}
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(ModelError) as err:
            load_source_model(tmp_path / name)
        assert name in err.value.message and "\n" not in err.value.message
    from tests.helpers import tflite_models

    with pytest.raises(ModelError, match="already quantised"):
        load_source_model(tflite_models.model_path("small_int8", tmp_path))
    with pytest.raises(ModelError, match="height/width are not fixed"):
        load_source_model(_dynamic_float(tmp_path))


def _dynamic_float(tmp_path):
    """A float .tflite whose height and width are left open."""
    import keras
    from keras import layers

    inp = keras.Input((None, None, 3), batch_size=1)
    model = keras.Model(inp, layers.GlobalAveragePooling2D()(layers.Conv2D(2, 3)(inp)))
    path = tmp_path / "open.tflite"
    path.write_bytes(_export(model, (1, None, None, 3), fp16=False))
    return path


def _as_mediapipe_custom_op(blob: bytes) -> bytes:
    """A TRANSPOSE_CONV (with bias) rewritten as MediaPipe's Convolution2DTransposeBias custom op,
    the way MediaPipe's segmentation models ship it: inputs (image, weights, bias), options the raw
    TfLiteTransposeConvParams (padding SAME = 1, stride_w, stride_h)."""
    import struct

    from tensorflow.lite.python import schema_py_generated as schema

    from edgekit.builders.graph import edit

    model = edit.read(blob)
    sg = model.subgraphs[0]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = 32  # CUSTOM
    code.customCode, code.version = b"Convolution2DTransposeBias", 1
    model.operatorCodes.append(code)
    for op in sg.operators:
        if edit.opcode_of(model, op.opcodeIndex) == 67:
            _, weights, image = list(op.inputs)[:3]
            bias = schema.TensorT()  # Keras' bias is a separate ADD: the custom op gets one of its own
            bias.shape, bias.type, bias.name = [3], 0, b"bias"
            bias.buffer = edit.new_buffer(model, np.array([0.5, -1.0, 2.0], np.float32))
            sg.tensors.append(bias)
            bias = len(sg.tensors) - 1
            op.opcodeIndex, op.inputs = len(model.operatorCodes) - 1, [image, weights, bias]
            op.builtinOptionsType, op.builtinOptions = 0, None
            op.customOptions = list(struct.pack("<3i", 1, 2, 2))
            return edit.write(model)
    raise AssertionError("no TRANSPOSE_CONV with a bias in the test model")


def test_mediapipe_transpose_conv_custom_op_becomes_the_builtin(tmp_path):
    """MediaPipe's custom op runs in LiteRT but not in TensorFlow's calibrator, the Edge TPU
    compiler or tf2onnx: the fp32 variant holds the builtin instead, with the same outputs, and
    int8 calibrates."""
    import keras
    from keras import layers

    from edgekit.builders.graph import edit
    from edgekit.builders.int8 import quantize
    from edgekit.runtime.litert import LiteRTRuntime

    inp = keras.Input((8, 8, 3), batch_size=1)
    up = layers.Conv2DTranspose(3, 2, strides=2, padding="same", use_bias=False)
    out = up(layers.Conv2D(4, 3, padding="same")(inp))
    custom = _as_mediapipe_custom_op(_export(keras.Model(inp, out), (1, 8, 8, 3), fp16=True))
    assert "Convolution2DTransposeBias" in _ops(custom)
    builtin = edit.float32_weights(custom)
    assert "TRANSPOSE_CONV" in _ops(builtin) and "Convolution2DTransposeBias" not in _ops(builtin)
    x = np.random.default_rng(1).random((1, 8, 8, 3), dtype=np.float32)
    got = []
    for name, blob in (("custom.tflite", custom), ("builtin.tflite", builtin)):
        (tmp_path / name).write_bytes(blob)
        with LiteRTRuntime(tmp_path / name) as rt:
            got.append(rt.infer(x)[0])
    assert got[0].shape == (1, 16, 16, 3)
    np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-5)
    quantised = quantize.quantize_int8(custom, np.random.default_rng(2).random((8, 8, 8, 3), dtype=np.float32))
    assert "TRANSPOSE_CONV" in _ops(quantised) and not quantize.float_ops_left(quantised)


def _export_quantised(keras_model, shape, representative: bool) -> bytes:
    """Dynamic range (int8 weights, float compute) without ``representative``; else int8
    activations behind float32 I/O (QUANTIZE in, DEQUANTIZE out)."""
    import tempfile

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as saved:
        keras_model.export(saved, input_signature=[tf.TensorSpec(shape, tf.float32)], verbose=False)
        conv = tf.lite.TFLiteConverter.from_saved_model(saved)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        if representative:
            rng = np.random.default_rng(0)
            conv.representative_dataset = lambda: ([rng.random(shape, dtype=np.float32)] for _ in range(4))
        return conv.convert()


def test_int8_weights_of_a_dynamic_range_model_become_float32_and_int8_graphs_are_refused(tmp_path):
    """A dynamic-range .tflite (TF Hub publishes many) is a float model with int8 weights: its fp32
    variant holds their float32 values, exactly (q - zero_point) * scale, and XNNPACK takes every op.
    A model that computes in int8 behind float I/O is already quantised: one line, no build."""
    import keras

    from edgekit.builders.graph import edit
    from edgekit.builders.sources.load import load_source_model
    from edgekit.runtime.litert import LiteRTRuntime

    model = keras.models.load_model(DEMO_MODEL, compile=False)
    hybrid = _export_quantised(model, (1, 32, 32, 1), representative=False)
    assert {"CONV_2D", "FULLY_CONNECTED"} <= set(_ops(hybrid))
    plain = edit.float32_weights(hybrid)
    assert len(plain) > 3 * len(hybrid) and not edit.quantized_activations(plain)
    model_t = edit.read(plain)
    assert all(t.type != edit.INT8 for t in model_t.subgraphs[0].tensors)
    x = np.random.default_rng(3).random((1, 32, 32, 1), dtype=np.float32)
    (tmp_path / "plain.tflite").write_bytes(plain)
    with LiteRTRuntime(tmp_path / "plain.tflite") as rt:
        got = rt.infer(x)[0]
        assert rt.delegation()["cpu_nodes"] == 0
    np.testing.assert_allclose(got, model(x).numpy(), atol=0.02)  # int8 weights: close to the Keras original
    (tmp_path / "int8_float_io.tflite").write_bytes(_export_quantised(model, (1, 32, 32, 1), representative=True))
    with pytest.raises(ModelError, match="computes in integers"):
        load_source_model(tmp_path / "int8_float_io.tflite")


REAL_MEDIAPIPE = ["hand_landmark_lite.tflite", "selfie_segmentation.tflite", "face_detection_short_range.tflite"]


@pytest.mark.parametrize("name", REAL_MEDIAPIPE)
def test_real_mediapipe_models_build_for_the_cpu_and_map_every_op_on_the_edgetpu(name, tmp_path):
    """MediaPipe's models as the mediapipe 0.10.14 wheel ships them (float16 weights, a custom op,
    several outputs): fp32 and fp16 pass the cosine gate on cpu; the Edge TPU prediction maps
    every op of the int8 (whether or not int8 passes its gate)."""
    from tests.conftest import real_model_file

    path = real_model_file(name)
    if path is None:
        pytest.skip(f"{name} is not under $EDGEKIT_REAL_MODELS (unpack the mediapipe 0.10.14 wheel there)")
    from edgekit.builders.build import build
    from edgekit.errors import VerificationFailed

    try:
        results = build(path, ["cpu", "edgetpu"], [CALIB.parent / "detect"], out=tmp_path / "dist", quiet=True,
                        task="raw", calib_count=60, recover=False)
    except VerificationFailed as exc:  # int8 may miss 0.98: fp32/fp16 must not
        results = exc.results
    by_target = {r.target: r for r in results}
    cpu = by_target["cpu"]
    assert cpu.bundle is not None and {"fp32", "fp16"} <= {m.name for m in load_bundle(cpu.bundle).models}
    offline = by_target["edgetpu"].manifest["edgetpu"]["offline"]
    assert offline["tpu_ops"] == offline["total_ops"], offline
