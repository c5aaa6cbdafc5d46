"""One target of a build: run its builder, describe the result in ``edgekit.json``, then publish
the bundle when the accuracy gate passes or keep it as ``<bundle>.rejected`` when it does not.

Whatever happens, no bundle from an earlier build is left at the destination looking as if this
build had produced it; replacing one is said (``replaced dist/demo-cpu (it held fp32, fp16, int8; now fp32)``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import shutil
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from edgekit.builders.context import BuildContext
from edgekit.builders.contract import BuilderOutput, BuiltModel, TargetBuild
from edgekit.builders.gate.openset import log_line
from edgekit.builders.gate.openset import manifest_entry as openset_entry
from edgekit.builders.gate.verdict import Verdict
from edgekit.builders.host.resources import peak_rss
from edgekit.builders.targets import BuildTarget
from edgekit.bundle import MANIFEST, BundleWriter, sha256_file
from edgekit.errors import EdgekitError, OutputError, UsageError
from edgekit.target import Target, merge_options


def build_target(ctx: BuildContext, planned: BuildTarget, t_start: float) -> TargetBuild:
    """Build, verify and publish (or reject) one target's bundle under ``ctx.request.out``.

    ``planned`` was resolved once for the build (:func:`edgekit.builders.targets.resolve_targets`:
    buildable here, its builder imported). Raises EdgekitError when its builder fails; a bundle
    that misses the accuracy gate is not an error here (``TargetBuild.passed`` is False).
    """
    target, builder = planned.target, planned.builder
    out = ctx.request.out
    dest = out / f"{ctx.name}-{target.name}"
    t0 = time.perf_counter()
    ctx.log.info(f"== target {target.name}: {target.summary}")
    try:
        writer_cm = BundleWriter(dest)
        writer = writer_cm.__enter__()
    except OSError as exc:
        # --out (or a folder above it) is a file: a path to fix (2); a disk that refuses writing: 1
        error = UsageError if exc.errno in (errno.EEXIST, errno.ENOTDIR) else OutputError
        raise error(f"cannot write to {out}: {exc.strerror}", "choose a writable --out directory") from exc
    try:
        output = builder(ctx, target, writer.dir)
        if not isinstance(output, BuilderOutput):
            raise EdgekitError(f"builder {target.builder} returned {type(output).__name__}, not a BuilderOutput")
        if ctx.labels:
            (writer.dir / "labels.txt").write_text("\n".join(ctx.labels) + "\n", encoding="utf-8")
        seconds = round(time.perf_counter() - t0, 2)
        manifest = bundle_manifest(ctx, target, output, seconds, t_start)
        if log_line(manifest.get("openset")):
            ctx.log.info(log_line(manifest["openset"]))
        (writer.dir / "build.log").write_text(ctx.log.text(), encoding="utf-8")
        ctx.log.check()  # Ctrl-C during the last step: do not publish the bundle
        return _publish(ctx, target, writer, output, manifest, (seconds, t_start))
    except EdgekitError:
        if dest.exists():
            # The bundle there came from an earlier build; leaving it would make this failed
            # build look like it produced it.
            shutil.rmtree(dest)
            ctx.log.warn(f"removed {dest}: it was built by an earlier run and does not match this model")
        raise
    finally:
        writer_cm.__exit__(None, None, None)


def _publish(ctx: BuildContext, target: Target, writer: BundleWriter, output: BuilderOutput, manifest: dict,
             times: tuple[float, float]) -> TargetBuild:
    """Rename the bundle into place if it passed the gate; else keep the models that missed it as
    ``<dest>.rejected`` and, when some passed, publish those (a partial bundle)."""
    dest = writer.dest
    seconds = times[0]
    held = _held(dest)
    if manifest["verification"]["passed"]:
        path = writer.commit(manifest)
        _say_replaced(ctx, path, held, manifest)
        ctx.log.info(f"== {target.name}: bundle written to {path} ({seconds:.1f}s)")
        return TargetBuild(target.name, path, True, seconds, manifest)
    failures = variant_failures(output.verification, ctx)
    if len(failures) < len(output.models):
        return _publish_partial(ctx, target, writer, output, failures, times)
    rejected = dest.with_name(dest.name + ".rejected")
    writer.dest = rejected
    writer.commit(manifest)
    if dest.exists():
        shutil.rmtree(dest)  # an older bundle no longer matches this model: do not leave it looking good
        _say_replaced(ctx, dest, held, None)
    error = manifest["verification"]["reason"]
    ctx.log.warn(f"{target.name}: accuracy gate failed ({error}); kept for inspection in {rejected}")
    return TargetBuild(target.name, None, False, seconds, manifest, error, tuple(failures))


def _publish_partial(ctx: BuildContext, target: Target, writer: BundleWriter, output: BuilderOutput,
                     failures: dict[str, str], times: tuple[float, float]) -> TargetBuild:
    """Publish the models that passed the gate, with the best of them as the default, and move
    those that missed it into ``<dest>.rejected`` (evidence: its manifest holds every model's
    numbers). A device never gets a default model that failed."""
    kept, lost = _split(output, failures, ctx)
    held = _held(writer.dest)
    rejected = writer.dest.with_name(writer.dest.name + ".rejected")
    with BundleWriter(rejected) as evidence:
        for name in [m.file for m in lost.models] + _edgetpu_files(lost):
            os.replace(writer.dir / name, evidence.dir / name)
        for name in ("labels.txt", "build.log"):
            if (writer.dir / name).is_file():
                shutil.copy2(writer.dir / name, evidence.dir / name)
        evidence_manifest = bundle_manifest(ctx, target, lost, *times)
        evidence_manifest["verification"] = dict(
            verification_summary(output.verification, lost.default_model, ctx),
            published={"bundle": writer.dest.name, "models": [m.name for m in kept.models]})
        evidence.commit(evidence_manifest)
    manifest = bundle_manifest(ctx, target, kept, *times)
    manifest["verification"]["rejected"] = {
        m.name: {"reason": failures[m.name], "kept_in": rejected.name, "file": m.file, "bytes": m.bytes,
                 "verification": m.verification, "delegation": (output.delegation or {}).get(m.name)}
        for m in lost.models}
    path = writer.commit(manifest)
    _say_replaced(ctx, path, held, manifest)
    names = ", ".join(failures)
    ctx.log.warn(f"{target.name}: {names} missed the accuracy gate ({'; '.join(failures.values())}); the bundle "
                 f"{path} holds {', '.join(m.name for m in kept.models)} (default {kept.default_model}), "
                 f"{names} kept for inspection in {rejected}")
    return TargetBuild(target.name, path, False, times[0], manifest, "; ".join(failures.values()), tuple(failures))


def _held(dest: Any) -> tuple[list[str], bool] | None:
    """The variants of the bundle already at ``dest`` and whether it has an open-set fit (None: no bundle)."""
    if not dest.exists():
        return None
    try:
        manifest = json.loads((dest / MANIFEST).read_text(encoding="utf-8"))
        return [str(m["name"]) for m in manifest["models"]], bool(manifest.get("openset"))
    except (OSError, ValueError, KeyError, TypeError):
        return [], False


def _say_replaced(ctx: BuildContext, dest: Any, held: tuple[list[str], bool] | None, manifest: dict | None) -> None:
    """Say what the bundle at ``dest`` held and now holds (``manifest`` None: removed); a warning when less."""
    if held is None:
        return
    (was, had_fit), now = held, [m["name"] for m in (manifest or {}).get("models", [])]
    lost = [v for v in was if v not in now] + ["its open-set fit"] * (had_fit and not (manifest or {}).get("openset"))
    text = f"{'replaced' if manifest else 'removed'} {dest} (it held {', '.join(was) or 'an unreadable manifest'}"
    text += (f"; now {', '.join(now)})" if manifest else ")") + (f": {', '.join(lost)} no longer there" * bool(lost))
    (ctx.log.warn if lost else ctx.log.info)(text)


def _split(output: BuilderOutput, failures: dict[str, str], ctx: BuildContext) -> tuple[BuilderOutput, BuilderOutput]:
    """The builder's output as (models that passed, models that missed the gate), each with its
    own default (the builder's when it is in that part), delegation and Edge TPU report."""
    def part(models: list[BuiltModel], default: str) -> BuilderOutput:
        names = {m.name for m in models}
        delegation = None if output.delegation is None else {
            k: v for k, v in output.delegation.items() if k in names}
        # the Edge TPU report describes one int8 file: it goes where that file goes
        report_file = ((output.edgetpu or {}).get("offline") or {}).get("model")
        edgetpu = output.edgetpu if any(m.file == report_file for m in models) else None
        return replace(output, models=tuple(models), default_model=default, delegation=delegation, edgetpu=edgetpu)

    kept = [m for m in output.models if m.name not in failures]
    lost = [m for m in output.models if m.name in failures]
    keep_default = output.default_model if output.default_model not in failures else _best(kept)
    lost_default = output.default_model if output.default_model in failures else lost[0].name
    return part(kept, keep_default), part(lost, lost_default)


def _best(models: list[BuiltModel]) -> str:
    """The passing model closest to the original: the highest gate figure (accuracy or mAP ratio, else
    agreement, else worst-output cosine; landmarks: the least pixel error; segment: the mean mask IoU),
    the builder's order on a tie."""
    def figure(m: BuiltModel) -> float:
        res = m.verification.get("eval") or m.verification.get("holdout") or {}
        if (res.get("landmark_error_px") or {}).get("mean") is not None:
            return -float(res["landmark_error_px"]["mean"])
        if (res.get("mask_iou") or {}).get("mean") is not None:
            return float(res["mask_iou"]["mean"])
        for key in ("ratio", "agreement", "cosine"):
            if isinstance(res.get(key), (int, float)):
                return float(res[key])
        return float("-inf")

    return max(models, key=figure).name  # max keeps the first of equals


def _edgetpu_files(output: BuilderOutput) -> list[str]:
    """Files beside the models that belong to this part: the Edge TPU compiler's log."""
    log_file = ((output.edgetpu or {}).get("compiler") or {}).get("log_file")
    return [log_file] if log_file else []


def bundle_manifest(ctx: BuildContext, target: Target, output: BuilderOutput, seconds: float,
                    t_start: float) -> dict[str, Any]:
    """The bundle's ``edgekit.json`` (less ``format_version`` and ``files``, which the writer adds)."""
    default = output.default
    runtime_options = merge_options(target.runtime_options, output.runtime_options)
    manifest = {
        "name": ctx.name,
        "target": target.name,
        "summary": target.summary,
        "default_model": output.default_model,
        "models": [_entry(ctx, m.manifest_entry()) for m in output.models],
        "input": default.input.to_dict(),
        "outputs": [dict(o) for o in default.outputs],
        "labels": "labels.txt" if ctx.labels else None,
        "task": ctx.task,
        "source": _source(ctx),
        "runtime": {"adapter": target.adapter, "options": runtime_options},
        "provenance": _provenance(ctx, seconds, t_start),
        "verification": verification_summary(output.verification, output.default_model, ctx),
    }
    if ctx.task == "classify" and ctx.labels:
        manifest["openset"] = openset_entry(ctx.labels, ctx.background, output.verification, output.default_model)
    if output.delegation is not None:
        manifest["delegation"] = output.delegation
    if output.edgetpu is not None:
        manifest["edgetpu"] = output.edgetpu
    return manifest


def _entry(ctx: BuildContext, entry: dict[str, Any]) -> dict[str, Any]:
    """A model's manifest entry; a detector's gets its head's ``task_options`` (layout, the options the build
    was given, the output roles when the converter reordered outputs), a landmark or segment model's the options
    the build was given (output indices as this file has them)."""
    if ctx.detect is not None:
        entry["task_options"] = {**ctx.detect.task_options(entry.get("outputs", [])),
                                 **(entry.get("task_options") or {})}
    if (head := getattr(ctx, "landmarks", None) or getattr(ctx, "segment", None)) is not None:
        entry["task_options"] = head.task_options(entry.get("outputs", []))
    return entry


def _source(ctx: BuildContext) -> dict[str, Any]:
    """What the original model takes and gives: its format, input layout and shape as declared
    (symbolic dimensions by name), and its outputs in order. A bundle's input is always what a
    camera frame gives (NHWC for TFLite); this records what the model was exported with."""
    src = ctx.source
    return {"format": src.kind, "layout": src.layout, "input": src.input_name or None,
            "input_shape": [d if isinstance(d, int) else str(d) for d in src.input_shape],
            "outputs": [{"name": o.name, "shape": list(o.shape)} for o in src.outputs],
            **({"opset": src.opset} if src.opset else {})}


def _provenance(ctx: BuildContext, seconds: float, t_start: float) -> dict[str, Any]:
    model = ctx.request.model
    calib = ctx.calib_all
    return {
        "source_model": model.name,
        "source_sha256": sha256_file(model) if model.is_file() else None,
        "versions": _versions(),
        "calibration": {"sha256": calib.sha256, "images": len(ctx.calib),
                        "held_back": len(ctx.holdout), "converter_images": len(ctx.converter_calib),
                        "sources": calib.sources,
                        "skipped": calib.skipped},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.platform(),
        "build_seconds": seconds,
        "total_seconds_so_far": round(time.perf_counter() - t_start, 2),
        "peak_rss_bytes_so_far": peak_rss(),
    }


def _versions() -> dict:
    import importlib.metadata as md

    from edgekit._version import __version__

    out = {"edgekit": __version__, "python": platform.python_version()}
    for pkg in ("tensorflow-cpu", "tensorflow", "keras", "ai-edge-litert", "tf2onnx", "onnx", "onnxruntime",
                "onnxconverter-common", "numpy", "opencv-python-headless"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def verification_summary(per_variant: dict, default: str, ctx: BuildContext) -> dict:
    """The manifest's ``verification``: the default model's numbers, every model's, and the gate.

    ``classify`` with an eval set: every model reaches ``min_ratio`` of the original top-1; ``raw``: its
    worst output ``min_cosine`` on the eval (else held-back) images; ``detect`` without an eval set: the
    fidelity figures on the held-back images (builders/gate/detect.py); ``landmarks`` and ``segment``: the
    points' pixels and presence, the masks' IoU against the original's (builders/gate/landmarks.py,
    segment_gate.py). Otherwise the agreement on the held-back images is reported, not gated.
    """
    has_eval = ctx.evalset is not None
    raw = ctx.task == "raw"
    dataset = "eval" if has_eval else "holdout"
    gated = _gated(ctx)
    summary: dict[str, Any] = {
        "metric": _metric(ctx.task, has_eval),
        "dataset": {"eval_images": len(ctx.evalset) if has_eval else 0,
                    "eval_sha256": ctx.evalset.sha256 if has_eval else None,
                    "heldback_images": len(ctx.holdout)},
        "min_ratio": ctx.min_ratio,
        "gated": gated,
        "models": per_variant,
    }
    if raw:
        summary["min_cosine"] = ctx.request.min_cosine
    d = per_variant[default].get(dataset, {})
    summary.update(original=d.get("original"), converted=d.get("converted"), ratio=d.get("ratio"),
                   agreement=d.get("agreement"), sqnr_db=d.get("sqnr_db"), max_abs_diff=d.get("max_abs_diff"),
                   mean_abs_diff=d.get("mean_abs_diff"), cosine=d.get("cosine"), worst_output=d.get("worst_output"))
    if ctx.task == "detect":
        summary.update(map50=d.get("map50"), per_class=d.get("per_class"), layout=ctx.detect.layout)
    if (head := getattr(ctx, "landmarks", None) or getattr(ctx, "segment", None)) is not None:  # the limits, figures
        summary.update(head.summary(d))
    bad = variant_failures(per_variant, ctx)
    summary.update(passed=not bad, reason="; ".join(bad.values()) or None)
    if not gated:
        note = ("no --eval: mAP of each model against the original's own detections on the held-back "
                "calibration images (agreement), not gated" if ctx.task == "detect"
                else "no --eval: agreement on held-back calibration images, not gated")
        summary["note"] = f"{note}, beyond cosine >= {BROKEN_COSINE}"
    elif ctx.task == "detect" and not has_eval:
        summary["note"] = ("no --eval: each model's detections on the held-back calibration images held to the "
                           "original's (agreement at the bundle's threshold, distinct scores, score cosine); "
                           "their mAP against the original's detections reported")
    return summary


def _gated(ctx: BuildContext) -> bool:
    """Whether the gate judges the models: with --eval; for every task but ``classify`` also on the
    held-back images (a detector's fidelity to the original's detections, a landmark model's points
    and a segmenter's masks against the original's)."""
    has_eval = ctx.evalset is not None
    return (has_eval or bool(len(ctx.holdout))) if ctx.task != "classify" else has_eval


def variant_failures(per_variant: dict, ctx: BuildContext) -> dict[str, str]:
    """Why each model that misses the gate misses it, by model name in the builder's order
    (empty when all pass). Without a gate only a conversion that broke the model fails."""
    if not _gated(ctx):
        broken = {v: _collapsed(v, r.get("holdout", {})) for v, r in per_variant.items()}
        return {v: why for v, why in broken.items() if why}
    dataset = "eval" if ctx.evalset is not None else "holdout"
    return {v: _why(v, r.get(dataset, {}), ctx, ctx.task == "raw") + _where(r)
            for v, r in per_variant.items() if not Verdict.of(r.get(dataset)).passed}


BROKEN_COSINE = 0.5
"""Without --eval, a model whose worst output on the held-back images has a cosine below this
against the original's was broken by the conversion (int8 of a sound model gives 0.98 or more;
a padded-pool int8 mishap gave 0.55, an all-constant output 0): the build fails."""


def _collapsed(variant: str, holdout: dict) -> str | None:
    """Why a model's held-back outputs show a broken conversion, or None."""
    cosine = holdout.get("cosine")
    if not isinstance(cosine, (int, float)) or cosine >= BROKEN_COSINE:
        return None
    return (f"{variant} output {holdout.get('worst_output')} cosine {cosine} on {holdout.get('n', '?')} held-back "
            f"images < {BROKEN_COSINE}: the conversion broke the model (no --eval: only this is gated)")


def _metric(task: str, has_eval: bool) -> str:
    own = {"raw": "cosine_worst_output", "landmarks": "landmark_error_px", "segment": "mask_iou"}
    if task in own:
        return own[task]
    if task == "detect":
        return "map" if has_eval else "map_agreement_heldback"
    return "top1" if has_eval else "top1_agreement_heldback"


def _where(verification: dict) -> str:
    """Where an int8 model lost accuracy, when the quantisation report ran (builders/int8/report.py)."""
    report = verification.get("quantization")
    if not isinstance(report, dict):
        return ""
    from edgekit.builders.int8.report import summary

    text = summary(report)
    return f" ({text})" if text else ""


def _why(variant: str, res: dict, ctx: BuildContext, raw: bool) -> str:
    """Why one model missed the gate, in a few words."""
    reason = Verdict.of(res).reason  # every figure that failed, with its flag (gate/fidelity.py, gate/verify.py)
    if reason:
        return f"{variant} {reason}"
    if ctx.task == "detect":
        if res.get("ratio") is None:
            return (f"{variant}: the original model scores mAP 0 on the eval set "
                    "(wrong labels, preprocessing or detect layout?)")
        return (f"{variant} mAP@[.5:.95] {res.get('converted'):.4f} vs original {res.get('original'):.4f}: "
                f"ratio {res['ratio']} < {ctx.min_ratio}")
    if raw:
        return (f"{variant} output {res.get('worst_output')} cosine {res.get('cosine')} "
                f"< {ctx.request.min_cosine}")
    if res.get("ratio") is None:
        return f"{variant}: the original model scores 0 on the eval set (wrong labels or preprocessing?)"
    return f"{variant} ratio {res['ratio']} < {ctx.min_ratio}"
