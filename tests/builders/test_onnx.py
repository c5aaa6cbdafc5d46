"""The jetson FP16 ONNX of a model shaped like an Ultralytics export (builders/onnx.py ``to_fp16``).

Ultralytics upsamples with ``Resize(x, '', scales)`` (scales a float32 initializer) and its
onnxslim pass writes every value_info twice. onnxconverter-common keeps Resize in float32
between Casts but retypes only the first value_info of a name, so the model it wrote did not
load in ONNX Runtime ("Type (tensor(float)) of output arg (...Resize_output_0) of node
(...Resize_output_cast0) does not match expected type (tensor(float16))"). The model here is
made with onnx.helper in milliseconds: no ultralytics needed to catch the regression.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.builders.onnx import to_fp16


def upsample_model(path, duplicate_value_info: bool = True):
    """Conv -> SiLU -> Resize x2 (float32 scales initializer) -> Concat with a skip -> Conv: a
    YOLOv8 neck in small ([1,3,16,16] -> [1,4,32,32]); value_info listed twice as onnxslim does."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "b1"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        numpy_helper.from_array(rng.normal(0, 0.3, (4, 11, 1, 1)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="/model.0/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"], name="/model.0/act/Sigmoid"),
        helper.make_node("Mul", ["c1", "s1"], ["a1"], name="/model.0/act/Mul"),
        helper.make_node("Resize", ["a1", "", "scales"], ["up"], name="/model.10/Resize", mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Resize", ["x", "", "scales"], ["skip"], name="/model.13/Resize", mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Concat", ["up", "skip"], ["cat"], name="/model.11/Concat", axis=1),
        helper.make_node("Conv", ["cat", "w2"], ["y"], name="/model.22/Conv"),
    ]
    shapes = {"c1": [1, 8, 16, 16], "s1": [1, 8, 16, 16], "a1": [1, 8, 16, 16], "up": [1, 8, 32, 32],
              "skip": [1, 3, 32, 32], "cat": [1, 11, 32, 32]}
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]
    graph = helper.make_graph(nodes, "neck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 32, 32])], inits,
                              value_info=info + (info if duplicate_value_info else []))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_model_reproduces_the_upstream_resize_type_error(tmp_path):
    """If this starts passing without the workaround, onnxconverter-common fixed its side and the
    value_info dedupe in to_fp16 can go (keep the rest of this file)."""
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(onnx.load(str(upsample_model(tmp_path / "m.onnx"))),
                                             keep_io_types=True)
    onnx.save(model, str(tmp_path / "plain16.onnx"))
    with pytest.raises(Exception, match=r"Resize_output_cast0\) does not match expected type \(tensor\(float16\)\)"):
        ort.InferenceSession(str(tmp_path / "plain16.onnx"), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("duplicated", [True, False])
def test_fp16_of_an_ultralytics_style_upsample_runs_and_agrees_with_fp32(tmp_path, duplicated):
    src = upsample_model(tmp_path / "fp32.onnx", duplicate_value_info=duplicated)
    to_fp16(src, tmp_path / "fp16.onnx")
    model = onnx.load(str(tmp_path / "fp16.onnx"))
    types = {i.name: i.data_type for i in model.graph.initializer}
    # weights are float16; Resize's scales stay float32 (the op takes only float32 scales)
    assert types == {"w1": TensorProto.FLOAT16, "b1": TensorProto.FLOAT16, "w2": TensorProto.FLOAT16,
                     "scales": TensorProto.FLOAT}
    assert [i.type.tensor_type.elem_type for i in (*model.graph.input, *model.graph.output)] == [TensorProto.FLOAT] * 2
    assert len({v.name for v in model.graph.value_info}) == len(model.graph.value_info)
    resize_in = [n.input[0] for n in model.graph.node if n.op_type == "Resize"]
    casts = {n.output[0]: n.attribute[0].i for n in model.graph.node if n.op_type == "Cast"}
    assert len(resize_in) == 2 and {casts.get(i) for i in resize_in} <= {TensorProto.FLOAT, None}
    x = np.random.default_rng(1).random((2, 1, 3, 16, 16), np.float32)
    for frame in x:
        want, got = _run(src, frame), _run(tmp_path / "fp16.onnx", frame)
        assert got.dtype == np.float32 and got.shape == (1, 4, 32, 32)
        assert np.abs(got - want).max() < 5e-3 * np.abs(want).max()
        cosine = float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want))
        assert cosine > 0.99999

