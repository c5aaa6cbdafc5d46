"""ONNX builder for the jetson target: ONNX (fp32) + FP16 ONNX with float I/O, every output kept.

The TensorRT engine itself is built on the Jetson from the FP16 ONNX (engines are specific to
one GPU and TensorRT version). Keras/SavedModel input goes through tf2onnx; ONNX input is
checked and copied. FP16 uses onnxconverter-common with ``keep_io_types=True`` so the device
feeds and reads float32 (TensorRT 11 takes precision from the graph itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.builders.contract import BuilderOutput, BuiltModel, task_extra
from edgekit.errors import ModelError, first_line

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.target import Target


VARIANTS = ("fp32", "fp16")
"""What this builder makes (the fp32 ONNX is always written: the FP16 one is converted from it)."""


def to_onnx(ctx: BuildContext, dest: Path, opset: int) -> list[str]:
    """Write the fp32 ONNX model for the context's source model; returns its output names in
    the source's output order.

    An ONNX source is written as prepared (batch 1, its image size fixed, node names
    sanitised): TensorRT builds its engine for that one shape on the device.
    """
    if ctx.source.kind == "onnx":
        dest.write_bytes(ctx.source.onnx or b"")
        return ctx.source.output_names
    if ctx.source.kind == "tflite":
        from edgekit.builders.convert.tflite_to_onnx import tflite_to_onnx

        return tflite_to_onnx(ctx, dest, opset)
    from edgekit.builders.tf import import_tf

    tf = import_tf()  # before tf2onnx, which imports it: quietly (builders/tf.py)
    import tf2onnx

    loaded = tf.saved_model.load(str(ctx.saved_model()))
    signature = loaded.signatures["serving_default"]
    arg_name = next(iter(signature.structured_input_signature[1]))
    spec = tf.TensorSpec((1,) + ctx.source.input_hwc, tf.float32, name="image")
    keys = [o.key for o in ctx.source.outputs]

    @tf.function(input_signature=[spec])
    def serve(image):
        # tf2onnx wants a tf.function; it names each ONNX output after its key here
        outputs = signature(**{arg_name: image})
        return {k: outputs[k] for k in keys}

    try:
        model_proto, _ = tf2onnx.convert.from_function(serve, input_signature=[spec], opset=opset,
                                                       custom_op_handlers={"Erfc": (_erfc, [])})
    except Exception as exc:
        raise ModelError(f"tf2onnx conversion failed: {first_line(exc, 300)}") from exc
    _inline_captures(model_proto, serve.get_concrete_function())
    _check_converted(model_proto, ctx.source.path.name)
    dest.write_bytes(model_proto.SerializeToString())
    return keys


def _erfc(g, node, name, args) -> None:
    """tf2onnx handler for Erfc, which it cannot convert (TF 2.21 computes Keras' exact
    ``gelu`` with it): ``erfc(x) = 1 - erf(x)``."""
    import numpy as np
    from tf2onnx import utils

    node.type = "Erf"
    out = node.output[0]
    one = g.make_const(utils.make_name(f"{node.name}_one"), np.array(1, np.float32))
    sub = g.insert_new_node_on_output("Sub", out, name=utils.make_name(f"{node.name}_erfc"))
    g.replace_inputs(sub, [one.output[0], out])


def _inline_captures(model, concrete) -> None:
    """Make the tensors a traced function captured (a Keras 3 ``Normalization`` layer's mean and
    variance) initializers: tf2onnx lists them as extra graph inputs, which no runtime feeds."""
    from onnx import numpy_helper

    n = len(concrete.captured_inputs)
    values = {t.name: v for t, v in zip(concrete.inputs[len(concrete.inputs) - n:], concrete.captured_inputs)
              if v.dtype.name != "resource"} if n else {}
    for graph_input in [i for i in model.graph.input if i.name in values]:
        model.graph.input.remove(graph_input)
        model.graph.initializer.append(numpy_helper.from_array(values[graph_input.name].numpy(), graph_input.name))


def _check_converted(model, source_name: str) -> None:
    """Refuse, naming the op, a graph in which tf2onnx left a TensorFlow op it could not convert."""
    import onnx

    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            raise ModelError(f"tf2onnx cannot convert the TensorFlow op {node.op_type} of {source_name} to ONNX "
                             f"(node '{node.name}'), so the jetson target cannot be built",
                             "build the TFLite targets (edgetpu, rpi, cpu), or replace that layer")


def to_fp16(src: Path, dest: Path) -> int:
    """FP16 weights and compute, float32 inputs/outputs; returns how many float32 weight values
    were outside float16's range and clamped (the build log says so; the gate measures the effect).

    Ops onnxconverter-common keeps in float32 (its ``DEFAULT_OP_BLOCK_LIST``: Resize, whose
    scales/roi must stay float32, Min, Max, TopK, NonMaxSuppression ...) are wrapped in Casts.
    """
    import warnings

    import onnx
    from onnxconverter_common import float16

    model = onnx.load(str(src))
    # Ultralytics' export (its onnxslim pass, simplify=True by default) lists every value_info
    # twice. onnxconverter-common 1.16 (float16.py insert_cast16_after_node) retypes only the
    # first entry of a name when it puts a Cast(to=float16) after a blocked op, so the second
    # still says float and ONNX Runtime refuses the model: "Type (tensor(float)) of output arg
    # (/model.10/Resize_output_0) of node (/model.10/Resize_output_cast0) does not match expected
    # type (tensor(float16))". Keep the first entry of each name. Resize in fp16 upstream:
    # microsoft/onnxconverter-common#207, #306.
    seen: set[str] = set()
    unique = [v for v in model.graph.value_info if not (v.name in seen or seen.add(v.name))]
    del model.graph.value_info[:]
    model.graph.value_info.extend(unique)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = float16.convert_float_to_float16(model, keep_io_types=True)
    except Exception as exc:  # the converter's own failure: one line, and the variant that still builds
        why = first_line(f"{type(exc).__name__}: {exc}")
        raise ModelError(f"onnxconverter-common could not convert {src.name} to float16: {why}",
                         "build the fp32 variant only (--variants fp32)") from exc
    onnx.save(model, str(dest))
    # it warns once per value (dozens of Python warnings for YOLOv8n): counted into one build-log line
    return sum("will be truncated to" in str(w.message) for w in caught)


def build(ctx: BuildContext, target: Target, out_dir: Path) -> BuilderOutput:
    """Write and verify ``<name>_fp32.onnx`` and ``<name>_fp16.onnx`` (the builder contract)."""
    options = ctx.options_for(target)
    opset = int(options.get("opset", 17))
    variants = list(options.get("variants", ["fp32", "fp16"]))
    fp32 = out_dir / f"{ctx.name}_fp32.onnx"
    with ctx.log.step(f"[{target.name}] convert to ONNX (opset {opset})") as s32:
        names = to_onnx(ctx, fp32, opset)
    files = {"fp32": (fp32, s32["seconds"])}
    if "fp16" in variants:
        fp16 = out_dir / f"{ctx.name}_fp16.onnx"
        with ctx.log.step(f"[{target.name}] convert to FP16 ONNX") as s16:
            clamped = to_fp16(fp32, fp16)
        if clamped:
            ctx.log.warn(f"[{target.name}] fp16: {clamped} float32 weight value(s) are outside float16's range and "
                         "were clamped (the gate below measures the effect)")
        files["fp16"] = (fp16, s16["seconds"])
    models = tuple(_verified(ctx, variant, path, seconds, names) for variant, (path, seconds) in files.items())
    default = options.get("default", "fp16")
    return BuilderOutput(models, default if default in files else "fp32")


def _verified(ctx: BuildContext, variant: str, path: Path, seconds: float, names: list[str]) -> BuiltModel:
    """Read one written ONNX model's tensors and verify it on the CPU provider.

    ``names``: the ONNX output names of the source's outputs, in the source's order.
    """
    from edgekit.builders.gate.verify import OnnxRunner
    from edgekit.imaging.image import InputSpec
    from edgekit.runtime.onnxrt import OnnxRuntime

    original = dict(zip(names, ctx.source.output_names))
    try:
        rt = OnnxRuntime(path, providers=["cpu"])
    except ModelError as exc:  # its message names the build's temporary folder and blames the file
        raise ModelError(f"the {variant} ONNX model made from {ctx.source.path.name} does not load in ONNX Runtime: "
                         + exc.message.replace(str(path), path.name)[:300],
                         "build the other variant (--variants fp32 or fp16), or see build.log (--debug)") from exc
    with rt:
        spec = rt.input_spec
        details = rt.output_details()
    # in the runtime's order, named as in the original model
    outs = tuple({"name": original.get(o["name"], o["name"]), "tensor": o["name"],
                  "shape": [d if isinstance(d, int) else 1 for d in o["shape"]], "dtype": "float32"}
                 for o in details)
    runtime_names = [o["name"] for o in details]
    extra = task_extra(ctx.class_output, [runtime_names.index(n) for n in names])
    d = ctx.float_spec.to_dict()
    # tf2onnx keeps a Keras model's NHWC; an ONNX source keeps its own layout
    d.update(shape=list(spec.shape), dtype=spec.dtype, name=spec.name, layout=ctx.source.layout)
    spec = InputSpec.from_dict(d)
    with OnnxRunner(path, names) as runner:
        verification = ctx.verify(variant, runner, spec)
    return BuiltModel(
        name=variant, file=path.name, format="onnx", precision="float16" if variant == "fp16" else "float32",
        input=spec, outputs=outs, convert_seconds=seconds, bytes=path.stat().st_size,
        verification=verification,
        runtime_options={"precision": "fp16" if variant == "fp16" else "fp32"},
        extra={"tensorrt": {"engine": "built on the device from this file (edgekit/runtime/trt_engine.py)"}, **extra},
    )

