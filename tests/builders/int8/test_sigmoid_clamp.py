"""An output sigmoid's input clamped to +-16 before int8 (edgekit/builders/int8/sigmoid_clamp.py).

A known answer: ``sigmoid((20 a - 10) + 400 b)`` of a two-channel image, ``a`` in [0, 1] everywhere and
``b`` 1 on one pixel of some calibration images, else 0, has logits from -10 to 410; one int8 scale for
them is a step of 420 / 255 = 1.65, so on the images without ``b`` every logit within 0.82 of 0 reads
exactly 0.5 and a probability of 0.69 comes out 0.5 (an error near 0.19). Clamped to +-16 the step is
32 / 255 = 0.125 (the input's own step moves the logit by 20 / 255 = 0.08): the error stays under 0.05;
in float nothing moves by more than sigmoid(16)'s 1.1e-7.
"""

from __future__ import annotations

import numpy as np
import pytest

SIDE = 8


def _model(sigmoid_is_output: bool = True) -> bytes:
    import keras
    from keras import layers

    from edgekit.builders.tf import import_tf

    tf = import_tf()
    inp = keras.Input((SIDE, SIDE, 2))
    # two convolutions, so that int8's per-channel weight scale holds 20 as exactly as 400
    near = layers.Conv2D(1, 1, kernel_initializer=keras.initializers.Constant([[[[20.0], [0.0]]]]),
                         bias_initializer=keras.initializers.Constant(-10.0))(inp)
    far = layers.Conv2D(1, 1, kernel_initializer=keras.initializers.Constant([[[[0.0], [400.0]]]]))(inp)
    logit = layers.Add()([near, far])
    out = layers.Activation("sigmoid")(logit)
    if not sigmoid_is_output:
        out = layers.Conv2D(1, 1, kernel_initializer=keras.initializers.Constant(2.0))(out)
    return tf.lite.TFLiteConverter.from_keras_model(keras.Model(inp, out)).convert()


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    """24 images: channel 0 uniform, channel 1 zero but for one pixel at 1 in every fourth."""
    rng = np.random.default_rng(0)
    found = []
    for i in range(24):
        x = np.zeros((SIDE, SIDE, 2), np.float32)
        x[..., 0] = rng.random((SIDE, SIDE), dtype=np.float32)
        x[0, 0, 1] = 1.0 if i % 4 == 0 else 0.0
        found.append(x)
    return found


def _outputs(blob: bytes, images: list[np.ndarray]) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=blob)
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    found = []
    for x in images:
        if inp["dtype"] != np.float32:
            scale, zero = inp["quantization"]
            x = np.clip(np.round(x / scale + zero), 0, 255).astype(inp["dtype"])
        interp.set_tensor(inp["index"], x[None])
        interp.invoke()
        y = interp.get_tensor(out["index"]).astype(np.float64)
        if out["dtype"] != np.float32:
            scale, zero = out["quantization"]
            y = (y - zero) * scale
        found.append(y)
    return np.concatenate(found)


def _ops(blob: bytes) -> list[str]:
    from edgekit.builders.graph.edit import load_schema, read

    _, fb = load_schema()
    model = read(blob)
    return [fb.opcode_to_name(model, op.opcodeIndex) for op in model.subgraphs[0].operators]


def test_the_clamp_keeps_the_float_outputs_and_gives_int8_a_fine_logit_step(images):
    from edgekit.builders.int8.quantize import quantize_int8
    from edgekit.builders.int8.sigmoid_clamp import clamp_sigmoid_inputs

    blob = _model()
    clamped, count = clamp_sigmoid_inputs(blob)
    assert count == 1 and _ops(clamped)[-3:] == ["MINIMUM", "MAXIMUM", "LOGISTIC"]
    assert np.abs(_outputs(clamped, images) - _outputs(blob, images)).max() <= 2e-7  # sigmoid(16) = 1 - 1.1e-7
    plain, fine = (quantize_int8(b, images, "uint8") for b in (blob, clamped))  # calibrated on every image
    judged = [x for i, x in enumerate(images) if i % 4]  # the images without the far logit
    truth, plain, fine = _outputs(blob, judged), _outputs(plain, judged), _outputs(fine, judged)
    assert np.abs(plain - truth).max() > 0.15  # a logit step of 1.65: 0.69 reads 0.5
    assert np.abs(fine - truth).max() < 0.05  # steps of 0.125 and 0.08 (slope at most 1/4), half an output step
    edge = (truth > 0.55) & (truth < 0.95)  # pixels just inside the mask: the int8 without the clamp says 0.5
    assert edge.any() and (plain[edge] == 0.5).mean() > (fine[edge] == 0.5).mean()


def test_a_sigmoid_inside_the_graph_is_left_alone():
    from edgekit.builders.int8.sigmoid_clamp import clamp_sigmoid_inputs

    blob = _model(sigmoid_is_output=False)
    assert clamp_sigmoid_inputs(blob) == (blob, 0)


def test_the_build_step_logs_the_clamp_and_lists_it_as_a_rewrite(images):
    from edgekit.builders.int8.sigmoid_clamp import sigmoid_clamped

    lines: list[str] = []
    log = type("Log", (), {"info": staticmethod(lines.append), "warn": staticmethod(lines.append)})
    blob, rewrite = sigmoid_clamped(_model(), iter(images), log, "cpu")
    assert rewrite.to_dict() == {"op": "LOGISTIC input", "count": 1, "into": "[-16, 16] (MINIMUM, MAXIMUM) before it"}
    (line,) = lines
    assert line.startswith("[cpu] int8: the input of 1 output sigmoid(s) clamped to [-16, 16] (MINIMUM, MAXIMUM) "
                           "before quantising (float outputs within ")
