"""One target of a build: run its builder, describe the result in ``edgekit.json``, then publish
the bundle when the accuracy gate passes or keep it as ``<bundle>.rejected`` when it does not.

Whatever happens, no bundle from an earlier build is left at the destination looking as if this
build had produced it.
"""

from __future__ import annotations

import contextlib
import platform
import shutil
import time
from datetime import datetime, timezone
from typing import Any

from edgekit.builders.context import BuildContext
from edgekit.builders.contract import BuilderOutput, TargetBuild
from edgekit.bundle import BundleWriter, sha256_file
from edgekit.errors import EdgekitError, UsageError
from edgekit.plugins import resolve
from edgekit.target import Target, merge_options


def build_target(ctx: BuildContext, target: Target, t_start: float) -> TargetBuild:
    """Build, verify and publish (or reject) one target's bundle under ``ctx.request.out``.

    Raises EdgekitError when the target cannot be built here or its builder fails; a bundle
    that misses the accuracy gate is not an error here (``TargetBuild.passed`` is False).
    """
    ok, why = target.can_build()
    if not ok:
        raise EdgekitError(f"cannot build {target.name} here: {why}")
    builder = resolve(target.builder, target.build_hint)
    out = ctx.request.out
    dest = out / f"{ctx.name}-{target.name}"
    t0 = time.perf_counter()
    ctx.log.info(f"== target {target.name}: {target.summary}")
    try:
        writer_cm = BundleWriter(dest)
        writer = writer_cm.__enter__()
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc.strerror}", "choose a writable --out directory") from exc
    try:
        output = builder(ctx, target, writer.dir)
        if not isinstance(output, BuilderOutput):
            raise EdgekitError(f"builder {target.builder} returned {type(output).__name__}, not a BuilderOutput")
        if ctx.labels:
            (writer.dir / "labels.txt").write_text("\n".join(ctx.labels) + "\n", encoding="utf-8")
        seconds = round(time.perf_counter() - t0, 2)
        manifest = bundle_manifest(ctx, target, output, seconds, t_start)
        (writer.dir / "build.log").write_text(ctx.log.text(), encoding="utf-8")
        ctx.log.check()  # Ctrl-C during the last step: do not publish the bundle
        return _publish(ctx, target, writer, manifest, seconds)
    except EdgekitError:
        if dest.exists():
            # The bundle there came from an earlier build; leaving it would make this failed
            # build look like it produced it.
            shutil.rmtree(dest)
            ctx.log.warn(f"removed {dest}: it was built by an earlier run and does not match this model")
        raise
    finally:
        writer_cm.__exit__(None, None, None)


def _publish(ctx: BuildContext, target: Target, writer: BundleWriter, manifest: dict, seconds: float) -> TargetBuild:
    """Rename the bundle into place if it passed the gate, else keep it as ``<dest>.rejected``."""
    dest = writer.dest
    verification = manifest["verification"]
    if verification["passed"]:
        path = writer.commit(manifest)
        ctx.log.info(f"== {target.name}: bundle written to {path} ({seconds:.1f}s)")
        return TargetBuild(target.name, path, True, seconds, manifest)
    rejected = dest.with_name(dest.name + ".rejected")
    shutil.rmtree(rejected, ignore_errors=True)
    writer.dest = rejected
    writer.commit(manifest)
    if dest.exists():
        shutil.rmtree(dest)  # an older bundle no longer matches this model: do not leave it looking good
    error = verification["reason"]
    ctx.log.warn(f"{target.name}: accuracy gate failed ({error}); kept for inspection in {rejected}")
    return TargetBuild(target.name, None, False, seconds, manifest, error)


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
        "models": [m.manifest_entry() for m in output.models],
        "input": default.input.to_dict(),
        "outputs": [dict(o) for o in default.outputs],
        "labels": "labels.txt" if ctx.labels else None,
        "runtime": {"adapter": target.adapter, "options": runtime_options},
        "provenance": _provenance(ctx, seconds, t_start),
        "verification": verification_summary(output.verification, output.default_model, ctx),
    }
    if output.delegation is not None:
        manifest["delegation"] = output.delegation
    if output.edgetpu is not None:
        manifest["edgetpu"] = output.edgetpu
    return manifest


def _provenance(ctx: BuildContext, seconds: float, t_start: float) -> dict[str, Any]:
    model = ctx.request.model
    calib = ctx.calib_all
    return {
        "source_model": model.name,
        "source_sha256": sha256_file(model) if model.is_file() else None,
        "versions": _versions(),
        "calibration": {"sha256": calib.sha256, "images": len(ctx.calib.images),
                        "held_back": len(ctx.holdout.images), "sources": calib.sources,
                        "skipped": calib.skipped},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.platform(),
        "build_seconds": seconds,
        "total_seconds_so_far": round(time.perf_counter() - t_start, 2),
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

    With an eval set every model must reach ``min_ratio``; without one the agreement on the
    held-back calibration images is reported but does not gate.
    """
    has_eval = ctx.evalset is not None
    summary: dict[str, Any] = {
        "metric": "top1" if has_eval else "top1_agreement_heldback",
        "dataset": {"eval_images": len(ctx.evalset.images) if has_eval else 0,
                    "eval_sha256": ctx.evalset.sha256 if has_eval else None,
                    "heldback_images": len(ctx.holdout.images)},
        "min_ratio": ctx.min_ratio,
        "gated": has_eval,
        "models": per_variant,
    }
    d = per_variant[default]
    if has_eval:
        e = d["eval"]
        summary.update(original=e["original"], converted=e["converted"], ratio=e["ratio"],
                       agreement=e["agreement"], sqnr_db=e["sqnr_db"], max_abs_diff=e["max_abs_diff"])
        bad = [f"{v} ratio {r['eval']['ratio']} < {ctx.min_ratio}" if r["eval"]["ratio"] is not None
               else f"{v}: the original model scores 0 on the eval set (wrong labels or preprocessing?)"
               for v, r in per_variant.items() if not r["eval"]["passed"]]
        summary["passed"] = not bad
        summary["reason"] = "; ".join(bad) if bad else None
    else:
        hb = d.get("holdout", {})
        summary.update(original=None, converted=None, ratio=None, agreement=hb.get("agreement"),
                       sqnr_db=hb.get("sqnr_db"), max_abs_diff=hb.get("max_abs_diff"), passed=True,
                       reason=None, note="no --eval: agreement on held-back calibration images, not gated")
    return summary
