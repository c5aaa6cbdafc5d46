"""The int8 quantiser's calibration ranges (edgekit/builders/int8/quantize.py): TensorFlow's
calibrator logs an in-place op's input with the op's output values (tensorflow/tensorflow#127842);
edgekit observes every tensor itself and quantises with the ranges the tensors really had."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")


def _two_branch_float_model() -> bytes:
    """score = (12 r - 9) + (-532 relu(0.5 - r)), r a cell's mean red: the linear branch spans
    [-9, 3], the sum down to -275. The ADD may write over an input (it is not the graph output)."""
    import keras
    import tensorflow as tf
    from keras import layers

    inp = keras.Input((16, 16, 3))
    pooled = layers.AveragePooling2D(4)(inp)
    lin, hinge = layers.Conv2D(1, 1, name="linear"), layers.Conv2D(1, 1, activation="relu")
    steep = layers.Conv2D(1, 1, use_bias=False)
    model = keras.Model(inp, layers.Reshape((16, 1))(layers.Add()([lin(pooled), steep(hinge(pooled))])))
    lin.set_weights([np.array([12, 0, 0], np.float32).reshape(1, 1, 3, 1), np.array([-9], np.float32)])
    hinge.set_weights([np.array([-1, 0, 0], np.float32).reshape(1, 1, 3, 1), np.array([0.5], np.float32)])
    steep.set_weights([np.array([-532], np.float32).reshape(1, 1, 1, 1)])
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def _samples(n: int = 24) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.uniform(0, 1, (16, 16, 3)).astype(np.float32) for _ in range(n)]


def _linear_branch_range(blob: bytes) -> float:
    """The int8 range (max - min representable) of the linear conv's output tensor."""
    from edgekit.builders.graph import edit

    model = edit.read(blob)
    [tensor] = [t for t in model.subgraphs[0].tensors if b"linear" in t.name and t.quantization is not None
                and t.quantization.scale is not None and t.type != edit.FLOAT32
                and edit.constant_data(model, t) is None]
    return float(tensor.quantization.scale[0]) * 255


def test_each_tensor_is_quantised_on_the_range_it_really_had():
    from tensorflow.lite.python.convert import mlir_quantize
    from tensorflow.lite.python.optimize import calibrator

    from edgekit.builders.int8.quantize import RangeObserver, quantize_int8

    blob, samples = _two_branch_float_model(), _samples()
    fixed = _linear_branch_range(quantize_int8(blob, samples, "uint8"))
    assert 1.0 < fixed <= 12.5  # within the linear branch's [-9, 3], not the sum's 275 wide
    # TensorFlow's own calibration, for the record: the linear branch gets the sum's range
    prepared = calibrator.add_intermediate_tensors(blob)
    logged = calibrator.Calibrator(prepared).calibrate(lambda: ([x[None]] for x in samples))
    assert _linear_branch_range(mlir_quantize(logged)) > 10 * fixed
    assert _linear_branch_range(quantize_int8(blob, samples, "uint8", logged_ranges=True)) > 10 * fixed  # on request
    observer = RangeObserver(prepared)
    for x in samples:
        observer.observe(x[None])
    assert _linear_branch_range(mlir_quantize(observer.corrected(logged))) == pytest.approx(fixed)


def test_a_model_the_observer_cannot_run_keeps_the_calibrators_ranges():
    from edgekit.builders.int8.quantize import RangeObserver

    observer = RangeObserver(b"not a model")
    observer.observe(np.zeros((1, 16, 16, 3), np.float32))
    assert observer.failed and observer.corrected(b"calibrated") == b"calibrated"


def test_16x8_keeps_int16_activations_with_float_io_and_beats_int8():
    from ai_edge_litert.interpreter import Interpreter

    from edgekit.builders.int8.quantize import quantize_16x8, quantize_int8

    blob, samples = _two_branch_float_model(), _samples()
    outputs = {}
    for name, model in (("float", blob), ("int8", quantize_int8(blob, samples, "uint8")),
                        ("16x8", quantize_16x8(blob, samples))):
        interp = Interpreter(model_content=model)
        interp.allocate_tensors()
        inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
        if name == "16x8":
            assert inp["dtype"] == out["dtype"] == np.float32
            assert np.int16 in {d["dtype"] for d in interp.get_tensor_details()}
        rows = []
        for x in samples:
            scale, zero = inp["quantization"]
            feed = x[None] if inp["dtype"] == np.float32 else np.round(x[None] / scale + zero).astype(inp["dtype"])
            interp.set_tensor(inp["index"], feed)
            interp.invoke()
            value, (scale, zero) = interp.get_tensor(out["index"]).astype(np.float64), out["quantization"]
            rows.append(value if out["dtype"] == np.float32 else (value - zero) * scale)
        outputs[name] = np.concatenate([r.ravel() for r in rows])
    error = {k: float(np.abs(outputs[k] - outputs["float"]).max()) for k in ("int8", "16x8")}
    assert error["16x8"] < error["int8"] / 10
