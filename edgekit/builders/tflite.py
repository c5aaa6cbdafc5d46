"""TFLite builder for the edgetpu, rpi and cpu targets (TensorFlow's own converter).

Variants: ``fp32``; ``fp16`` (float16 weights, float32 compute on XNNPACK); ``int8``
(full-integer: int8 weights and activations, uint8 or int8 I/O, calibrated with the
representative dataset). Conversion goes SavedModel -> ``TFLiteConverter.from_saved_model``;
``from_concrete_functions`` is avoided because it can write a weightless model that outputs
NaN without any error.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgekit.builders.contract import BuilderOutput, BuiltModel, task_extra
from edgekit.builders.convert.to_tflite import convert, output_order, same_outputs
from edgekit.builders.gate.verdict import failed
from edgekit.builders.int8.recipe import float_graphs, int8_model
from edgekit.errors import ModelError

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.target import Target

PRECISION = {"fp32": "float32", "fp16": "float16-weights", "int8": "int8"}
VARIANTS = tuple(PRECISION)
"""What this builder makes; ``edgekit build`` refuses any other variant before it starts."""


def build(ctx: BuildContext, target: Target, out_dir: Path) -> BuilderOutput:
    """Convert, write and verify every variant the target asks for (the builder contract)."""
    options = ctx.options_for(target)
    variants = list(options.get("variants", ["fp32"]))
    io_dtype = options.get("io_dtype", "uint8")
    saved = None if ctx.source.kind == "tflite" else ctx.saved_model()  # a .tflite is converted on its own graph
    models, coverage = [], {}
    for variant in variants:
        model, coverage[variant] = _variant(ctx, target, saved, out_dir, variant, io_dtype,
                                            bool(options.get("quant_report")))
        models.append(model)
    default = options.get("default") if options.get("default") in variants else variants[0]
    if options.get("compile") and "int8" in variants:
        return _edgetpu(ctx, out_dir, models, options)
    if len(models) > 1:
        from edgekit.builders.gate.speed import time_variants

        models, default = time_variants(ctx, target, out_dir, models, default)
    return BuilderOutput(tuple(models), default, delegation=coverage)


def _variant(ctx: BuildContext, target: Target, saved: Path, out_dir: Path, variant: str,
             io_dtype: str, quant_report: bool = False) -> tuple[BuiltModel, dict]:
    """Convert one variant, write it, map and read its outputs and XNNPACK coverage, verify it.

    An int8 model that misses the gate (or any int8 model with ``quant_report``, the target's
    ``[build]`` option) gets the per-layer quantisation report (builders/int8/report.py).
    """
    with ctx.log.step(f"[{target.name}] convert {variant}") as step:
        rep = ctx.representative() if variant == "int8" else None
        rewrites: list = []
        if variant == "int8":
            blob, rewrites = int8_model(ctx, target, saved, rep, io_dtype)
        elif saved is None:
            blob = convert_tflite(ctx, variant, rep, io_dtype)
        elif variant == "fp32":  # kept: an int8 with graph rewrites starts from it
            graphs = float_graphs(ctx)
            blob = graphs.fp32 = graphs.fp32 or convert(saved, variant)
        else:
            blob = convert(saved, variant)
    finish = _finisher(ctx, target, saved, out_dir / f"{ctx.name}_{variant}.tflite", variant, io_dtype, quant_report)
    model, coverage = finish(blob, rewrites, step["seconds"])
    if variant == "int8" and ctx.request.recover:  # builders/int8/stability.py, then builders/int8/recovery.py
        from edgekit.builders.int8 import quantize, recovery, stability

        model = stability.check(ctx, target, out_dir / model.file, model, finish,
                                      lambda rep: quantize.quantize_int8(float_graphs(ctx).for_int8, rep, io_dtype))
        if failed(model.verification):
            model, coverage = recovery.recover(ctx, target, out_dir / model.file, (model, coverage), finish,
                                               step["seconds"])
    return model, coverage


def _finisher(ctx: BuildContext, target: Target, saved: Path | None, path: Path, variant: str, io_dtype: str,
              quant_report: bool):
    """``finish(blob, rewrites, seconds) -> (BuiltModel, coverage)``: write one converted model
    to ``path``, map and read its outputs and delegate coverage, verify it."""

    def finish(blob: bytes, rewrites: list, seconds: float, report: bool = True) -> tuple[BuiltModel, dict]:
        return _written(ctx, target, saved, path, blob, variant, io_dtype, quant_report, rewrites, seconds, report)

    return finish




def _written(ctx: BuildContext, target: Target, saved: Path | None, path: Path, blob: bytes, variant: str,
             io_dtype: str, quant_report: bool, rewrites: list, seconds: float,
             report: bool = True) -> tuple[BuiltModel, dict]:
    """See :func:`_finisher`."""
    from edgekit.builders.gate.verify import LiteRTRunner
    from edgekit.builders.graph.rewrite import manifest_extra, source_expect
    from edgekit.runtime.litert import spec_from_details

    path.write_bytes(blob)
    order = (output_order(path, [o.key for o in ctx.source.outputs]) if saved is not None
             else same_outputs(path, len(ctx.source.outputs)))
    expect = source_expect(rewrites, order)  # the rewrites' output positions: the graph's order, before any reorder
    if order != sorted(order):  # the converter listed them by key: the file gets the model's own order back
        from edgekit.builders.graph.edit import reorder_outputs

        blob = reorder_outputs(blob, order)
        path.write_bytes(blob)
        order = output_order(path, [o.key for o in ctx.source.outputs])
    names = {pos: ctx.source.outputs[j].name for j, pos in enumerate(order)}
    delegate, (input_detail, output_details, desc) = _open_details(ctx, target, path)
    spec = spec_from_details(input_detail, ctx.nhwc_spec)
    outputs = tuple(dict(_output_dict(d), name=names[i], tensor=d["name"]) for i, d in enumerate(output_details))
    check_shapes(ctx, [outputs[pos] for pos in order], path.name)
    coverage = {k: desc[k] for k in ("total_nodes", "delegated_nodes", "cpu_nodes")}
    coverage["delegate"] = "XNNPACK" if delegate == "xnnpack" else "none"
    with LiteRTRunner(path, order, delegate=delegate) as runner:
        verification = ctx.verify(variant, lambda tensors: _checked(path, runner(tensors)), spec, expect)
    missed = failed(verification)
    if variant == "int8" and report and (missed or quant_report or _weak_ungated(ctx, target, verification)):
        tensors = {o["tensor"]: o["name"] for o in outputs}
        verification["quantization"] = _quant_report(ctx, target, saved, io_dtype, missed, tensors, expect)
    model = BuiltModel(name=variant, file=path.name, format="tflite", precision=PRECISION[variant], input=spec,
                       outputs=outputs, convert_seconds=seconds, bytes=len(blob), verification=verification,
                       extra=manifest_extra(rewrites, task_extra(ctx.class_output, order)),
                       runtime_options=None if delegate == "xnnpack" else {"delegate": delegate})
    return model, coverage


def convert_tflite(ctx: BuildContext, variant: str, representative, io_dtype: str) -> bytes:
    """A float variant of a .tflite source, made on its own graph (builders/graph/edit.py):
    fp32 float32 weights, fp16 float16 weights (int8: builders/int8/recipe.py)."""
    from edgekit.builders.graph import edit

    blob = ctx.source.handle.blob
    if variant == "fp32":
        return edit.float32_weights(blob)
    if variant == "fp16":
        return edit.float16_weights(blob)
    raise ModelError(f"unknown TFLite variant {variant!r}", "use fp32, fp16 or int8")


def _open_details(ctx: BuildContext, target: Target, path: Path) -> tuple[str, tuple]:
    """The delegate a converted model runs with, and its (input detail, output details, description).

    XNNPACK first, as the device runs it. When XNNPACK cannot prepare the model (seen: an int8
    model with MaxPool ceil_mode, Resize align_corners and a padded AveragePool from a PyTorch
    export: "failed to create XNNPACK runtime"), LiteRT's built-in kernels: the model's entry
    then says ``delegate = "none"`` so the device does the same, and the build warns.
    """
    from edgekit.runtime.litert import LiteRTRuntime

    try:
        return "xnnpack", _details(LiteRTRuntime(path, delegate="xnnpack"))
    except ModelError as exc:
        reason = exc.message.replace(f"LiteRT cannot load {path}: ", "")[:200]
    try:
        details = _details(LiteRTRuntime(path, delegate="none"))
    except ModelError as exc:
        raise ModelError(f"[{target.name}] the converted {path.name} does not load in LiteRT: "
                         + exc.message.replace(str(path), path.name)[:240],
                         "build the other variants (--variants), or see build.log (--debug)") from exc
    ctx.log.warn(f"[{target.name}] XNNPACK cannot run {path.name} ({reason}); the bundle runs it with "
                 "LiteRT's built-in kernels (delegate none), which can be several times slower")
    return "none", details


def _details(rt) -> tuple:
    with rt:
        return rt.input_details()[0], rt.output_details(), rt.describe()


def check_shapes(ctx: BuildContext, outputs: list[dict], file: str) -> None:
    """Every converted output (in the source's order) holds as many values as the original's.

    onnx2tf turns a channels-first output channels-last (same values, transposed: fine);
    a different count means the conversion built another graph, which no gate should see.
    """
    for src, out in zip(ctx.source.outputs, outputs):
        size = int(np.prod(out["shape"][1:]))
        if src.size is not None and size != src.size:
            raise ModelError(f"{file}: output {src.name} has shape {out['shape'][1:]} after conversion, "
                             f"the original {list(src.shape)}: the converter changed the graph",
                             "report it with build.log, or build this model for jetson (no conversion)")


def _edgetpu(ctx: BuildContext, out_dir: Path, models: list[BuiltModel], options: dict) -> BuilderOutput:
    """Offline Edge TPU report, then edgetpu_compiler when installed (see builders/edgetpu/compiler.py)."""
    from edgekit.builders.edgetpu.compiler import compile_for_edgetpu

    int8 = next(m for m in models if m.name == "int8")
    with ctx.log.step("[edgetpu] compatibility check and edgetpu_compiler"):
        report = compile_for_edgetpu(
            out_dir / int8.file, out_dir, compiler=options.get("compiler"),
            min_runtime_version=options.get("min_runtime_version"), min_tpu_ops=options.get("min_tpu_ops"),
            strict_tpu_ops=bool(options.get("strict_tpu_ops")),
        )
    report["offline"]["model"] = int8.file  # not the temporary build path
    before = _tpu_share_before_rewrites(ctx)
    if before is not None:
        report["offline"]["before_rewrites"] = before
        ctx.log.info(f"[edgetpu] before the rewrites the int8 would be predicted {before['tpu_ops']}/"
                     f"{before['total_ops']} ops on the TPU" + (f" (cut at {before['cut']})" if before["cut"] else ""))
    for warning in report.get("warnings", []):
        ctx.log.warn(warning)
    off = report["offline"]
    real = report.get("compiler") or {}
    ctx.log.info(f"[edgetpu] predicted on the TPU: {off['tpu_ops']}/{off['total_ops']} ops, "
                 f"{off['parameter_share']:.0%} of parameters; cache {off['cache_status']}; {report['status']}"
                 + (f" (edgetpu_compiler: {real.get('tpu_ops')}/{real.get('total_ops')} on the TPU)" if real else ""))
    # The plain int8 model runs on the CPU (XNNPACK) wherever it goes: the Edge TPU delegate
    # would take none of its ops, so never pretend it is an Edge TPU model.
    models = [replace(m, runtime_options={"delegate": "xnnpack"}) if m is int8 else m for m in models]
    if report["status"] != "compiled":
        return BuilderOutput(tuple(models), "int8", edgetpu=report)
    compiled_file = report["compiled_file"]
    compiled = replace(
        int8, name="int8_edgetpu", file=compiled_file, bytes=(out_dir / compiled_file).stat().st_size,
        runtime_options={"delegate": "edgetpu"},
        # Same graph and weights; only the TPU can run it, so it is verified through the int8 model.
        verification=dict(int8.verification, note="verified through the plain int8 model"),
    )
    return BuilderOutput((*models, compiled), "int8_edgetpu", edgetpu=report)


def _tpu_share_before_rewrites(ctx: BuildContext, images: int = 4) -> dict | None:
    """The ops the Edge TPU would be predicted to take of the int8 made without the graph rewrites
    (quantised on a few calibration images: the op share does not depend on the ranges), for the
    manifest and ``inspect``; None when nothing was rewritten or that int8 cannot be made."""
    from edgekit.builders.int8.quantize import quantize_int8
    from edgekit.tflite.edgetpu_rules import check_model

    unrewritten = float_graphs(ctx).unrewritten
    if unrewritten is None:
        return None
    sample = [x for _, x in zip(range(images), ctx.representative())]
    try:
        blob = quantize_int8(unrewritten, sample, "uint8")
    except ModelError as exc:
        ctx.log.record(f"the int8 without rewrites was not made ({exc.message[:200]})", "[edgetpu] ")
        return None
    probe = ctx.workdir / "int8_before_rewrites.tflite"
    probe.write_bytes(blob)
    report = check_model(probe)
    cut = f"op {report.cut.index} ({report.cut.opcode})" if report.cut is not None else None
    return {"tpu_ops": report.tpu_ops, "total_ops": report.total_ops, "cut": cut}


def _weak_ungated(ctx: BuildContext, target: Target, verification: dict) -> bool:
    """True, with a warning, when an int8 model that no gate judged agrees poorly with the original."""
    from edgekit.builders.gate.verify import weak_ungated_warning

    warning = weak_ungated_warning(verification)
    if warning:
        ctx.log.warn(f"[{target.name}] {warning}")
    return warning is not None


def _quant_report(ctx: BuildContext, target: Target, saved: Path, io_dtype: str, missed: bool,
                  tensors: dict[str, str], expect: list | None = None) -> dict:
    """Per-layer quantisation error of the int8 as built (the float graph it quantised, rewrites
    and clamps included, the same calibration ranges) and the mixed-range hints (on the outputs
    as ``expect`` says the rewritten model gives them), logged line by line."""
    from edgekit.builders.graph.clamps import clamped_ranges
    from edgekit.builders.int8.quantize import quantize_int8
    from edgekit.builders.int8.report import quantization_report, report_lines

    why = "int8 missed the gate" if missed else "int8"
    float_graph = float_graphs(ctx).for_int8
    with ctx.log.step(f"[{target.name}] {why}: per-layer quantisation error"):
        report = quantization_report(ctx, lambda rep: quantize_int8(float_graph, rep, io_dtype, numeric_verify=True),
                                     tensors, expect, clamped=clamped_ranges(float_graph))
    for line in report_lines(report):
        (ctx.log.warn if line.startswith(("hint:", "QuantizationDebugger")) else ctx.log.info)(line)
    return report


def _checked(path: Path, out: list[np.ndarray]) -> list[np.ndarray]:
    """``out`` as it is, or ModelError when any value is NaN/Inf (a broken conversion)."""
    if not all(np.all(np.isfinite(o)) for o in out):
        raise ModelError(f"{path.name} produces NaN/Inf outputs: the conversion is broken",
                         "report it with build.log; try another TensorFlow version")
    return out


def _output_dict(detail: dict) -> dict:
    scale, zero_point = detail.get("quantization", (0.0, 0))
    return {"name": detail["name"], "shape": [int(s) for s in detail["shape"]],
            "dtype": np.dtype(detail["dtype"]).name,
            "scale": float(scale) if scale else None, "zero_point": int(zero_point) if scale else None}
