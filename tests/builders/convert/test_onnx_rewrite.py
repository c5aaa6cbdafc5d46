"""MaxPool padding (edgekit/builders/convert/onnx_rewrite.py): a pool whose explicit pads are TF's SAME is
left to onnx2tf, which makes it one MAX_POOL_2D padding=SAME (no PAD/PADV2 in front: YOLOv8's SPPF
k5 s1 p2 pools); other padded pools still get the explicit finite Pad they needed before."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.builders.convert.onnx_rewrite import pad_maxpools, same_maxpools, same_padded


def _pool_onnx(kernel: int, stride: int, pads: int, size: int, relu: bool = False, auto_pad: str | None = None):
    """``x [1, 4, size, size] -> Conv 1x1 -> (SiLU | ReLU) -> MaxPool``: SiLU can be negative,
    as before YOLOv8's SPPF pools."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["a"]))
    else:
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["a"])]
    pool = {"auto_pad": auto_pad} if auto_pad else {"pads": [pads] * 4}
    nodes.append(helper.make_node("MaxPool", ["a"], ["y"], kernel_shape=[kernel] * 2, strides=[stride] * 2, **pool))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("kernel, stride, pads, size", [(5, 1, 2, 20), (3, 1, 1, 7), (3, 2, 1, 15)])
def test_a_pool_whose_pads_are_tf_same_is_left_for_a_same_pool_with_the_same_outputs(kernel, stride, pads, size):
    model = _pool_onnx(kernel, stride, pads, size)
    before = model.SerializeToString()
    assert same_maxpools(model) == 1
    assert pad_maxpools(model, {"a": -1.0}) == 0  # no Pad node: onnx2tf maps it to padding=SAME
    assert model.SerializeToString() == before
    x = np.random.default_rng(1).normal(0, 2, (1, 4, size, size)).astype(np.float32)
    # numerically: ONNX's pads equal TF's SAME (ONNX Runtime's SAME_UPPER is TF's rule), negatives included
    same = _pool_onnx(kernel, stride, pads, size, auto_pad="SAME_UPPER")
    np.testing.assert_array_equal(_run(model, x), _run(same, x))


@pytest.mark.parametrize("kernel, stride, pads, size", [(3, 2, 1, 16), (3, 2, 1, 32)])
def test_a_pool_with_pads_tf_same_would_place_otherwise_still_gets_its_explicit_pad(kernel, stride, pads, size):
    """torchvision's ResNet stem pool (k3 s2 p1 on an even size): TF's SAME pads (0, 1), ONNX (1, 1)."""
    model = _pool_onnx(kernel, stride, pads, size, relu=True)
    x = np.random.default_rng(2).normal(0, 1, (1, 4, size, size)).astype(np.float32)
    want = _run(model, x)
    assert same_maxpools(model) == 0
    assert pad_maxpools(model) == 1
    assert [n.op_type for n in model.graph.node][-2:] == ["Pad", "MaxPool"]
    np.testing.assert_allclose(_run(model, x), want, rtol=1e-6)


def test_same_padding_rule_matches_tensorflow():
    assert same_padded([5, 5], [1, 1], [1, 1], [2, 2, 2, 2], [20, 20])
    assert same_padded([3, 3], [2, 2], [1, 1], [1, 1, 1, 1], [15, 15])
    assert not same_padded([3, 3], [2, 2], [1, 1], [1, 1, 1, 1], [16, 16])  # SAME is (0, 1)
    assert same_padded([2, 2], [2, 2], [1, 1], [0, 0, 1, 1], [15, 15])  # odd total: the extra cell at the end
    assert not same_padded([5, 5], [1, 1], [1, 1], [2, 2, 2, 2], [20, 20], ceil_mode=True)
    assert not same_padded([3, 3], [1, 1], [2, 2], [2, 2, 2, 2], [20, 20])  # dilated: left to the explicit Pad
    assert not same_padded([3, 3], [1, 1], [1, 1], [0, 0, 0, 0], [20, 20])  # unpadded: nothing to do
