"""Full-integer int8 of a float TFLite model by TensorFlow's own post-training quantiser.

The steps ``TFLiteConverter`` runs after converting a SavedModel (``Calibrator`` then
``mlir_quantize``), applied to a TFLite graph directly: a .tflite source, or a converted
graph rewritten for the accelerator (:mod:`edgekit.builders.tflite_rewrite`). Build-side only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from edgekit.builders.tflite_edit import FLOAT32, _constant, _indices, _schema, float32_weights, read
from edgekit.errors import ModelError
from edgekit.util.quiet import converter_level, native_stderr_to_log

NATIVE_LOG = logging.getLogger("edgekit.builders.native")
"""TensorFlow's converter and quantiser write to fd 2 from C++; their lines go here (DEBUG: -vv)."""


def quantize_int8(blob: bytes, representative: Iterable[np.ndarray], io_dtype: str = "uint8",
                  denylisted_nodes: list[str] | None = None) -> bytes:
    """Full-integer int8 of a float TFLite model, calibrated on ``representative`` (one float
    tensor per image, no batch axis, in the model's own layout), with ``io_dtype`` I/O.

    TensorFlow's own post-training steps, as ``TFLiteConverter`` runs them with
    ``TFLITE_BUILTINS_INT8``; an op left in float afterwards is refused, naming it, unless it
    was asked for: ``denylisted_nodes`` (op output tensor names) stay float on purpose.
    """
    from edgekit.builders.log import progress
    from edgekit.builders.source_model import import_tf

    tf = import_tf()
    from tensorflow.lite.python.convert import mlir_quantize
    from tensorflow.lite.python.optimize import calibrator

    if representative is None or not len(representative):
        raise ModelError("int8 conversion needs calibration images", "pass --calib DIR")
    io = {"uint8": tf.uint8, "int8": tf.int8}[io_dtype]

    def feed():
        for x in progress(representative, "int8 calibration", total=len(representative)):
            yield [np.asarray(x, np.float32)[None]]

    try:
        prepared = calibrator.add_intermediate_tensors(float32_weights(blob))
        calibrated = calibrator.Calibrator(prepared).calibrate(feed)
        with native_stderr_to_log(NATIVE_LOG, converter_level):  # "fully_quantize: 0, inference_type: 6 ..."
            quantized = mlir_quantize(calibrated, input_data_type=io, output_data_type=io,
                                      denylisted_nodes=list(denylisted_nodes) if denylisted_nodes else None)
    except (RuntimeError, ValueError) as exc:
        raise ModelError(f"TFLite int8 quantisation failed: {converter_error(str(exc)) or type(exc).__name__}",
                         "see build.log (--debug); the fp32 and fp16 variants do not need it") from exc
    float_ops = [] if denylisted_nodes else float_ops_left(quantized)
    if float_ops:
        raise ModelError(f"int8: TensorFlow's quantiser left {', '.join(float_ops)} in float (no int8 kernel)",
                         "build --variants fp32,fp16 for this model, or replace those ops before export")
    return quantized


def float_ops_left(blob: bytes) -> list[str]:
    """Names of the ops of a quantised model that still compute on float32 activations
    (the input QUANTIZE and output DEQUANTIZE excepted)."""
    _, fb = _schema()
    model = read(blob)
    left: set[str] = set()
    for sg in model.subgraphs:
        for op in sg.operators:
            name = fb.opcode_to_name(model, op.opcodeIndex)
            if name in ("QUANTIZE", "DEQUANTIZE"):
                continue
            for t in _indices(op.inputs):
                tensor = sg.tensors[t]
                if tensor.type == FLOAT32 and _constant(model, tensor) is None:
                    left.add(name)
    return sorted(left)


def converter_error(text: str) -> str:
    """What a TFLite converter error says in plain words: the ops it could not map, else the first
    ``'tf.Op' op ...`` diagnostic, else its first line (at most 300 characters).

    The converter's text opens with MLIR source locations (``loc(callsite(fused[...]))``) that name
    nothing a user recognises; the op list comes further down.
    """
    import re

    ops = re.search(r"^(Custom|Flex) ops: (.+)$", text, re.MULTILINE)
    if ops:
        kind = "as custom ops" if ops.group(1) == "Custom" else "as TensorFlow (flex) ops"
        return f"no TFLite builtin kernel for {ops.group(2).strip()[:200]} (the converter would need them {kind})"
    op = re.search(r"'(tf\.\w+)' op ([^\n]+)", text)
    if op:
        return f"{op.group(1)} {op.group(2).strip()}"[:300]
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""
