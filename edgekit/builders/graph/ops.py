"""The small graph edits every float TFLite rewrite shares: a new activation tensor, a scalar
constant and an operator.

They live below the rewrites (``tflite_rewrite``, ``tflite_scale``, ``tflite_yolo``) so each of
those imports them from here and none imports another's private helpers: ``tflite_rewrite``
drives ``tflite_yolo``, which drives ``tflite_scale``, and the edits must not point back up.
"""

from __future__ import annotations

import numpy as np

from edgekit.builders.graph import edit

ADD, MUL = 0, 18  # tflite::BuiltinOperator


def temp(model, sg, like: int, suffix: str) -> int:
    """A new float activation tensor shaped like tensor ``like``."""
    schema, _ = edit.load_schema()
    ref = sg.tensors[like]
    tensor = schema.TensorT()
    tensor.shape, tensor.type = ref.shape, edit.FLOAT32
    tensor.shapeSignature = ref.shapeSignature
    tensor.name = (ref.name or b"") + b"/" + suffix.encode()
    tensor.buffer = 0
    sg.tensors.append(tensor)
    return len(sg.tensors) - 1


def scalar(model, sg, value: float) -> int:
    """A new float32 constant of one element (broadcast by ADD and MUL)."""
    schema, _ = edit.load_schema()
    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.name = [1], edit.FLOAT32, f"const_{value:.6g}".encode()
    tensor.buffer = edit.new_buffer(model, np.array([value], np.float32))
    sg.tensors.append(tensor)
    return len(sg.tensors) - 1


def op(model, sg, builtin: int, inputs: list[int], output: int):
    """A new operator with its options (ADD and MUL without a fused activation)."""
    schema, _ = edit.load_schema()
    new = schema.OperatorT()
    new.opcodeIndex = edit.builtin_code_index(model, schema, builtin, 1)
    new.inputs, new.outputs = inputs, [output]
    if builtin == ADD:
        new.builtinOptionsType, new.builtinOptions = schema.BuiltinOptions.AddOptions, schema.AddOptionsT()
    elif builtin == MUL:
        new.builtinOptionsType, new.builtinOptions = schema.BuiltinOptions.MulOptions, schema.MulOptionsT()
    return new
