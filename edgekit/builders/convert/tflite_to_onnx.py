"""ONNX for the jetson target from a float ``.tflite`` source (tf2onnx's TFLite front end).

tf2onnx converts the float32-weight graph (:func:`edgekit.builders.graph.edit.float32_weights`,
so the FP16 ONNX step decides precision itself). An op it cannot map is not left in the graph
as a custom node that TensorRT and ONNX Runtime would refuse later on the device (tf2onnx leaves
MediaPipe's ``Convolution2DTransposeBias`` so, without an error): it is named here, at build time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.errors import ModelError, first_line

STANDARD_DOMAINS = ("", "ai.onnx")


def tflite_to_onnx(ctx: Any, dest: Path, opset: int) -> list[str]:
    """Write the fp32 ONNX model of a .tflite source; its output names, in the source's order."""
    from edgekit.builders.graph.edit import float32_weights
    from edgekit.builders.tf import import_tf

    import_tf()
    import tf2onnx

    plain = ctx.workdir / f"{ctx.name}_float32_for_onnx.tflite"
    plain.write_bytes(float32_weights(ctx.source.handle.blob))
    import warnings

    try:
        with warnings.catch_warnings():  # tf2onnx reads the file with tf.lite.Interpreter, which warns it is deprecated
            warnings.simplefilter("ignore", UserWarning)
            model_proto, _ = tf2onnx.convert.from_tflite(str(plain), opset=opset)
    except Exception as exc:  # tf2onnx raises whatever its handlers hit
        raise ModelError(f"tf2onnx cannot convert {ctx.source.path.name} to ONNX: "
                         f"{first_line(exc)}",
                         "build the TFLite targets (edgetpu, rpi, cpu) for this model") from exc
    _check_standard_ops(model_proto, ctx.source.path.name)
    names = [o.name for o in model_proto.graph.output]
    if len(names) != len(ctx.source.outputs):
        raise ModelError(f"tf2onnx made {len(names)} outputs of {ctx.source.path.name}, which has "
                         f"{len(ctx.source.outputs)}", "build the TFLite targets (edgetpu, rpi, cpu) for this model")
    _fix_batch(model_proto)
    dest.write_bytes(model_proto.SerializeToString())
    return names  # tf2onnx keeps the subgraph's output list, in order


def _check_standard_ops(model, source_name: str) -> None:
    """Refuse, naming them, ops tf2onnx left outside the ONNX standard (TFLite custom ops)."""
    import onnx

    odd = sorted({node.op_type for node in model.graph.node
                  if node.domain not in STANDARD_DOMAINS or not onnx.defs.has(node.op_type)})
    if odd:
        raise ModelError(f"{source_name} holds {', '.join(odd)}, which tf2onnx cannot express in standard ONNX, "
                         "so the jetson target cannot be built",
                         "build the TFLite targets (edgetpu, rpi, cpu), or export the model without custom ops")


def _fix_batch(model) -> None:
    """Batch 1 on the input, as the TFLite source has it (tf2onnx may leave it symbolic)."""
    for value in list(model.graph.input)[:1]:
        dims = value.type.tensor_type.shape.dim
        if len(dims) and not dims[0].dim_value:
            dims[0].dim_value = 1
