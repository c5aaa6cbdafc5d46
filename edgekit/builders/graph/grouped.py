"""Grouped ``CONV_2D`` with one input channel per group written as ``DEPTHWISE_CONV_2D``, exactly.

TFLite's ``CONV_2D`` takes a filter ``[out, kh, kw, in / groups]``: with one input channel per
group (a filter ``[out, kh, kw, 1]`` on ``C > 1`` channels) it is a depthwise convolution. onnx2tf
writes an ONNX depthwise ``Conv`` (group = channels) so when its input came in NCHW (its layout
guess gone wrong: builders/graph/transposes.py): PP-OCRv4's text detector had 13 of its 14 so.
The Edge TPU's operation table and XNNPACK know depthwise convolutions as ``DEPTHWISE_CONV_2D``;
grouped ``CONV_2D`` support came to TFLite later, and TensorFlow's int8 quantiser left one (without
a bias, on a small graph) in float.

Output channel ``o`` of the grouped convolution reads input channel ``o // m`` (``m = out / C``
filters per group), as ``DEPTHWISE_CONV_2D`` with ``depth_multiplier = m`` orders them: the filter
``[out, kh, kw, 1]`` becomes ``[1, kh, kw, out]``, the bias, strides, padding, dilation and fused
activation stay. The outputs do not change (the caller checks them, builders/graph/rewrite.py).
"""

from __future__ import annotations

import numpy as np

from edgekit.builders.graph import edit

CONV_2D, DEPTHWISE_CONV_2D = 3, 4  # tflite::BuiltinOperator


def depthwise_convolutions(model) -> int:
    """Rewrite every float ``CONV_2D`` of ``model`` (the flatbuffer object, edited in place) that is
    a depthwise convolution (see the module doc) as ``DEPTHWISE_CONV_2D``; returns how many."""
    count = 0
    for sg in model.subgraphs:
        for op in sg.operators:
            if edit.opcode_of(model, op.opcodeIndex) == CONV_2D and _depthwise(model, sg, op):
                count += 1
    return count


def _depthwise(model, sg, op) -> bool:
    """Rewrite one ``CONV_2D`` when its filter holds one input channel per group; whether it did."""
    schema, _ = edit.load_schema()
    x, w = sg.tensors[int(op.inputs[0])], sg.tensors[int(op.inputs[1])]
    data = edit.constant_data(model, w)
    if data is None or w.type != edit.FLOAT32 or len(w.shape) != 4 or x.shape is None or len(x.shape) != 4:
        return False
    out, per_group, channels = int(w.shape[0]), int(w.shape[3]), int(x.shape[3])
    if per_group != 1 or channels <= 1 or out % channels:
        return False
    values = np.frombuffer(data.tobytes(), np.float32).reshape([int(d) for d in w.shape]).transpose(3, 1, 2, 0)
    tensor = schema.TensorT()
    tensor.shape, tensor.type = np.asarray(values.shape, np.int32), edit.FLOAT32
    tensor.name = (w.name or b"filter") + b"/depthwise"
    tensor.buffer = edit.new_buffer(model, np.ascontiguousarray(values))
    sg.tensors.append(tensor)
    conv, options = op.builtinOptions, schema.DepthwiseConv2DOptionsT()
    options.padding, options.strideW, options.strideH = conv.padding, conv.strideW, conv.strideH
    options.fusedActivationFunction = conv.fusedActivationFunction
    options.dilationWFactor, options.dilationHFactor = conv.dilationWFactor, conv.dilationHFactor
    options.depthMultiplier = out // channels
    dilated = max(int(conv.dilationWFactor or 1), int(conv.dilationHFactor or 1)) > 1
    op.opcodeIndex = edit.builtin_code_index(model, schema, DEPTHWISE_CONV_2D, 2 if dilated else 1)
    op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.DepthwiseConv2DOptions, options
    op.inputs = [int(op.inputs[0]), len(sg.tensors) - 1, *[int(t) for t in op.inputs[2:]]]
    return True
