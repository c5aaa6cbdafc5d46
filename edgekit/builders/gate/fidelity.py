"""A converted detector held to what its users see, beside the mAP ratio (the ``detect`` gate).

mAP alone passed a damaged int8: BlazeFace's score logits span about [-266, 3], per-tensor int8
left 5 distinct scores, its scores cosine was 0.915 and its detections agreed 0.51 with the
original's on held-back images, and the build said PASS because mAP went *up* (ratio 1.16).
On the eval images every converted detector is therefore also held to:

- **agreement**: its detections at the bundle's own score threshold matched one to one with the
  original's (same class, IoU >= 0.5, best score first): 2 x matched / (original's + converted's)
  (the F1 of the converted against the original), ``--min-detect-agreement``, when the original
  made :data:`MIN_GATED_DETECTIONS` or more there;
- **score levels**: distinct scores among its detections (rounded to 1e-4), at least
  ``--min-score-levels``, or as many as the original's when it has fewer (a hand-set detector
  whose scores are a few exact values keeps them all);
- **score cosine**: the cosine similarity of the output holding the scores (a YOLO-style output
  holds the boxes too) with the original's, ``--min-score-cosine``;
- **mAP gain**: a ratio above 1 + ``--max-map-gain`` fails: a conversion does not improve a model,
  a gain that large says its scores or boxes moved.

The same figures are computed on the held-back images and reported (not gated, as the mAP there),
or gated there when there is no eval set (builders/gate/detect.py).
Each failure is one line naming the figure and the flag that governs it (``gate_failures``,
flag -> line), which the build's reason and fix quote. A classifier's counterpart,
``--min-top1-agreement``, is gated in builders/gate/verify.py (``classify_gate``); its value is
checked here with the others (:func:`check_thresholds`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.builders.gate.verdict import Verdict

MATCH_IOU = 0.5
"""A converted detection agrees with an original one of the same class at this IoU or more."""
MIN_GATED_DETECTIONS = 10
"""The agreement at the threshold is gated only when the original made at least this many
detections there: on 4 (BlazeFace on calibration images without faces) one miss reads 0.75, noise
rather than a figure; fewer are reported."""
LEVEL_DECIMALS = 4
"""Scores are rounded to this many decimals before counting distinct levels: a float model's
continuous scores stay distinct, an 8-bit output's 256 steps (0.0039 apart) too."""


@dataclass(frozen=True)
class FidelityGate:
    """The thresholds of the fidelity gate (each 0 turns its figure's gate off; see the module doc)."""

    min_agreement: float
    min_levels: int
    min_score_cosine: float
    max_gain: float

    @classmethod
    def of(cls, request: Any) -> FidelityGate:
        """The thresholds a build request sets (the request's defaults, builders/request.py, when None)."""
        from edgekit.builders.request import default

        return cls(*(getattr(request, name, default(name)) for name in _SETTINGS))


_SETTINGS = ("min_detect_agreement", "min_score_levels", "min_score_cosine", "max_map_gain")
FLAGS = {"agreement": "--min-detect-agreement", "score_levels": "--min-score-levels",
         "score_cosine": "--min-score-cosine", "gain": "--max-map-gain", "ratio": "--min-map-ratio"}
"""The flag that governs each figure of the detect gate."""


def _iou(box: Sequence[float], others: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box with ``[M, 4]`` xyxy boxes."""
    lo, hi = np.maximum(others[:, :2], box[:2]), np.minimum(others[:, 2:], box[2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    area = np.prod(np.clip(others[:, 2:] - others[:, :2], 0, None), axis=1)
    union = max(box[2] - box[0], 0) * max(box[3] - box[1], 0) + area - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def matched(reference: Sequence[Any], converted: Sequence[Any], min_iou: float = MATCH_IOU) -> int:
    """How many of ``reference``'s detections (best score first) find an unmatched detection of
    the same class in ``converted`` at ``min_iou`` or more (the best IoU is taken)."""
    boxes = np.asarray([d.box for d in converted], np.float64).reshape(-1, 4)
    free = np.ones(len(converted), bool)
    classes = np.asarray([d.index for d in converted])
    count = 0
    for ref in sorted(reference, key=lambda d: -d.score):
        ious = np.where(free & (classes == ref.index), _iou(ref.box, boxes), -1.0) if len(converted) else []
        if len(ious) and ious.max() >= min_iou:
            free[int(ious.argmax())] = False
            count += 1
    return count


def threshold_agreement(reference: Sequence[Any], converted: Sequence[Any], threshold: float) -> dict | None:
    """The converted detections at ``threshold`` against the original's (image ``i`` of each is the
    same image): ``agreement`` 2 x matched / (both counts); None when neither finds anything."""
    pairs = total_ref = total_conv = 0
    for ref, found in zip(reference, converted):
        r = [d for d in ref.detections if d.score >= threshold]
        c = [d for d in found.detections if d.score >= threshold]
        total_ref, total_conv = total_ref + len(r), total_conv + len(c)
        pairs += matched(r, c)
    if not total_ref + total_conv:
        return None
    return {"threshold": threshold, "agreement": round(2 * pairs / (total_ref + total_conv), 4), "matched": pairs,
            "original": total_ref, "converted": total_conv}


def score_levels(found: Sequence[Any]) -> int:
    """Distinct scores (rounded to :data:`LEVEL_DECIMALS`) among every detection of ``found``."""
    scores = [d.score for f in found for d in f.detections]
    return int(np.unique(np.round(np.asarray(scores, np.float64), LEVEL_DECIMALS)).size) if scores else 0


def score_output(layout: str, roles: tuple[int, ...] | None) -> int:
    """The index of the original's output that holds the scores (YOLO: its one output)."""
    if not roles:
        return 0
    if layout == "postprocess":
        return int(roles[2])  # (boxes, classes, scores, count)
    return int(roles[1]) if len(roles) > 1 else int(roles[0])  # ssd: (boxes, scores); yolo: (0,)


def figures(reference: Sequence[Any], found: Sequence[Any], threshold: float, outputs: dict | None,
            score_name: str | None) -> dict[str, Any]:
    """The fidelity figures of one data set (see the module doc), for ``fidelity`` in its verification."""
    res: dict[str, Any] = {"detections": threshold_agreement(reference, found, threshold),
                           "score_levels": {"original": score_levels(reference), "converted": score_levels(found)}}
    cosine = ((outputs or {}).get(score_name) or {}).get("cosine") if score_name else None
    res["score_cosine"] = {"output": score_name, "cosine": cosine}
    return res


def failures(fidelity: dict, map_res: dict, gate: FidelityGate, min_ratio: float) -> dict[str, str]:
    """Flag -> one line per figure of the eval set that misses its threshold (empty: it passes)."""
    out: dict[str, str] = {}
    ratio = map_res.get("ratio")
    if ratio is not None and ratio < min_ratio:
        out[FLAGS["ratio"]] = (f"mAP@[.5:.95] {map_res['converted']:.4f} vs original {map_res['original']:.4f}: "
                               f"ratio {ratio} < {min_ratio} ({FLAGS['ratio']})")
    if ratio is not None and not math.isinf(gate.max_gain) and ratio > 1 + gate.max_gain:
        out[FLAGS["gain"]] = (f"mAP@[.5:.95] ratio {ratio} > {1 + gate.max_gain:g}: more than the noise margin "
                              f"above the original's, so its scores or boxes moved ({FLAGS['gain']} {gate.max_gain:g})")
    det = fidelity.get("detections")
    if det is not None and det["original"] >= MIN_GATED_DETECTIONS and det["agreement"] < gate.min_agreement:
        out[FLAGS["agreement"]] = (f"detections at score >= {det['threshold']:g} agree {det['agreement']:.4f} with the "
                                   f"original's ({det['matched']} matched of {det['original']} original, "
                                   f"{det['converted']} converted) < {gate.min_agreement:g} ({FLAGS['agreement']})")
    levels = fidelity["score_levels"]
    need = min(gate.min_levels, levels["original"])
    if levels["converted"] < need:
        out[FLAGS["score_levels"]] = (f"{levels['converted']} distinct scores < {need} (the original has "
                                      f"{levels['original']}; {FLAGS['score_levels']} {gate.min_levels})")
    cos = fidelity["score_cosine"]
    if cos["cosine"] is not None and cos["cosine"] < gate.min_score_cosine:
        out[FLAGS["score_cosine"]] = (f"score output {cos['output']} cosine {cos['cosine']} < "
                                      f"{gate.min_score_cosine:g} ({FLAGS['score_cosine']})")
    return out


def why(variant: str, res: dict) -> str | None:
    """Why ``variant`` missed the detect gate, from its eval result's ``gate_failures`` (None: none recorded)."""
    reason = Verdict.of(res).reason
    return f"{variant} {reason}" if reason else None
