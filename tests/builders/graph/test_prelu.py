"""PRELU in ops XNNPACK runs in int8 (edgekit/builders/graph/prelu.py): exact in float against
numpy's ``where(x > 0, x, alpha * x)``, and after TensorFlow's int8 quantiser every node on
XNNPACK with PRELU's values kept. A one-op model built here, so its right answer is known."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edgekit.builders.graph import edit, prelu

ALL_AT_MOST_ONE = [0.25, 0.0, 1.0, 0.5, -0.5, 0.9, 0.1, -1.5]
MIXED = [0.25, -0.5, 0.0, 1.0, 3.0, 0.9, 12.0, -4.0]  # slopes past 1 and below 0, as MediaPipe's palm has


def _prelu_model(alpha, alpha_shape=None, channels: int = 8, hw=(4, 4)) -> bytes:
    """A float TFLite graph: input [1, H, W, channels] -> PRELU(alpha) -> output."""
    schema, _ = edit.load_schema()
    alpha = np.asarray(alpha, np.float32)
    model = schema.ModelT()
    model.version, model.buffers, model.subgraphs = 3, [schema.BufferT()], [schema.SubGraphT()]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = prelu.PRELU
    code.version = 1
    model.operatorCodes = [code]
    sg = model.subgraphs[0]
    sg.tensors = []
    for name, shape, data in (("x", (1, *hw, channels), None),
                              ("alpha", alpha_shape or (1, 1, channels), alpha),
                              ("y", (1, *hw, channels), None)):
        tensor = schema.TensorT()
        tensor.name, tensor.shape, tensor.type = name.encode(), list(shape), edit.FLOAT32
        tensor.buffer = 0 if data is None else edit.new_buffer(model, data.reshape(shape))
        sg.tensors.append(tensor)
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2]
    sg.operators, sg.inputs, sg.outputs = [op], [0], [2]
    return edit.write(model)


def _interpreter(blob: bytes, xnnpack: bool = False):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    interp = Interpreter(model_content=blob, experimental_op_resolver_type=resolver)
    interp.allocate_tensors()
    return interp


def _run(interp, x: np.ndarray) -> np.ndarray:
    """The output for float ``x``, through the input's and output's int8 scales when quantised."""
    src, dst = interp.get_input_details()[0], interp.get_output_details()[0]
    if src["dtype"] == np.int8:
        scale, zero = src["quantization"]
        x = np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8)
    interp.set_tensor(src["index"], x)
    interp.invoke()
    y = np.array(interp.get_tensor(dst["index"]), np.float64)
    if dst["dtype"] == np.int8:
        scale, zero = dst["quantization"]
        y = (y - zero) * scale
    return y


def _ops(blob: bytes) -> Counter:
    return Counter(o["op_name"] for o in _interpreter(blob)._get_ops_details())


def _inputs(n: int, channels: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((1, 4, 4, channels)) * 2).astype(np.float32) for _ in range(n)]


def _want(x: np.ndarray, alpha) -> np.ndarray:
    return np.where(x > 0, x, np.asarray(alpha, np.float32) * x)


@pytest.mark.parametrize(("alpha", "ops"), [
    (ALL_AT_MOST_ONE, {"DEPTHWISE_CONV_2D": 1, "ADD": 1}),
    (MIXED, {"MUL": 1, "SUB": 1, "DEPTHWISE_CONV_2D": 1, "ADD": 1}),
])
def test_prelu_becomes_ops_xnnpack_maps_and_computes_the_same(alpha, ops):
    blob = _prelu_model(alpha)
    rewritten, count = prelu.rewrite_prelu(blob)
    assert count == 1
    assert _ops(rewritten) == Counter(ops)
    interp = _interpreter(rewritten)
    for x in _inputs(4):
        np.testing.assert_allclose(_run(interp, x), _want(x, alpha), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(1,), (1, 1, 1)])
def test_one_slope_for_every_channel_is_spread_over_them(shape):
    rewritten, count = prelu.rewrite_prelu(_prelu_model([0.2], alpha_shape=shape))
    assert count == 1 and _ops(rewritten) == Counter({"DEPTHWISE_CONV_2D": 1, "ADD": 1})
    for x in _inputs(2):
        np.testing.assert_allclose(_run(_interpreter(rewritten), x), _want(x, 0.2), rtol=1e-6, atol=1e-6)


def test_int8_runs_wholly_on_xnnpack_and_keeps_prelus_values():
    """Quantised as it is, the PRELU stays on LiteRT's built-in kernel; rewritten, XNNPACK takes
    every node and the int8 output is within two of its steps of the exact answer (PRELU's own
    int8 kernel, with its slope in one per-tensor scale, is within 1.1 of them here)."""
    from edgekit.builders.int8.quantize import quantize_int8
    from edgekit.runtime.litert import delegated_nodes

    blob, calibration = _prelu_model(MIXED), [x[0] for x in _inputs(16)]
    for graph, on_xnnpack in ((blob, 0), (prelu.rewrite_prelu(blob)[0], 4)):
        interp = _interpreter(quantize_int8(graph, calibration, io_dtype="int8"), xnnpack=True)
        assert len(delegated_nodes(interp._get_ops_details())) == on_xnnpack
        step = interp.get_output_details()[0]["quantization"][0]
        worst = max(float(np.max(np.abs(_run(interp, x) - _want(x, MIXED)))) for x in _inputs(16))
        assert worst <= 2 * step, (worst, step)


def test_prelus_it_cannot_carry_are_left_as_they_are():
    """A slope that varies over height and width (not per channel) is not a depthwise weight."""
    blob = _prelu_model(np.linspace(-1, 1, 4 * 4 * 8), alpha_shape=(4, 4, 8))
    assert prelu.rewrite_prelu(blob) == (blob, 0)


class _Log:
    def __init__(self):
        self.lines = []

    def info(self, line):
        self.lines.append(line)

    warn = info


def test_only_an_xnnpack_target_gets_the_rewrite():
    """The Edge TPU maps PRELU itself: its int8 graph keeps it; a CPU target's is rewritten,
    checked against the original in float and logged."""
    from edgekit.builders.graph.rewrite import rewrite_checked

    blob, images = _prelu_model(MIXED), [x[0] for x in _inputs(2)]
    assert rewrite_checked(blob, images, _Log(), "edgetpu") == (blob, [])
    log = _Log()
    rewritten, done = rewrite_checked(blob, images, log, "cpu", xnnpack=True)
    assert [(r.op, r.count) for r in done] == [("PRELU", 1)]
    assert "PRELU" not in _ops(rewritten)
    assert "rewrote PRELU x1 into" in log.lines[0]
