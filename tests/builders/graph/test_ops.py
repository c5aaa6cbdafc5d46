"""The shared float-graph edits (edgekit/builders/graph/ops.py): a scalar constant, a new activation
tensor and an operator, appended to a converted graph, run as TFLite runs them."""

from __future__ import annotations

import numpy as np

from edgekit.builders.graph import edit, ops
from tests.helpers.yolo_graph import images, run, yolo_tflite


def test_appended_ops_compute_what_they_say():
    original = yolo_tflite(16, 1)
    model = edit.read(original)
    sg = model.subgraphs[0]
    out = int(sg.outputs[0])
    scaled, shifted = ops.temp(model, sg, out, "scaled"), ops.temp(model, sg, out, "shifted")
    assert sg.tensors[scaled].name.endswith(b"/scaled")
    assert list(sg.tensors[scaled].shape) == list(sg.tensors[out].shape)
    sg.operators += [ops.op(model, sg, ops.MUL, [out, ops.scalar(model, sg, 2.0)], scaled),
                     ops.op(model, sg, ops.ADD, [scaled, ops.scalar(model, sg, 3.0)], shifted)]
    sg.outputs = [shifted]
    for sig in model.signatureDefs or []:
        for item in sig.outputs or []:
            item.tensorIndex = shifted
    edited = edit.write(model)
    for x in images(2, 16):
        np.testing.assert_allclose(run(edited, x), run(original, x) * 2 + 3, rtol=1e-6, atol=1e-5)
