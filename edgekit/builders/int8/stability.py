"""Does an int8 result depend on which images calibrated it? A second sample says.

TensorFlow's calibrator takes each activation's range from the min and max it meets on the
calibration images, so a range reached by only a few images is cut short in a sample without
them (seen: PaddleOCR's orientation classifier at 0.894-0.967 of float top-1 depending on the
images). After an int8 model is built and verified, when the gate's figure is under the
threshold or within half a margin above it (margin = 1 - threshold: what the gate lets a model
lose), the model is quantised once more, the same way, from another sample of as many images
(``--seed`` + 1 over the same non-held-back calibration images, disjoint from the first where
there are enough; the held-back ones join in when the converter saw all the others and an eval
set is what the gate judges) and verified like the first. When the two figures differ by more than the
margin, or one passes and the other misses, the build warns in one line naming both, and
recommends the next doubling of the calibration count; when the model missed the gate, recovery
tries that count first (builders/int8/recovery.py, ``recommended_images``), else it is not tried. The
check costs one int8 conversion and verification per target at most, and none when the figure is
far from the gate: a model that passes half a margin above it is verified as shipped, and another
sample cannot change the model kept. A model that missed the gate on another figure (a detector's
agreement or scores, builders/gate/fidelity.py) is checked whatever its ratio.
A landmark model is judged by its mean pixel error against the original's points, a limit it stays
under (builders/gate/landmarks.py): "near" is over half the limit, the margin is the limit itself.
The model kept is always the first: another seed is a second opinion, not a search over seeds.
``--no-recover`` (``recover=False``) builds int8 once: no check either.
The record: ``verification.models.int8.calibration_stability``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.builders.gate.figures import judged
from edgekit.builders.gate.landmarks import judged_px
from edgekit.builders.gate.segment import judged_iou
from edgekit.builders.gate.verdict import Verdict, failed
from edgekit.builders.int8.recipe import float_graphs
from edgekit.errors import ModelError

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.builders.contract import BuiltModel
    from edgekit.target import Target

NEAR = 0.5
"""A figure less than this many margins above the threshold (or under it) is checked."""
MIN_MARGIN = 0.005
"""The margin when the threshold leaves none (e.g. --min-accuracy-ratio 1.0)."""
HOPELESS = 0.5
"""A figure under this is a broken calibration or conversion (as builders/int8/recovery.py judges it)."""


@dataclass(frozen=True)
class Gate:
    """The figure the gate judged a model by, and its threshold (``higher``: a floor the figure stays
    at or above; else a limit it stays at or under: a landmark model's pixel error)."""

    name: str  # "top-1 ratio", "mAP ratio", "worst cosine", "landmark px mean"
    flag: str  # the option that sets the threshold
    threshold: float
    figure: float
    missed: bool = False  # the model missed the gate (a detector may, on another figure, with its ratio far above)
    higher: bool = True
    broken_over: float = math.inf  # a limit's: the figure over which the conversion is broken

    @property
    def margin(self) -> float:
        """What the gate lets a model lose: 1 - threshold (MIN_MARGIN for a threshold of 1 or more);
        for a limit, the limit itself (from no error at all)."""
        if not self.higher:
            return self.threshold
        return 1.0 - self.threshold if self.threshold < 1 else MIN_MARGIN

    @property
    def far(self) -> bool:
        """The figure lies half a margin or more inside the gate."""
        if self.higher:
            return self.figure >= self.threshold + NEAR * self.margin
        return self.figure <= self.threshold - NEAR * self.margin

    @property
    def broken(self) -> bool:
        """A figure no other sample can mend: under HOPELESS, or over a limit's ``broken_over``."""
        return self.figure < HOPELESS if self.higher else self.figure > self.broken_over


def gate_of(task: str, min_ratio: float, min_cosine: float, verification: dict,
            min_agreement: float = 0.9) -> Gate | None:
    """The gate's figure of one model's verification (the lowest over the data sets it judged:
    a ratio, or for ``raw`` the worst output's cosine; for ``landmarks`` the judged data set's mean
    pixel error, for ``segment`` its mean mask IoU; for a detector without an eval set, whose held-back
    images were gated by its agreement with the original's detections, that agreement against
    ``min_agreement``: it has no ratio, which read 0, "a broken calibration"); None when no gate judged it."""
    if task == "landmarks":
        return _landmark_gate(verification)
    if task == "segment":  # builders/gate/segment.py: the judged data set's mean mask IoU, a floor
        found = judged_iou(verification)
        return Gate("mask IoU mean", "--min-mask-iou", found[1], found[0], failed(verification)) if found else None
    found = judged(verification, task) if task == "detect" else None
    if found is not None and found[0] == "detection agreement":
        return Gate(found[0], "--min-detect-agreement", min_agreement, found[1], failed(verification))
    figures = []
    for res in verification.values():
        if isinstance(res, dict) and Verdict.of(res).passed is not None:
            value = res.get("cosine") if task == "raw" else res.get("ratio")
            figures.append(float(value) if value is not None else 0.0)  # a ratio of nothing: 0 (it failed)
    if not figures:
        return None
    missed = failed(verification)
    if task == "raw":
        return Gate("worst cosine", "--min-cosine", min_cosine, min(figures), missed)
    flag = "--min-map-ratio" if task == "detect" else "--min-accuracy-ratio"
    return Gate("mAP ratio" if task == "detect" else "top-1 ratio", flag, min_ratio, min(figures), missed)


def _landmark_gate(verification: dict) -> Gate | None:
    """A landmark model's gate: the mean pixel error of the data set judged (builders/gate/landmarks.py),
    its limit, and the error over which the conversion is broken (a tenth of the input)."""
    judged = judged_px(verification)
    if judged is None:
        return None
    figure, limit, broken = judged
    return Gate("landmark px mean", "--max-landmark-error", limit, figure, failed(verification), False, broken)


def skip_reason(gate: Gate | None, sample: tuple[np.ndarray, str] | None) -> str | None:
    """Why the check does not run (None: it runs); ``sample``: :func:`other_sample`'s answer."""
    if gate is None:
        return "no gate judged the model (give --eval)"
    if gate.far and not gate.missed:
        if not gate.higher:
            return (f"{gate.name} {gate.figure} is {gate.threshold - gate.figure:.4g} under the limit "
                    f"{gate.threshold:g}; checked over {gate.threshold - NEAR * gate.margin:.6g}, "
                    "half a margin under it")
        return (f"{gate.name} {gate.figure} is {gate.figure - gate.threshold:.4g} above the gate {gate.threshold:g}; "
                f"checked under {gate.threshold + NEAR * gate.margin:.6g}, half a margin above it")
    if gate.broken:
        under = f"under {HOPELESS}" if gate.higher else f"over {gate.broken_over:g}"
        return f"{gate.name} {gate.figure} is {under}: a broken calibration or conversion, not a sample"
    if sample is None:
        return ("the converter calibrated on every calibration image the gate does not judge: no other sample "
                "of as many exists")
    return None


def other_sample(held: int, pool: int, used: int, seed: int, held_usable: bool) -> tuple[np.ndarray, str] | None:
    """A second sample of ``used`` images drawn with ``seed``, as indices into the drawn images
    (``held`` held back first, then the ``pool`` whose first ``used`` the converter saw), and its
    kind: ``disjoint`` when the pool has ``used`` other images, else ``overlapping``, else, when
    the held-back images are not what the gate judges (``held_usable``: an eval set judges),
    ``with_held_back`` (all of them, the rest from the pool); else None. Never a resample with
    replacement: fewer distinct images narrow the ranges, which would overstate the spread."""
    rng = np.random.default_rng(seed)
    if pool - used >= used:
        return np.sort(held + used + rng.choice(pool - used, used, replace=False)), "disjoint"
    if pool > used:
        return np.sort(held + rng.choice(pool, used, replace=False)), "overlapping"
    if held_usable and held:  # every held-back image in, as many of the pool's out: the most different sample
        if held >= used:
            return np.sort(rng.choice(held, used, replace=False)), "with_held_back"
        return np.concatenate([np.arange(held), np.sort(held + rng.choice(pool, used - held, replace=False))]), \
            "with_held_back"
    return None


def recommendation(used: int, pool: int, drawn: int, found: int, holdout_fraction: float) -> str:
    """The flags that double the images the int8 converter calibrates on (``used`` of the
    ``pool`` of non-held-back images; ``drawn`` images drawn of ``found`` listed)."""
    want = 2 * used
    if pool >= want:
        return f"--calib-steps {want}"
    need = math.ceil(want / (1 - holdout_fraction))  # --holdout: that share of the drawn images is held back
    if found >= need:
        return f"--calib-count {need} --calib-steps {want}"
    short = (f"add calibration images: {want} calibrating needs {need} drawn (a share is held back), "
             f"the folders hold {found}")
    if found > drawn:  # meanwhile, every image there is
        return f"{short}; meanwhile --calib-count {found} --calib-steps {math.floor(found * (1 - holdout_fraction))}"
    return short


def check(ctx: BuildContext, target: Target, path: Path, model: BuiltModel, finish,
          quantize: Callable[[Any], bytes]) -> BuiltModel:
    """``model`` (the int8 just verified, its file at ``path``) with ``calibration_stability`` in
    its verification, after quantising it again from another sample when its figure is near the
    gate (module doc). ``quantize(representative) -> bytes`` makes the int8 graph the first
    attempt's way; ``finish(blob, rewrites, seconds, report=False)`` writes ``path`` and verifies
    it (``path`` gets the first model's bytes back). Logs one line; warns when the two disagree."""
    request = ctx.request
    gate = gate_of(ctx.task, ctx.min_ratio, request.min_cosine, model.verification, request.min_detect_agreement)
    pool, used = len(ctx.calib), len(ctx.converter_calib)
    # the held-back images may calibrate the second model when an eval set, not they, is what the gate judges
    held_usable = ctx.evalset is not None and ctx.task != "raw"
    sample = other_sample(len(ctx.holdout), pool, used, request.seed + 1, held_usable)
    reason = skip_reason(gate, sample)
    if reason is not None:
        ctx.log.info(f"[{target.name}] int8 calibration check: not run ({reason})")
        return _with(model, {"checked": False, "reason": reason})
    idx, kind = sample
    kept_bytes = path.read_bytes()
    with ctx.log.step(f"[{target.name}] int8 calibration check: quantise again from seed {request.seed + 1}'s "
                      f"sample ({len(idx)} images, {kind.replace('_', ' ')})") as step, _warnings_as_info(ctx.log):
        try:
            blob = quantize(ctx.calib_all.subset(idx).stream(ctx._nhwc, ctx.chunk))
            second, _ = finish(blob, list(float_graphs(ctx).rewrites), 0.0, report=False)
        except ModelError as exc:  # a second opinion that failed does not fail the build
            second = None
            reason = f"the second sample's int8 failed: {exc.message[:200]}"
        finally:
            path.write_bytes(kept_bytes)  # the bundle keeps the first model
    if second is None:
        ctx.log.info(f"[{target.name}] int8 calibration check: not completed ({reason})")
        return _with(model, {"checked": False, "reason": reason})
    other = gate_of(ctx.task, ctx.min_ratio, request.min_cosine, second.verification, request.min_detect_agreement)
    record = _record(gate, other, second.verification, model.verification, (request.seed, request.seed + 1),
                     (used, len(idx)), kind)
    record["seconds"] = round(step["seconds"], 2)  # the conversion and verification this check added
    if not record["stable"]:
        record["recommendation"] = recommendation(used, pool, len(ctx.calib_all), ctx.calib_all.found,
                                                  request.holdout_fraction)
        record["recommended_images"] = 2 * used  # what recovery tries first when the model missed (recovery.py)
        ctx.log.warn(f"[{target.name}] {unstable_line(record, gate, tried=failed(model.verification))}")
    else:
        ctx.log.info(f"[{target.name}] int8 calibration check: {gate.name} {record['figures'][0]} with seed "
                     f"{request.seed}, {record['figures'][1]} with seed {request.seed + 1}'s sample: stable "
                     f"(spread {record['spread']}, margin {gate.margin:g}; {record['seconds']:.1f} s)")
    return _with(model, record)


def _record(gate: Gate, other: Gate | None, second: dict, first: dict, seeds: tuple[int, int],
            images: tuple[int, int], kind: str) -> dict[str, Any]:
    """The manifest's ``calibration_stability`` of a check that ran."""
    figures = [round(gate.figure, 6), round(other.figure if other is not None else 0.0, 6)]
    passed = [not failed(first), not failed(second)]
    spread = round(abs(figures[0] - figures[1]), 6)
    return {"checked": True, "figure_name": gate.name, "threshold": gate.threshold, "margin": round(gate.margin, 6),
            "seeds": list(seeds), "images": list(images), "sample": kind, "figures": figures, "passed": passed,
            "spread": spread, "stable": spread <= gate.margin and passed[0] == passed[1], "recommendation": None}


def unstable_line(record: dict, gate: Gate, tried: bool = False) -> str:
    """The one warning line of a check whose two samples disagree; ``tried``: the model missed
    the gate, so recovery tries the recommended count next (builders/int8/recovery.py)."""
    (a, b), (sa, sb), (na, nb) = record["figures"], record["seeds"], record["images"]
    other = {"disjoint": f"{nb} other images", "overlapping": f"{nb} images, partly the same",
             "with_held_back": f"{nb} images, held-back ones among them"}[record["sample"]]
    why = (f"they differ by {record['spread']}, more than the gate's margin {gate.margin:g}"
           if record["spread"] > gate.margin else f"they differ by {record['spread']}, within the gate's margin")
    if record["passed"][0] != record["passed"][1]:
        why += f", and only seed {sa if record['passed'][0] else sb}'s passes {gate.flag} {gate.threshold:g}"
    then = "recovery tries it next, within its time budget" if tried else "not tried here"
    return (f"int8 depends on its calibration sample: {gate.name} {a} calibrated on --seed {sa}'s {na} images, "
            f"{b} on seed {sb}'s {other}; {why}: calibrate on more images ({record['recommendation']}; "
            f"{then}) and compare two --seed builds")




def _with(model: BuiltModel, record: dict) -> BuiltModel:
    return replace(model, verification=dict(model.verification, calibration_stability=record))


@contextmanager
def _warnings_as_info(log) -> Iterator[None]:
    """The second model is not kept: what its conversion and verification would warn about
    (a detector's fidelity, XNNPACK) goes to the log as an info line, not a warning."""
    log.warn = lambda msg: log.info(f"(calibration check, model not kept) {msg}")
    try:
        yield
    finally:
        del log.warn  # the class's own again
