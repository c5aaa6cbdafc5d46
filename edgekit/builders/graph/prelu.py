"""``PRELU`` of a float TFLite graph in ops XNNPACK runs in int8, before quantising for a CPU target.

XNNPACK's TFLite delegate takes ``PRELU`` in float only: in an int8 model each one stays on
LiteRT's built-in kernel and cuts the delegated graph in two (MediaPipe's face landmark model:
23 PRELU, 21 XNNPACK partitions, its int8 4-8x slower than its fp32). The delegate refuses an
int8 ``RELU`` too (quantised, its output scale differs from its input's), and ``MINIMUM`` and
``MAXIMUM`` in int8; an earlier PRELU -> RELU/MUL/ADD rewrite therefore gained nothing. Its int8
``DEPTHWISE_CONV_2D`` (a fused RELU included), ``MUL`` with a fused RELU, ``SUB`` and ``ADD``
are what it takes, so each PRELU with a per-channel constant slope becomes:

- every slope <= 1: ``x + DEPTHWISE_CONV_2D(x; alpha - 1, fused RELU)`` (DEPTHWISE_CONV_2D, ADD),
  since ``relu((alpha - 1) x) = (alpha - 1) min(x, 0)`` where ``alpha <= 1``;
- otherwise: ``r = MUL(x, 1; fused RELU)``, ``r + DEPTHWISE_CONV_2D(x - r; alpha)``
  (MUL, SUB, DEPTHWISE_CONV_2D, ADD).

The slope rides in a 1x1 depthwise convolution because int8 quantises its weights per channel,
one value each: every ``alpha`` stays exact (a MUL's constant would share one scale across the
channels). Measured on MediaPipe 0.10.14 with XNNPACK, one thread, side by side on a loaded
2-core x86 host: int8 p50 before -> after, face landmark 5.78 -> 1.43 ms, iris 8.89 -> 1.03 ms,
palm lite 33.5 -> 11.2 ms, palm full 22.6 -> 8.2 ms (fp32: 1.29, 1.38, 14.5, 10.0 ms);
every node but the uint8 I/O QUANTIZE ops delegated, in one partition. The Edge TPU maps PRELU
itself, so its target keeps it (builders/graph/rewrite.py applies this for XNNPACK only).
"""

from __future__ import annotations

import numpy as np

from edgekit.builders.graph import edit, ops

PRELU, DEPTHWISE_CONV_2D, SUB = 54, 4, 41  # tflite::BuiltinOperator
ADD, MUL = ops.ADD, ops.MUL
RELU_ACTIVATION, VALID_PADDING = 1, 1  # tflite::ActivationFunctionType, tflite::Padding
INTO = "DEPTHWISE_CONV_2D and ADD (with MUL and SUB where a slope is over 1), which XNNPACK runs in int8"


def rewrite_prelu(blob: bytes) -> tuple[bytes, int]:
    """The float model with every :func:`slopes`-eligible PRELU expanded, and how many were.

    A model with none comes back unchanged with 0.
    """
    model = edit.read(edit.float32_weights(blob))
    count = 0
    for sg in model.subgraphs:
        new_ops = []
        for op in sg.operators:
            alpha = slopes(model, sg, op) if edit.opcode_of(model, op.opcodeIndex) == PRELU else None
            if alpha is None:
                new_ops.append(op)
                continue
            new_ops += expand(model, sg, op, alpha)
            count += 1
        sg.operators = new_ops
    if not count:
        return blob, 0
    return edit.write(edit.pruned(model)), count


def slopes(model, sg, op) -> np.ndarray | None:
    """The per-channel slopes of a PRELU ``op`` (one per channel of its input), or None when it
    is not rewritten: input not a float 4-D tensor, slope not constant, or varying along an
    axis other than the channels."""
    x, slope = sg.tensors[int(op.inputs[0])], sg.tensors[int(op.inputs[1])]
    shape = [int(d) for d in (x.shape if x.shape is not None else [])]
    data = edit.constant_data(model, slope)
    if len(shape) != 4 or shape[-1] <= 0 or x.type != edit.FLOAT32 or slope.type != edit.FLOAT32 or data is None:
        return None
    alpha = data.view(np.float32)
    dims = [int(d) for d in (slope.shape if slope.shape is not None else [])]
    if alpha.size == 1:
        return np.full(shape[-1], float(alpha[0]), np.float32)
    if alpha.size != shape[-1] or dims[-1:] != [shape[-1]] or not np.all(np.isfinite(alpha)):
        return None
    return alpha.astype(np.float32)


def expand(model, sg, op, alpha: np.ndarray) -> list:
    """The ops replacing one PRELU ``op`` of per-channel slopes ``alpha`` (same input and output
    tensors; the module docstring gives both forms)."""
    x, out = int(op.inputs[0]), int(op.outputs[0])
    correction = ops.temp(model, sg, out, "prelu_negative")
    if np.all(alpha <= 1):
        return [_depthwise(model, sg, x, alpha - 1, correction, relu=True),
                ops.op(model, sg, ADD, [x, correction], out)]
    positive, negative = ops.temp(model, sg, out, "prelu_relu"), ops.temp(model, sg, out, "prelu_min")
    relu = ops.op(model, sg, MUL, [x, ops.scalar(model, sg, 1.0)], positive)
    relu.builtinOptions.fusedActivationFunction = RELU_ACTIVATION
    return [relu, _sub(model, sg, x, positive, negative),
            _depthwise(model, sg, negative, alpha, correction, relu=False),
            ops.op(model, sg, ADD, [positive, correction], out)]


def _sub(model, sg, a: int, b: int, out: int):
    """``a - b`` (SUB without a fused activation)."""
    schema, _ = edit.load_schema()
    new = schema.OperatorT()
    new.opcodeIndex = edit.builtin_code_index(model, schema, SUB, 1)
    new.inputs, new.outputs = [a, b], [out]
    new.builtinOptionsType, new.builtinOptions = schema.BuiltinOptions.SubOptions, schema.SubOptionsT()
    return new


def _depthwise(model, sg, x: int, scale: np.ndarray, out: int, relu: bool):
    """A 1x1 DEPTHWISE_CONV_2D multiplying each channel of ``x`` by ``scale`` (zero bias), with a
    fused RELU when ``relu``."""
    schema, _ = edit.load_schema()
    name = (sg.tensors[out].name or b"prelu").decode(errors="replace")
    weights = _constant(model, sg, scale.reshape(1, 1, 1, -1), f"{name}/depthwise_weights")
    bias = _constant(model, sg, np.zeros(scale.size, np.float32), f"{name}/depthwise_bias")
    options = schema.DepthwiseConv2DOptionsT()
    options.padding, options.strideW, options.strideH, options.depthMultiplier = VALID_PADDING, 1, 1, 1
    options.dilationWFactor, options.dilationHFactor = 1, 1
    options.fusedActivationFunction = RELU_ACTIVATION if relu else 0
    new = schema.OperatorT()
    new.opcodeIndex = edit.builtin_code_index(model, schema, DEPTHWISE_CONV_2D, 1)
    new.inputs, new.outputs = [x, weights, bias], [out]
    new.builtinOptionsType = schema.BuiltinOptions.DepthwiseConv2DOptions
    new.builtinOptions = options
    return new


def _constant(model, sg, values: np.ndarray, name: str) -> int:
    """A new float32 constant tensor holding ``values``."""
    schema, _ = edit.load_schema()
    tensor = schema.TensorT()
    values = np.ascontiguousarray(values, np.float32)
    tensor.shape, tensor.type, tensor.name = list(values.shape), edit.FLOAT32, name.encode()
    tensor.buffer = edit.new_buffer(model, values)
    sg.tensors.append(tensor)
    return len(sg.tensors) - 1
