"""An output whose producer int8 recovery keeps in float stays float (edgekit/builders/int8/float_outputs.py).

One small Keras model with a known answer: ``mask = sigmoid(conv(relu(conv(x))))`` is an output and also
feeds ``score = dense(mean(mask))``. With the sigmoid kept in float (TensorFlow's ``denylisted_nodes``, as
recovery asks), TensorFlow still rounds the mask to uint8 through two QUANTIZE ops; the edit makes the
mask output the sigmoid's own float tensor, keeps the QUANTIZE that also feeds the score's int8 ops, and
leaves the score output uint8 and bit for bit as it was. The freed mask then lies within half an int8 step
of the rounded one, closer to the float model's than that, and takes more than 256 values.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

SIDE = 8


@pytest.fixture(scope="module")
def models():
    """(float blob, int8 with the sigmoid in float, calibration images)."""
    import keras
    from keras import layers

    from edgekit.builders.int8.quantize import quantize_int8
    from edgekit.builders.tf import import_tf

    tf = import_tf()
    keras.utils.set_random_seed(0)
    inp = keras.Input((SIDE, SIDE, 3))
    x = layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
    mask = layers.Conv2D(1, 3, padding="same", activation="sigmoid", name="mask")(x)
    score = layers.Dense(2, name="score")(layers.GlobalAveragePooling2D()(mask))
    blob = tf.lite.TFLiteConverter.from_keras_model(keras.Model(inp, [mask, score])).convert()
    rng = np.random.default_rng(0)
    images = [rng.random((SIDE, SIDE, 3), dtype=np.float32) for _ in range(16)]
    return blob, quantize_int8(blob, images, "uint8", denylisted_nodes=[_logistic_output(blob)]), images


def _ops(blob: bytes) -> list[str]:
    from edgekit.builders.graph.edit import load_schema, read

    _, fb = load_schema()
    model = read(blob)
    return [fb.opcode_to_name(model, op.opcodeIndex) for op in model.subgraphs[0].operators]


def _logistic_output(blob: bytes) -> str:
    """The name of the float model's sigmoid output tensor (what recovery's denylist names)."""
    from edgekit.builders.graph.edit import load_schema, read

    _, fb = load_schema()
    model = read(blob)
    sg = model.subgraphs[0]
    (op,) = [op for op in sg.operators if fb.opcode_to_name(model, op.opcodeIndex) == "LOGISTIC"]
    return sg.tensors[op.outputs[0]].name.decode()


def _outputs(blob: bytes, x: np.ndarray) -> dict[str, tuple[np.ndarray, str]]:
    """Each output by its signature key: (value dequantised, dtype)."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=blob).get_signature_runner()
    details = runner.get_input_details()
    (key, detail), = details.items()
    if detail["dtype"] != np.float32:
        scale, zero = detail["quantization"]
        x = np.clip(np.round(x / scale + zero), 0, 255).astype(np.uint8)
    found = {}
    for name, value in runner(**{key: x}).items():
        out = runner.get_output_details()[name]
        scale, zero = out["quantization"]
        found[name] = ((value.astype(np.float64) - zero) * scale if scale else value.astype(np.float64),
                       np.dtype(out["dtype"]).name)
    return found


def test_a_float_producers_output_stays_float_and_the_others_keep_int8(models):
    from edgekit.builders.int8.float_outputs import float_outputs, steps_apart

    float_blob, int8, images = models
    # the input, the sigmoid's float -> int8 -> uint8, the score's int8 -> uint8
    assert _ops(int8).count("QUANTIZE") == 4 and "DEQUANTIZE" in _ops(int8)
    edited, freed = float_outputs(int8)
    assert list(freed.values()) == ["output_0"]  # the mask output, by its signature key
    assert _ops(edited).count("QUANTIZE") == _ops(int8).count("QUANTIZE") - 1  # only the mask's requantise went
    x = images[0][None]
    before, after, reference = _outputs(int8, x), _outputs(edited, x), _outputs(float_blob, x)
    mask, score = (k for k in sorted(reference))  # output_0 the mask, output_1 the score (signature keys kept)
    assert (after[mask][1], after[score][1], before[mask][1]) == ("float32", "uint8", "uint8")
    assert np.array_equal(after[score][0], before[score][0])  # bit for bit: its int8 ops untouched
    step = 1 / 255  # the sigmoid's [0, 1] in 256 levels
    assert np.abs(after[mask][0] - before[mask][0]).max() <= step / 2 + 1e-6  # only the rounding went
    assert np.abs(after[mask][0] - reference[mask][0]).max() <= np.abs(before[mask][0] - reference[mask][0]).max()
    assert len(np.unique(after[mask][0])) > len(np.unique(before[mask][0]))
    assert steps_apart(int8, edited, freed, [img[None] for img in images[:4]]) <= 0.5 + 1e-3


def test_nothing_changes_without_a_float_producer(models):
    from edgekit.builders.int8.float_outputs import float_outputs
    from edgekit.builders.int8.quantize import quantize_int8

    float_blob, _, images = models
    whole = quantize_int8(float_blob, images, "uint8")  # full integer: every output's producer int8
    assert float_outputs(whole) == (whole, {})


def test_recovery_logs_the_freed_output_and_says_so_in_the_label(models):
    from edgekit.builders.int8.float_outputs import outputs_kept_float

    _, int8, images = models
    lines = []
    ctx = SimpleNamespace(representative=lambda: iter(images),
                          log=SimpleNamespace(info=lines.append, warn=lines.append))
    blob, label = outputs_kept_float(int8, ctx, SimpleNamespace(name="cpu"), "3 worst layers in float")
    assert label == "3 worst layers in float, float output" and blob != int8
    (line,) = lines
    assert line.startswith("[cpu] int8 recovery: 3 worst layers in float: output(s) 'output_0' "
                           "kept float, as their producer is (the trailing QUANTIZE dropped; within 0.")
