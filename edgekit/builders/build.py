"""``edgekit.build``: model + calibration images -> one verified bundle per target.

The model is loaded, exported and its reference outputs computed once; each target's
builder then converts, writes and verifies its variants into a temporary directory that is
renamed into place only when the accuracy gate passes.
"""

from __future__ import annotations

import contextlib
import json
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.builders.calibration import ImageSet, load_calibration, load_eval
from edgekit.builders.log import BuildLog, interruptible
from edgekit.builders.source import SourceModel, load_source_model
from edgekit.builders.verify import compare
from edgekit.bundle import BundleWriter
from edgekit.errors import EdgekitError, UsageError, VerificationFailed
from edgekit.image import InputSpec, Preprocessor
from edgekit.plugins import resolve
from edgekit.target import Target, load_target

PREPROCESS_KEYS = ("colour", "crop", "resize", "interpolation", "mean", "std")


@dataclass
class BuildResult:
    """What one target's build produced."""

    target: str
    bundle: Path | None
    passed: bool
    seconds: float
    manifest: dict = field(default_factory=dict)
    error: str | None = None


class BuildContext:
    """Everything the target builders share: model, images, reference outputs, log."""

    def __init__(self, source: SourceModel, name: str, labels: list[str], float_spec: InputSpec,
                 calib: ImageSet, holdout: ImageSet, evalset: ImageSet | None, log: BuildLog,
                 options: dict[str, Any], workdir: Path):
        self.source, self.name, self.labels, self.float_spec = source, name, labels, float_spec
        self.calib, self.holdout, self.evalset, self.log = calib, holdout, evalset, log
        self.options, self.workdir = options, workdir
        self._saved: Path | None = None
        self._float = Preprocessor(float_spec)
        self.reference = {}
        with log.step("reference outputs of the original model"):
            if evalset is not None:
                self.reference["eval"] = source.predict(evalset.tensors(self._float))
            if holdout.images:
                self.reference["holdout"] = source.predict(holdout.tensors(self._float))
        self.min_ratio = float(options.get("min_accuracy_ratio", 0.99))

    def saved_model(self) -> Path:
        """A static batch-1 SavedModel of the source, exported once per build."""
        if self._saved is None:
            with self.log.step("export SavedModel (static batch 1)"):
                self._saved = self.source.export_static(self.workdir / "saved_model")
        return self._saved

    def representative(self) -> np.ndarray:
        """Float tensors of the calibration images, for int8 conversion."""
        return self.calib.tensors(self._float)

    def verify(self, variant: str, run, spec: InputSpec) -> dict:
        """Run a converted variant on the eval and held-back images and compare with the original."""
        prep = Preprocessor(spec)
        out: dict[str, Any] = {}
        with self.log.step(f"verify {variant}"):
            if self.evalset is not None:
                res = compare(self.reference["eval"], run(self.evalset.tensors(prep)), self.evalset.labels,
                              self.evalset.class_names)
                res["passed"] = res.get("ratio") is not None and res["ratio"] >= self.min_ratio
                out["eval"] = res
                self.log.info(f"  {variant}: top-1 original {res['original']:.4f} converted {res['converted']:.4f} "
                              f"ratio {res['ratio']} agreement {res['agreement']:.4f} SQNR {res['sqnr_db']} dB")
            if self.holdout.images:
                res = compare(self.reference["holdout"], run(self.holdout.tensors(prep)))
                out["holdout"] = res
                self.log.info(f"  {variant}: agreement on {res['n']} held-back calibration images "
                              f"{res['agreement']:.4f}, max abs diff {res['max_abs_diff']}")
        return out


def read_sidecars(model_path: Path) -> tuple[list[str] | None, dict]:
    """Labels and preprocessing saved beside a model as ``<stem>.labels.txt`` / ``<stem>.preprocess.json``."""
    stem = model_path.with_suffix("") if model_path.is_file() else model_path
    labels_file = Path(f"{stem}.labels.txt")
    if not labels_file.is_file() and model_path.is_dir():
        labels_file = model_path / "labels.txt"
    labels = labels_file.read_text(encoding="utf-8").split("\n") if labels_file.is_file() else None
    labels = [x.strip() for x in labels if x.strip()] if labels else None
    pre_file = Path(f"{stem}.preprocess.json")
    preprocess = json.loads(pre_file.read_text()) if pre_file.is_file() else {}
    return labels, preprocess


def _versions() -> dict:
    import importlib.metadata as md

    from edgekit._version import __version__

    out = {"edgekit": __version__, "python": platform.python_version()}
    for pkg in ("tensorflow-cpu", "tensorflow", "keras", "ai-edge-litert", "tf2onnx", "onnx", "onnxruntime",
                "onnxconverter-common", "numpy", "opencv-python-headless"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def build(
    model: str | Path,
    targets: list[str] | str,
    calib: list[str | Path] | str | Path,
    out: str | Path = "dist",
    eval_dir: str | Path | None = None,
    name: str | None = None,
    labels: list[str] | str | Path | None = None,
    preprocess: dict | None = None,
    min_accuracy_ratio: float = 0.99,
    calib_count: int | None = 500,
    holdout_fraction: float = 0.2,
    seed: int = 0,
    quiet: bool = False,
    **options: Any,
) -> list[BuildResult]:
    """Build one verified bundle per target.

    Args:
        model: ``.keras``, ``.h5``, SavedModel directory, or ``.onnx`` (jetson only).
        targets: target names (``edgetpu``, ``rpi``, ``cpu``, ``jetson``) or ``.toml`` paths;
            a comma-separated string works too.
        calib: calibration folder(s) and/or video(s); mix in real camera frames here.
        out: the directory that receives ``<name>-<target>/`` bundles.
        eval_dir: ImageFolder of labelled images; enables the accuracy gate.
        labels: list, or a labels.txt path; default ``<model stem>.labels.txt`` or the eval classes.
        preprocess: overrides of colour/crop/resize/interpolation/mean/std; default
            ``<model stem>.preprocess.json``.
        min_accuracy_ratio: converted/original top-1 below this fails the target.
        calib_count: calibration images drawn (with ``seed``); ``holdout_fraction`` of them
            are held back to measure agreement.
        options: builder options (``variants``, ``io_dtype``, ``compiler``, ``min_tpu_ops`` ...).

    Returns one BuildResult per target. Raises VerificationFailed (after building the other
    targets) when any target misses the accuracy gate; other errors as EdgekitError.
    """
    t_start = time.perf_counter()
    _check_numbers(min_accuracy_ratio, calib_count, holdout_fraction)
    log = BuildLog(quiet=quiet)
    with interruptible(log):
        return _build(log, t_start, model, targets, calib, out, eval_dir, name, labels, preprocess,
                      min_accuracy_ratio, calib_count, holdout_fraction, seed, options)


def _build(log, t_start, model, targets, calib, out, eval_dir, name, labels, preprocess, min_accuracy_ratio,
           calib_count, holdout_fraction, seed, options) -> list[BuildResult]:
    target_list = [t.strip() for t in targets.split(",")] if isinstance(targets, str) else list(targets)
    resolved: list[Target] = [load_target(t) for t in target_list if t]
    if not resolved:
        raise UsageError("no target given", "pass --target edgetpu,rpi,cpu,jetson")
    model = Path(model)
    source = load_source_model(model)
    if source.kind == "onnx" and any(t.name != "jetson" for t in resolved):
        raise UsageError("ONNX input can only be built for the jetson target",
                         "give the Keras/SavedModel for edgetpu, rpi and cpu")
    side_labels, side_pre = read_sidecars(model)
    if isinstance(labels, (str, Path)):
        try:
            labels = [x.strip() for x in Path(labels).read_text(encoding="utf-8").splitlines() if x.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read labels file {labels}: {getattr(exc, 'strerror', None) or exc}",
                             "give a text file with one label per line") from exc
    pre = {**side_pre, **(preprocess or {})}
    h, w, c = source.input_hwc
    layout = "NHWC"
    if source.kind == "onnx":
        node_shape = [d if isinstance(d, int) else 1 for d in source.handle.get_inputs()[0].shape]
        layout = "NHWC" if node_shape[3] == c else "NCHW"
    shape = (1, h, w, c) if layout == "NHWC" else (1, c, h, w)
    spec_kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in pre.items() if k in PREPROCESS_KEYS}
    spec_kw.setdefault("colour", "gray" if c == 1 else "rgb")
    spec_kw.setdefault("mean", (0.0,) * c)
    spec_kw.setdefault("std", (255.0,) * c)
    for key in ("mean", "std"):
        if len(spec_kw[key]) == 1 and c > 1:
            spec_kw[key] = tuple(spec_kw[key]) * c
    _check_preprocess(spec_kw, c)
    float_spec = InputSpec(shape=shape, layout=layout, **spec_kw)
    log.info(f"model {model.name}: {source.kind}, input {h}x{w}x{c}; preprocessing "
             + ", ".join(f"{k}={v}" for k, v in spec_kw.items())
             + ("" if side_pre or preprocess else " (defaults: no preprocess.json beside the model)"))
    prep = Preprocessor(float_spec)
    calib_sources = [calib] if isinstance(calib, (str, Path)) else list(calib or [])
    with log.step("load calibration images"):
        calib_set = load_calibration(calib_sources, prep, calib_count, seed, log)
    n_hold = int(len(calib_set.images) * holdout_fraction) if len(calib_set.images) >= 10 else 0
    holdout = calib_set.subset(np.arange(n_hold))
    used = calib_set.subset(np.arange(n_hold, len(calib_set.images)))
    evalset = None
    if eval_dir is not None:
        with log.step("load evaluation images"):
            evalset = load_eval(eval_dir, prep, labels or side_labels, log)
    labels = labels or side_labels or (evalset.class_names if evalset else None)
    n_out = source.output_size()
    if labels and n_out and len(labels) != n_out:
        raise UsageError(f"{len(labels)} labels for a model with {n_out} outputs",
                         "give a labels file with one line per output class (--labels)")
    name = name or (model.stem if model.is_file() else model.name)
    opts = {**options, "min_accuracy_ratio": min_accuracy_ratio}
    results: list[BuildResult] = []
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="edgekit-build-") as work:
        ctx = BuildContext(source, name, labels or [], float_spec, used, holdout, evalset, log, opts, Path(work))
        for target in resolved:
            results.append(_build_target(ctx, target, out, calib_set, model, t_start))
    failed = [r for r in results if not r.passed]
    if failed:
        raise VerificationFailed(
            "; ".join(f"{r.target}: {r.error}" for r in failed),
            f"no bundle was written for {', '.join(r.target for r in failed)}; "
            "see the .rejected bundle's edgekit.json, calibrate with more representative images, "
            "or lower --min-accuracy-ratio",
        ).with_results(results)
    return results


def _check_numbers(min_accuracy_ratio: float, calib_count: int | None, holdout_fraction: float) -> None:
    if not 0 < min_accuracy_ratio <= 1.5:
        raise UsageError(f"--min-accuracy-ratio {min_accuracy_ratio} makes no sense",
                         "use a ratio like 0.99 (converted top-1 / original top-1)")
    if calib_count is not None and calib_count < 1:
        raise UsageError(f"--calib-count {calib_count}: need at least one calibration image", "use e.g. 500")
    if not 0 <= holdout_fraction < 1:
        raise UsageError(f"holdout fraction {holdout_fraction} must be in [0, 1)")


def _check_preprocess(spec: dict, channels: int) -> None:
    """Reject preprocessing that cannot apply to this model, before any work is done."""
    crop = spec.get("crop")
    if crop not in (None, "none", "square") and (
        not isinstance(crop, (list, tuple)) or len(crop) != 2 or any(int(v) < 1 for v in crop)
    ):
        raise UsageError(f"bad crop {crop!r}", "use square, none or HxW with positive sizes, like 200x200")
    for key in ("mean", "std"):
        values = spec.get(key, ())
        if len(values) not in (1, channels):
            raise UsageError(f"--{key} has {len(values)} values for a {channels}-channel input",
                             f"give 1 or {channels} comma-separated values")
    if any(float(v) <= 0 for v in spec.get("std", ())):
        raise UsageError("--std must be positive (pixel = (value - mean) / std)", "use e.g. 255 or 127.5")
    if spec.get("colour") not in ("gray", "rgb", "bgr"):
        raise UsageError(f"bad colour {spec.get('colour')!r}", "use gray, rgb or bgr")
    if channels == 1 and spec["colour"] != "gray" or channels == 3 and spec["colour"] == "gray":
        raise UsageError(f"colour {spec['colour']} does not fit a {channels}-channel model input",
                         "use --colour gray for 1 channel, rgb or bgr for 3")


def _build_target(ctx: BuildContext, target: Target, out: Path, calib_set: ImageSet, model: Path,
                  t_start: float) -> BuildResult:
    ok, why = target.can_build()
    if not ok:
        raise EdgekitError(f"cannot build {target.name} here: {why}")
    builder = resolve(target.builder, target.build_hint)
    dest = out / f"{ctx.name}-{target.name}"
    t0 = time.perf_counter()
    ctx.log.info(f"== target {target.name}: {target.summary}")
    try:
        writer_cm = BundleWriter(dest)
        writer = writer_cm.__enter__()
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc.strerror}", "choose a writable --out directory") from exc
    try:
        parts = builder(ctx, target, writer.dir)
        if ctx.labels:
            (writer.dir / "labels.txt").write_text("\n".join(ctx.labels) + "\n", encoding="utf-8")
        verification = _verification_summary(parts["verification"], parts["default_model"], ctx)
        seconds = round(time.perf_counter() - t0, 2)
        default = next(m for m in parts["models"] if m["name"] == parts["default_model"])
        manifest = {
            "name": ctx.name,
            "target": target.name,
            "summary": target.summary,
            "default_model": parts["default_model"],
            "models": parts["models"],
            "input": default["input"],
            "outputs": default["outputs"],
            "labels": "labels.txt" if ctx.labels else None,
            "runtime": {"adapter": target.adapter, "options": {**target.runtime_options,
                                                               **parts.get("runtime_options", {})}},
            "provenance": {
                "source_model": model.name,
                "source_sha256": _sha_path(model),
                "versions": _versions(),
                "calibration": {"sha256": calib_set.sha256, "images": len(ctx.calib.images),
                                "held_back": len(ctx.holdout.images), "sources": calib_set.sources,
                                "skipped": calib_set.skipped},
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "host": platform.platform(),
                "build_seconds": seconds,
                "total_seconds_so_far": round(time.perf_counter() - t_start, 2),
            },
            "verification": verification,
        }
        for key in ("delegation", "edgetpu"):
            if key in parts:
                manifest[key] = parts[key]
        (writer.dir / "build.log").write_text(ctx.log.text(), encoding="utf-8")
        ctx.log.check()  # Ctrl-C during the last step: do not publish the bundle
        if verification["passed"]:
            path = writer.commit(manifest)
            ctx.log.info(f"== {target.name}: bundle written to {path} ({seconds:.1f}s)")
            return BuildResult(target.name, path, True, seconds, manifest)
        rejected = dest.with_name(dest.name + ".rejected")
        shutil.rmtree(rejected, ignore_errors=True)
        writer.dest = rejected
        writer.commit(manifest)
        if dest.exists():
            shutil.rmtree(dest)  # an older bundle no longer matches this model: do not leave it looking good
        error = verification["reason"]
        ctx.log.warn(f"{target.name}: accuracy gate failed ({error}); kept for inspection in {rejected}")
        return BuildResult(target.name, None, False, seconds, manifest, error)
    except EdgekitError:
        if dest.exists():
            # The bundle there came from an earlier build; leaving it would make this failed
            # build look like it produced it.
            shutil.rmtree(dest)
            ctx.log.warn(f"removed {dest}: it was built by an earlier run and does not match this model")
        raise
    finally:
        writer_cm.__exit__(None, None, None)


def _verification_summary(per_variant: dict, default: str, ctx: BuildContext) -> dict:
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


def _sha_path(path: Path) -> str | None:
    from edgekit.bundle import sha256_file

    return sha256_file(path) if path.is_file() else None
