"""``edgekit bench BUNDLE --set-default``: the device re-decides which variant its bundle opens by default.

The build decides the default on the build host (edgekit/builders/gate/speed.py), whose XNNPACK is only a
proxy for the device's. Here every variant of the bundle was just timed on the device itself, in
interleaved repeats; the same robust rule decides (:mod:`edgekit.bench.default_choice`: each repeat's
fastest run, the median of the per-repeat ratios, a candidate past 1.05x), and when it names another
variant than the bundle's default, ``edgekit.json`` is rewritten whole or not at all (a temporary file
and a rename) with:

- ``default_model``, the bundle-level ``input`` and ``outputs`` (the default model's), the figures
  ``verification`` gives of the default model and the open-set thresholds at the top of ``openset``
  (the new default's own, which the build fitted for every variant);
- ``default_choice``: the variant, the one it replaced, the verdict (ratio per repeat and the
  median), each variant's p50 and the machine it was measured on (CPU, cores, load, governor, host).

Every bundle file keeps its bytes, so the sha256 list in ``files`` stays valid (the manifest is not
in it). A detached signature over the manifest (``edgekit.sig``, edgekit/fleet/signature.py) no longer
matches once the manifest changes: the result says the bundle must be re-signed. Only variants the
bundle holds are candidates: a variant that missed the accuracy gate was never written into it.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.bench.default_choice import DEFAULT_MARGIN, STATISTIC, Choice, choose
from edgekit.bundle import MANIFEST, load_bundle
from edgekit.errors import EdgekitError, UsageError
from edgekit.util.atomic import write_text_atomic

SIGNATURE_FILE = "edgekit.sig"
"""The detached signature a signed bundle carries (edgekit/fleet/signature.py's ``SIGNATURE``): it signs
``edgekit.json``, so a rewritten manifest needs a new one."""

#: the top-level ``verification`` keys that give the default model's figures (builders/publish.py)
DEFAULT_FIGURES = ("original", "converted", "ratio", "agreement", "sqnr_db", "max_abs_diff", "mean_abs_diff",
                   "cosine", "worst_output", "map50", "per_class", "landmark_error_px", "presence_agreement",
                   "mask_iou", "mask_area")


def check_request(models: Sequence[str], eval_dir: str | None) -> Path:
    """The one bundle ``--set-default`` may rewrite (UsageError, before anything is measured, for
    several models, a ``BUNDLE:VARIANT``, a model file or ``--eval``)."""
    fix = "give one bundle folder: edgekit bench dist/demo-cpu --set-default"
    if eval_dir:
        raise UsageError("--set-default decides by speed; --eval measures accuracy", "run them separately")
    if len(models) != 1:
        raise UsageError(f"--set-default rewrites one bundle; {len(models)} models were given", fix)
    path = Path(models[0])
    if not path.is_dir() or not (path / MANIFEST).is_file():
        raise UsageError(f"--set-default rewrites a bundle's {MANIFEST}; {models[0]} is not a bundle folder", fix)
    return path


@dataclass(frozen=True)
class DefaultSet:
    """What ``--set-default`` decided and did: the choice, the default it replaced, whether the manifest
    was rewritten, and whether the bundle carries a signature that the rewrite invalidated."""

    bundle: Path
    previous: str
    choice: Choice
    written: bool
    signed: bool

    def lines(self) -> list[str]:
        """What the command prints: the decision, then, for a signed bundle that changed, the warning."""
        why = self.choice.reason
        if not self.written:
            return [f"default: {self.previous} kept ({why}); {self.bundle / MANIFEST} unchanged"]
        out = [f"default: {self.previous} -> {self.choice.variant} ({why}); wrote {self.bundle / MANIFEST}"]
        if self.signed:
            out.append(f"warning: {self.bundle / SIGNATURE_FILE} signs the old {MANIFEST}: re-sign the bundle "
                       f"(edgekit sign {self.bundle} --key KEY) before a device that checks signatures takes it")
        return out


def _rounds(report: Any, bundle: Path) -> dict[str, list[list[float]]]:
    """Per variant of ``bundle`` in ``report``, each repeat's inference times (ms). UsageError when a
    variant was measured twice (several backends) or a run missed the bench minimums."""
    rounds: dict[str, list[list[float]]] = {}
    for v in report.variants:
        if v.variant is None or Path(v.path).resolve() != bundle.resolve():
            continue
        if v.variant in rounds:
            raise UsageError(f"--set-default: {v.variant} was measured more than once (several --backend)",
                             "give one --backend, the one the device runs")
        if not v.valid:
            raise EdgekitError(f"--set-default: {v.name}'s runs missed the bench minimums; nothing written",
                               "run longer (--min-duration, --min-count) or with --max-duration unset")
        rounds[v.variant] = [list(r.samples_ms["inference"]) for r in v.runs]
    return rounds


def set_default(report: Any, bundle: str | Path, margin: float = DEFAULT_MARGIN) -> DefaultSet:
    """Decide the default of ``bundle`` from ``report`` (a :class:`~edgekit.bench.report.BenchReport` that
    timed its variants) and rewrite its ``edgekit.json`` when it changes (module doc)."""
    bundle = Path(bundle)
    loaded = load_bundle(bundle)  # hashes checked: a tampered bundle is not rewritten
    manifest = loaded.manifest
    previous = manifest.get("default_model") or loaded.model().name
    rounds = _rounds(report, bundle)
    if previous not in rounds:
        raise UsageError(f"--set-default: the bundle's default {previous} was not measured",
                         "measure every variant: --variants all (the default with --set-default)")
    verification = manifest.get("verification") or {}
    passed = {name for name, v in (verification.get("models") or {}).items()
              if not any(isinstance(r, dict) and r.get("passed") is False for r in (v or {}).values())}
    passing = [m.name for m in loaded.models if m.name in passed or not verification.get("models")]
    choice = choose(previous, passing, rounds, margin)
    signed = (bundle / SIGNATURE_FILE).exists()
    if choice.variant == previous:
        return DefaultSet(bundle, previous, choice, False, signed)
    text = json.dumps(rewritten(manifest, choice, previous, report, rounds), indent=2, default=str) + "\n"
    write_text_atomic(bundle / MANIFEST, text, force=True)
    load_bundle(bundle)  # the rewritten manifest still holds every file to its sha256
    return DefaultSet(bundle, previous, choice, True, signed)


def rewritten(manifest: dict, choice: Choice, previous: str, report: Any,
              rounds: dict[str, list[list[float]]]) -> dict:
    """A copy of ``manifest`` whose default is ``choice.variant`` (module doc), keys in their order."""
    out = json.loads(json.dumps(manifest))  # a deep copy, JSON types only
    name = choice.variant
    entry = next(m for m in out["models"] if m["name"] == name)
    out["default_model"] = name
    for key in ("input", "outputs"):
        if key in out and key in entry:
            out[key] = entry[key]
    verification = out.get("verification")
    if isinstance(verification, dict):
        dataset = "eval" if (verification.get("dataset") or {}).get("eval_images") else "holdout"
        figures = ((verification.get("models") or {}).get(name) or {}).get(dataset) or {}
        verification.update({k: figures.get(k) for k in DEFAULT_FIGURES if k in verification})
    openset = out.get("openset")
    fit = ((openset or {}).get("models") or {}).get(name) if isinstance(openset, dict) else None
    if isinstance(fit, dict):
        openset.update(fit)
    verdict = choice.verdict.to_dict() if choice.verdict is not None else {"reason": choice.reason}
    out["default_choice"] = {
        "variant": name, "previous": previous, "by": "edgekit bench --set-default", "when": report.started,
        "statistic": STATISTIC, **verdict, "repeats": {v: len(r) for v, r in rounds.items()},
        "p50_ms": {v.variant: round(v.pooled().p50_ms, 4) for v in report.variants if v.variant in rounds},
        "runtime_options": dict(getattr(report.config, "runtime_options", None) or {}),
        "measured_on": measured_on(report.machine),
    }
    return out


def measured_on(machine: dict[str, Any]) -> dict[str, Any]:
    """The machine a decision was measured on, from the report's context (edgekit/bench/machine.py)."""
    keys = ("cpu_model", "machine", "system", "cores", "cores_usable", "governor", "load_average", "libraries")
    return {"host": platform.node(), **{k: machine.get(k) for k in keys}}
