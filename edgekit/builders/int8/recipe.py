"""The int8 variant of a float TFLite graph: rewritten for int8 accelerators, its score and box
outputs clamped where a detector needs it, an output sigmoid's input clamped to +-16
(builders/int8/sigmoid_clamp.py), then quantised by TensorFlow's post-training quantiser
(builders/int8/quantize.py). Build-side only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgekit.builders.convert.to_tflite import convert, output_order

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.target import Target


@dataclass
class FloatGraphs:
    """The TFLite recipe's intermediate products, made once per build and shared by its targets: the
    fp32 TFLite of a SavedModel; the float graph int8 is quantised from (rewritten, clamped) with its
    rewrites, which a recovery attempt and the calibration check quantise again; that graph before its
    rewrites (the Edge TPU share they bought, builders/tflite.py), None when nothing was rewritten."""

    fp32: bytes | None = None
    for_int8: bytes | None = None
    rewrites: tuple = ()
    unrewritten: bytes | None = None


def float_graphs(ctx: BuildContext) -> FloatGraphs:
    """This build's :class:`FloatGraphs` (made empty on first use)."""
    return ctx.products.setdefault("tflite", FloatGraphs())


def int8_model(ctx: BuildContext, target: Target, saved: Path | None, representative,
               io_dtype: str) -> tuple[bytes, list]:
    """The int8 model and the graph rewrites it holds (builders/graph/rewrite.py).

    The float TFLite graph (the source's, or the converter's fp32 of the SavedModel) is rewritten
    where int8 back ends need it and quantised by TensorFlow's post-training quantiser, the steps
    the converter runs, with the calibration ranges checked (builders/int8/quantize.py): the
    converter's own int8 path logs some ranges wrong (tensorflow/tensorflow#127842).
    """
    from edgekit.builders.graph.rewrite import box_clamp, rewrite_checked, score_clamp
    from edgekit.builders.int8 import quantize
    from edgekit.builders.int8.sigmoid_clamp import sigmoid_clamped

    graphs = float_graphs(ctx)
    if saved is None:
        float_model = ctx.source.handle.blob
    else:
        if graphs.fp32 is None:
            graphs.fp32 = convert(saved, "fp32")
        float_model = graphs.fp32
    xnnpack = target.runtime_options.get("delegate", "xnnpack") == "xnnpack"  # cpu, rpi: PRELU rewritten
    rewritten, done = rewrite_checked(float_model, representative, ctx.log, target.name, xnnpack=xnnpack)
    logits = lambda output: _outside_unit(ctx, rewritten, _position(ctx, rewritten, output, saved is not None),  # noqa: E731
                                          representative)
    for clamp in (score_clamp(ctx.detect, logits), box_clamp(ctx.detect)):
        if clamp is not None:
            rewritten, rewrite = _clamped(ctx, rewritten, *clamp, saved is not None)
            done = [*done, rewrite]
            ctx.log.info(f"[{target.name}] int8: {rewrite.op} into {rewrite.into} before quantising (one int8 "
                         "scale for values spanning hundreds leaves a coarse step where the detections are)")
    rewritten, sigmoid = sigmoid_clamped(rewritten, representative, ctx.log, target.name)
    done = [*done, sigmoid] if sigmoid is not None else done
    graphs.for_int8, graphs.rewrites = rewritten, tuple(done)
    graphs.unrewritten = float_model if done else None
    return quantize.quantize_int8(rewritten, representative, io_dtype), done


def _clamped(ctx: BuildContext, blob: bytes, output: int, bound: float, by_key: bool) -> tuple[bytes, object]:
    """The float model with the source's ``output`` clamped to +-``bound`` (builders/graph/rewrite.py)."""
    from edgekit.builders.graph.rewrite import Rewrite, clamp_outputs

    name, position = ctx.source.outputs[output].name, _position(ctx, blob, output, by_key)
    # verification compares the clamped model with the original clamped the same way: BlazeFace's
    # logits below -16 score 0 either way, and against the raw ones its scores' cosine read 0.1
    clip = lambda ref: np.clip(ref, -bound, bound)  # noqa: E731
    expect = tuple(clip if i == position else None for i in range(len(ctx.source.outputs)))
    return (clamp_outputs(blob, [position], bound),
            Rewrite(f"'{name}' clamp", 1, f"[-{bound:g}, {bound:g}] (MINIMUM, MAXIMUM)", expect=expect))


def _position(ctx: BuildContext, blob: bytes, output: int, by_key: bool) -> int:
    """Where the source's ``output`` lies among the float model's outputs: the converter lists a
    SavedModel's outputs by signature key (``by_key``), a .tflite source keeps its own order."""
    if not by_key:
        return output
    probe = ctx.workdir / "float_outputs.tflite"
    probe.write_bytes(blob)
    return output_order(probe, [o.key for o in ctx.source.outputs])[output]


def _outside_unit(ctx: BuildContext, blob: bytes, position: int, representative, images: int = 8) -> bool:
    """True when the float model's output at ``position`` leaves [0, 1] on the first calibration
    images: raw logits, which ``score_activation`` auto decodes with the sigmoid."""
    from edgekit.builders.graph.rewrite import float_outputs

    samples = [np.asarray(x, np.float32)[None] for _, x in zip(range(images), representative)]
    values = [out[position] for out in float_outputs(blob, samples)]
    return any(float(v.min()) < 0.0 or float(v.max()) > 1.0 for v in values)
