"""Graph rewrites before int8 (edgekit/builders/graph/rewrite.py): exact in float, and what the
Edge TPU and XNNPACK then map. Real TensorFlow converter, quantiser and LiteRT throughout."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edgekit.bundle import load_bundle
from tests.conftest import FRAMES

pytestmark = pytest.mark.slow


def _float_tflite(model, shape) -> bytes:
    import tempfile

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as saved:
        model.export(saved, input_signature=[tf.TensorSpec(shape, tf.float32)], verbose=False)
        return tf.lite.TFLiteConverter.from_saved_model(saved).convert()


def _ops(blob: bytes) -> Counter:
    from ai_edge_litert.interpreter import Interpreter

    return Counter(op["op_name"] for op in Interpreter(model_content=blob)._get_ops_details())


def _run(blob: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=blob)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return np.array(interp.get_tensor(interp.get_output_details()[0]["index"]))


def _with_relu_0_to_1(blob: bytes) -> bytes:
    """The model with its first HARD_SWISH made a RELU_0_TO_1 (a clip to [0, 1], which onnx2tf
    writes for a hard sigmoid; TensorFlow's converter never writes one from Keras)."""
    from tensorflow.lite.python import schema_py_generated as schema

    from edgekit.builders.graph import edit

    model = edit.read(blob)
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = 152, 127, 1
    model.operatorCodes.append(code)
    first = next(op for op in model.subgraphs[0].operators if edit.opcode_of(model, op.opcodeIndex) == 117)
    first.opcodeIndex = len(model.operatorCodes) - 1
    return edit.write(model)


def _hard_activations():
    """A small CNN with MobileNetV3's hard-swish and a squeeze-excite gate."""
    import keras
    from keras import layers

    inp = keras.Input((24, 24, 3), batch_size=1)
    x = layers.Conv2D(8, 3, activation="hard_swish")(inp)
    x = layers.DepthwiseConv2D(3, activation="hard_swish")(x)
    gate = layers.ReLU()(layers.Reshape((1, 1, 8))(layers.Dense(8)(layers.GlobalAveragePooling2D()(x))))
    x = layers.Multiply()([x, gate])
    return keras.Model(inp, layers.Dense(5)(layers.GlobalAveragePooling2D()(x)))


def test_hard_swish_and_relu_0_to_1_are_rewritten_exactly():
    from edgekit.builders.graph.rewrite import rewrite_for_int8

    blob = _with_relu_0_to_1(_float_tflite(_hard_activations(), (1, 24, 24, 3)))
    before = _ops(blob)
    assert before["HARD_SWISH"] == 1 and before["RELU_0_TO_1"] == 1, before
    rewritten, done = rewrite_for_int8(blob)
    after = _ops(rewritten)
    assert "HARD_SWISH" not in after and "RELU_0_TO_1" not in after
    assert {r.op: r.count for r in done} == {"HARD_SWISH": 1, "RELU_0_TO_1": 1}
    assert after["RELU6"] == 2 and after["MUL"] - before["MUL"] == 2 + 2
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = (rng.standard_normal((1, 24, 24, 3)) * 3).astype(np.float32)  # hard-swish's bends at -3 and 3 hit
        np.testing.assert_allclose(_run(rewritten, x), _run(blob, x), rtol=1e-5, atol=1e-5)
    same, none = rewrite_for_int8(_float_tflite(_plain(), (1, 24, 24, 3)))
    assert none == []


def _plain():
    import keras
    from keras import layers

    inp = keras.Input((24, 24, 3), batch_size=1)
    return keras.Model(inp, layers.Dense(3)(layers.GlobalAveragePooling2D()(layers.Conv2D(4, 3)(inp))))


@pytest.mark.parametrize("source", ["keras", "tflite"])
def test_edgetpu_build_maps_every_op_after_the_rewrite(tmp_path, source):
    """Without the rewrite the Edge TPU graph is cut at the first HARD_SWISH (op 2 of the int8
    graph); with it every op is predicted on the TPU, the manifest lists the rewrite and the
    int8 still passes the cosine gate against the original. A Keras source goes through
    TensorFlow's converter, a .tflite source (with a RELU_0_TO_1 too) through its own graph."""
    from edgekit.builders.build import build

    model = _hard_activations()
    if source == "keras":
        path, expected, count = tmp_path / "hard.keras", {"HARD_SWISH"}, 2
        model.save(path)
    else:
        path, expected, count = tmp_path / "hard.tflite", {"HARD_SWISH", "RELU_0_TO_1"}, 1
        path.write_bytes(_with_relu_0_to_1(_float_tflite(model, (1, 24, 24, 3))))
    [r] = build(path, ["edgetpu"], [FRAMES], out=tmp_path / "dist", quiet=True, task="raw", min_cosine=0.9)
    assert r.passed, r.error
    offline = r.manifest["edgetpu"]["offline"]
    assert offline["tpu_ops"] == offline["total_ops"] and offline["cut"] is None, offline
    entry = load_bundle(r.bundle).model("int8")
    assert {w["op"] for w in entry.extra["rewrites"]} == expected
    int8_ops = _ops((r.bundle / entry.file).read_bytes())
    assert not expected & set(int8_ops)
    assert f"rewrote HARD_SWISH x{count}" in (r.bundle / "build.log").read_text()
    before = offline["before_rewrites"]  # the int8 of the graph as it came: cut at the first hard activation
    assert before["tpu_ops"] < before["total_ops"] and any(op in before["cut"] for op in expected)
    import contextlib
    import io

    from edgekit.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(r.bundle)]) == 0
    assert f"Edge TPU before the rewrites (at build): {before['tpu_ops']}/{before['total_ops']} ops" in out.getvalue()


def test_score_logits_are_clamped_in_the_graph_before_int8():
    """A BlazeFace-like score output whose logits span hundreds one way: clamped to +-16 in the
    graph (names and order kept), int8 keeps far more distinct sigmoid scores where they matter."""
    import keras
    from keras import layers

    from edgekit.builders.graph.rewrite import clamp_outputs
    from edgekit.builders.int8.quantize import quantize_int8

    inp = keras.Input((8, 8, 3), batch_size=1)
    feat = layers.Flatten()(layers.Conv2D(2, 3)(inp))
    boxes = layers.Dense(16, name="regressors")(feat)
    logits = layers.Dense(32, name="classificators")(feat)
    logits = layers.Rescaling(60.0, -250.0)(logits)  # logits far below zero, as BlazeFace's
    blob = _float_tflite(keras.Model(inp, [boxes, logits]), (1, 8, 8, 3))
    from ai_edge_litert.interpreter import Interpreter

    names = [d["name"] for d in Interpreter(model_content=blob).get_output_details()]
    sizes = [int(np.prod(d["shape"])) for d in Interpreter(model_content=blob).get_output_details()]
    position = sizes.index(32)  # the scores, wherever the converter listed them
    clamped = clamp_outputs(blob, [position], 16.0)
    assert [d["name"] for d in Interpreter(model_content=clamped).get_output_details()] == names
    rng = np.random.default_rng(0)
    data = rng.random((32, 8, 8, 3), dtype=np.float32)
    x = data[:1]
    raw, cut = _run_all(blob, x), _run_all(clamped, x)
    np.testing.assert_allclose(cut[position], np.clip(raw[position], -16, 16), rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(cut[1 - position], raw[1 - position])
    assert _run_all(clamped, x)[position].min() >= -16.0 - 1e-6
    levels = []
    for model in (blob, clamped):
        q = quantize_int8(model, data)
        detail = Interpreter(model_content=q).get_output_details()[position]
        levels.append(detail["quantization"][0])
    assert levels[1] * 5 < levels[0] and levels[1] <= 32 / 255 + 1e-6  # a finer int8 step for the scores
    # a build verifies the clamped model against the original clamped the same way (Rewrite.expect)
    from types import SimpleNamespace

    from edgekit.builders.graph.rewrite import source_expect
    from edgekit.builders.int8.recipe import _clamped

    outputs = [SimpleNamespace(name=n) for n in ("a", "b")]
    _, rewrite = _clamped(SimpleNamespace(source=SimpleNamespace(outputs=outputs)), blob, position, 16.0, False)
    expect = source_expect([rewrite], [0, 1])
    np.testing.assert_array_equal(expect[position](raw[position]), cut[position])
    assert expect[1 - position] is None  # the other output is compared as it is
    from edgekit.builders.graph.clamps import clamped_ranges  # what the quantisation report judges within the clamp

    ranges = clamped_ranges(clamped)
    assert ranges[names[position] + "/unclamped"] == (-16.0, 16.0) and not set(ranges) & set(names)
    assert clamped_ranges(blob) == {}


def _run_all(blob: bytes, x: np.ndarray) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=blob)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]


def test_only_sigmoid_ssd_scores_are_clamped():
    from types import SimpleNamespace

    from edgekit.builders.graph.rewrite import score_clamp

    def gate(layout="ssd", activation="sigmoid", decode=None, roles=(0, 1)):
        config = SimpleNamespace(score_activation=activation, ssd_decode=decode)
        return SimpleNamespace(layout=layout, roles=roles, detector=SimpleNamespace(config=config))

    assert score_clamp(None) is None
    assert score_clamp(gate()) == (1, 16.0)
    assert score_clamp(gate(decode=SimpleNamespace(sigmoid_score=True, score_clipping_thresh=6.0))) == (1, 6.0)
    assert score_clamp(gate(decode=SimpleNamespace(sigmoid_score=True, score_clipping_thresh=100.0))) == (1, 16.0)
    assert score_clamp(gate(activation="softmax")) is None and score_clamp(gate(layout="yolo")) is None
    assert score_clamp(gate(roles=(1, 0))) == (0, 16.0)
    # auto: the decoder's sigmoid applies to scores outside [0, 1], which the float model's outputs show
    seen = []
    assert score_clamp(gate(activation="auto"), lambda i: seen.append(i) or True) == (1, 16.0) and seen == [1]
    assert score_clamp(gate(activation="auto"), lambda i: False) is None
    assert score_clamp(gate(activation="auto")) is None  # nothing to look at: left as it is
    assert score_clamp(gate(activation="none"), lambda i: True) is None


def test_mediapipe_box_regressors_are_clamped_to_twice_their_scale():
    from types import SimpleNamespace

    from edgekit.builders.graph.rewrite import box_clamp

    def gate(decode, layout="ssd", roles=(0, 1)):
        config = SimpleNamespace(score_activation="sigmoid", ssd_decode=decode)
        return SimpleNamespace(layout=layout, roles=roles, detector=SimpleNamespace(config=config))

    blaze = SimpleNamespace(x_scale=128.0, y_scale=128.0, w_scale=128.0, h_scale=128.0)
    assert box_clamp(gate(blaze)) == (0, 256.0)
    assert box_clamp(gate(blaze, roles=(1, 0))) == (1, 256.0)
    assert box_clamp(gate(None)) is None  # TF-OD decode (exp sizes): left as it is
    assert box_clamp(gate(blaze, layout="yolo")) is None and box_clamp(None) is None
