"""ONNX builder for the jetson target: ONNX (fp32) + FP16 ONNX with float I/O.

The TensorRT engine itself is built on the Jetson from the FP16 ONNX (engines are specific to
one GPU and TensorRT version). Keras/SavedModel input goes through tf2onnx; ONNX input is
checked and copied. FP16 uses onnxconverter-common with ``keep_io_types=True`` so the device
feeds and reads float32 (TensorRT 11 takes precision from the graph itself).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.builders.contract import BuilderOutput, BuiltModel
from edgekit.errors import ModelError

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.target import Target


def to_onnx(ctx: BuildContext, dest: Path, opset: int) -> None:
    """Write the fp32 ONNX model for the context's source model."""
    if ctx.source.kind == "onnx":
        shutil.copyfile(ctx.source.path, dest)
        return
    import tensorflow as tf
    import tf2onnx

    loaded = tf.saved_model.load(str(ctx.saved_model()))
    signature = loaded.signatures["serving_default"]
    arg_name = next(iter(signature.structured_input_signature[1]))
    spec = tf.TensorSpec((1,) + ctx.source.input_hwc, tf.float32, name="image")

    @tf.function(input_signature=[spec])
    def serve(image):
        # tf2onnx wants a tf.function; signatures take keyword tensors and return a dict
        return next(iter(signature(**{arg_name: image}).values()))

    try:
        model_proto, _ = tf2onnx.convert.from_function(serve, input_signature=[spec], opset=opset)
    except Exception as exc:
        raise ModelError(f"tf2onnx conversion failed: {str(exc).splitlines()[0][:300]}") from exc
    dest.write_bytes(model_proto.SerializeToString())


def to_fp16(src: Path, dest: Path) -> None:
    """FP16 weights and compute, float32 inputs/outputs."""
    import onnx
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dest))


def build(ctx: BuildContext, target: Target, out_dir: Path) -> BuilderOutput:
    """Write and verify ``<name>_fp32.onnx`` and ``<name>_fp16.onnx`` (the builder contract)."""
    options = ctx.options_for(target)
    opset = int(options.get("opset", 17))
    variants = list(options.get("variants", ["fp32", "fp16"]))
    fp32 = out_dir / f"{ctx.name}_fp32.onnx"
    with ctx.log.step(f"[{target.name}] convert to ONNX (opset {opset})") as s32:
        to_onnx(ctx, fp32, opset)
    files = {"fp32": (fp32, s32["seconds"])}
    if "fp16" in variants:
        fp16 = out_dir / f"{ctx.name}_fp16.onnx"
        with ctx.log.step(f"[{target.name}] convert to FP16 ONNX") as s16:
            to_fp16(fp32, fp16)
        files["fp16"] = (fp16, s16["seconds"])
    models = tuple(_verified(ctx, variant, path, seconds) for variant, (path, seconds) in files.items())
    default = options.get("default", "fp16")
    return BuilderOutput(models, default if default in files else "fp32")


def _verified(ctx: BuildContext, variant: str, path: Path, seconds: float) -> BuiltModel:
    """Read one written ONNX model's tensors and verify it on the CPU provider."""
    from edgekit.image import InputSpec
    from edgekit.runtime.onnxrt import OnnxRuntime

    with OnnxRuntime(path, providers=["cpu"]) as rt:
        spec = rt.input_spec
        outs = tuple({"name": o["name"], "shape": [d if isinstance(d, int) else 1 for d in o["shape"]],
                      "dtype": "float32"} for o in rt.output_details())
    d = ctx.float_spec.to_dict()
    d.update(shape=list(spec.shape), dtype=spec.dtype, name=spec.name, layout="NHWC")
    if len(spec.shape) == 4 and spec.shape[1] in (1, 3) and spec.shape[3] not in (1, 3):
        d["layout"] = "NCHW"
    spec = InputSpec.from_dict(d)
    return BuiltModel(
        name=variant, file=path.name, format="onnx", precision="float16" if variant == "fp16" else "float32",
        input=spec, outputs=outs, convert_seconds=seconds, bytes=path.stat().st_size,
        verification=ctx.verify(variant, lambda t: _run(path, t), spec),
        runtime_options={"precision": "fp16" if variant == "fp16" else "fp32"},
        extra={"tensorrt": {"engine": "built on the device from this file (edgekit/runtime/trt_engine.py)"}},
    )


def _run(path: Path, tensors):
    from edgekit.builders.verify import run_onnx

    return run_onnx(path, tensors)
