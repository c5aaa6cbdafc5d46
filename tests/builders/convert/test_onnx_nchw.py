"""An ONNX model's NHWC input made NCHW (for RKNN-Toolkit2): the same function, checked in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.builders.convert.onnx_nchw import to_nchw
from edgekit.errors import ModelError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def conv_model(path, shape, nhwc: bool):
    """A 3x3 convolution over 3 channels; channels-last when ``nhwc`` (Transposes around it, as tf2onnx writes)."""
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    first = "x_nchw" if nhwc else "x"
    nodes = ([helper.make_node("Transpose", ["x"], ["x_nchw"], perm=[0, 3, 1, 2])] if nhwc else []) + [
        helper.make_node("Conv", [first, "w"], ["y"], pads=[1, 1, 1, 1])]
    out = [1, 4, *shape[1:3]] if nhwc else [1, 4, *shape[2:]]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_an_nhwc_input_becomes_nchw_and_the_outputs_do_not_change(tmp_path):
    src = conv_model(tmp_path / "nhwc.onnx", [1, 6, 5, 3], nhwc=True)
    io = to_nchw(src, tmp_path / "nchw.onnx", (6, 5, 3), "NHWC")
    assert (io.input, io.shape, io.outputs, io.transposed) == ("x", (1, 3, 6, 5), ("y",), True)
    x = np.random.default_rng(1).random((1, 6, 5, 3), dtype=np.float32)
    assert np.allclose(run(tmp_path / "nchw.onnx", x.transpose(0, 3, 1, 2)), run(src, x), atol=1e-6)


def test_an_nchw_input_is_kept_with_its_batch_fixed(tmp_path):
    src = conv_model(tmp_path / "nchw.onnx", ["batch", 3, 6, 5], nhwc=False)
    io = to_nchw(src, tmp_path / "out.onnx", (6, 5, 3), "NCHW")
    assert (io.shape, io.transposed) == ((1, 3, 6, 5), False)
    dims = [d.dim_value for d in onnx.load(str(tmp_path / "out.onnx")).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 6, 5]


def test_an_input_of_another_size_is_refused_in_one_line(tmp_path):
    src = conv_model(tmp_path / "nchw.onnx", [1, 3, 6, 5], nhwc=False)
    with pytest.raises(ModelError, match=r"input x has shape \[1, 3, 6, 5\], not \[1, 3, 8, 8\]"):
        to_nchw(src, tmp_path / "out.onnx", (8, 8, 3), "NCHW")
