"""One-element constant operands given as scalars (edgekit/builders/convert/onnx_rewrite.py
:func:`scalar_operands`), on a PaddlePaddle-style block as PP-OCRv4's text detector has it: a
convolution, a learnable scale and bias of shape ``[1]`` (Constant nodes), a hard swish written
as Add/Clip/Mul/Div, a depthwise convolution. onnx2tf runs the ops after an Add of a ``[1]``
constant in NCHW between TRANSPOSEs and makes the depthwise Conv a grouped CONV_2D; with scalars,
neither (the slow test converts it for real)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.builders.convert.onnx_rewrite import scalar_operands

C, H, W = 8, 6, 10


def _block(shape: list[int] | None = None):
    """``x [1, 3, 6, 10]`` -> Conv -> ``s * x + b`` (``shape``: the constants', ``[1]``) -> hard swish
    -> depthwise Conv -> ``* s + b`` -> Conv 1x1 -> ``y``."""
    rng = np.random.default_rng(0)
    shape = [1] if shape is None else shape
    nodes = []

    def const(name, value):
        tensor = numpy_helper.from_array(np.asarray(value, np.float32), name)
        nodes.append(helper.make_node("Constant", [], [name], value=tensor))

    const("w0", rng.normal(0, 0.3, (C, 3, 3, 3)))
    const("wd", rng.normal(0, 0.3, (C, 1, 3, 3)))
    const("w1", rng.normal(0, 0.3, (4, C, 1, 1)))
    const("s", np.full(shape, 0.9))
    const("b", np.full(shape, 0.1))
    for name, value in (("three", 3.0), ("zero", 0.0), ("six", 6.0)):
        const(name, np.array(value))
    nodes += [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
              helper.make_node("Mul", ["s", "c0"], ["m0"]), helper.make_node("Add", ["m0", "b"], ["a0"]),
              helper.make_node("Add", ["a0", "three"], ["a1"]), helper.make_node("Clip", ["a1", "zero", "six"], ["cl"]),
              helper.make_node("Mul", ["a0", "cl"], ["m1"]), helper.make_node("Div", ["m1", "six"], ["hs"]),
              helper.make_node("Conv", ["hs", "wd"], ["dw"], pads=[1, 1, 1, 1], group=C),
              helper.make_node("Mul", ["dw", "s"], ["m2"]), helper.make_node("Add", ["m2", "b"], ["a2"]),
              helper.make_node("Conv", ["a2", "w1"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, H, W])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, H, W])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])


def _run(model, x):
    """ONNX Runtime without its graph optimisations (which fuse a [1] and a 0-D operand differently)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _inputs(n: int = 3):
    rng = np.random.default_rng(1)
    return [rng.normal(0, 1, (1, 3, H, W)).astype(np.float32) for _ in range(n)]


def test_one_element_operands_become_scalars_with_the_same_outputs():
    model, reference = _block(), _block()
    assert scalar_operands(model) == 4  # s and b, twice each; 3, 6 are scalars already
    scalars = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert sorted(scalars) == ["b_scalar", "s_scalar"] and all(v.shape == () for v in scalars.values())
    for x in _inputs():
        np.testing.assert_array_equal(_run(model, x), _run(reference, x))


def test_an_operand_whose_broadcast_would_change_the_shape_stays():
    """``[1, 1, 1, 1]`` against a rank-4 tensor becomes a scalar; against a 0-D tensor the ``[1]``
    constant would drop the output's axis: it stays."""
    model = _block([1, 1, 1, 1])
    assert scalar_operands(model) == 4
    lone = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([2.0], np.float32), "k")),
         helper.make_node("ReduceSum", ["x"], ["t"], keepdims=0), helper.make_node("Add", ["t", "k"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    small = helper.make_model(lone, opset_imports=[helper.make_opsetid("", 12)])
    assert scalar_operands(small) == 0 and _run(small, _inputs(1)[0]).shape == (1,)


def _converted(model, tmp_path, flags: dict) -> list[str]:
    """The float TFLite ops of ``model`` as edgekit's onnx2tf job (with onnx2tf's ``flags``) and
    TensorFlow's converter make it."""
    from edgekit.builders.convert.onnx2tf_job import SAMPLE_FILE
    from edgekit.builders.convert.to_tflite import convert
    from edgekit.builders.graph import edit

    tmp_path.mkdir()
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / SAMPLE_FILE, np.random.default_rng(0).random((4, H, W, 3), dtype=np.float32))
    (tmp_path / "job.json").write_text(json.dumps({"onnx": "model.onnx", "input": "x", "layout": "NCHW",
                                                   "keys": ["y"], "flags": flags}))
    subprocess.run([sys.executable, "-m", "edgekit.builders.convert.onnx2tf_job", "job.json"], cwd=tmp_path,
                   capture_output=True, text=True, timeout=600, check=False)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"], result
    _, fb = edit.load_schema()
    tflite = edit.read(convert(tmp_path / "saved_model", "fp32"))
    return [fb.opcode_to_name(tflite, op.opcodeIndex) for op in tflite.subgraphs[0].operators]


@pytest.mark.slow
def test_onnx2tf_leaves_no_transpose_and_a_depthwise_conv_with_scalars(tmp_path):
    """Real onnx2tf, both ways: the cause as it is, and gone."""
    # strict mode fails on the block as exported, as on PP-OCRv4 det: edgekit's -dsm fallback
    as_exported = _converted(_block(), tmp_path / "as_exported", {"disable_strict_mode": True})
    assert "TRANSPOSE" in as_exported and "DEPTHWISE_CONV_2D" not in as_exported
    model = _block()
    scalar_operands(model)
    fixed = _converted(model, tmp_path / "scalars", {})  # and strict mode passes
    assert "TRANSPOSE" not in fixed and "DEPTHWISE_CONV_2D" in fixed
