"""Open-set rejection: when may a classifier's top class be said at all (numpy only, device side).

A frame's top class counts only when it is not the background class, its score clears
``min_score`` and a second signal agrees: its margin over the runner-up clears ``min_margin``
and, for a model that emits logits, its energy ``-logsumexp(logits)`` is at most
``max_energy`` (Liu et al. 2020, "Energy-based Out-of-distribution Detection"). The build fits
the thresholds on the evaluation set (:mod:`edgekit.builders.gate.openset`) and stores them in the
bundle's manifest under ``openset``; :func:`check_manifest` is the loader's range check.

Energy needs logits. A model that ends in a softmax hands over probabilities, and
``log p_i = z_i - logsumexp(z)`` removes exactly the per-image level that energy and the
max-logit measure: ``logsumexp(log p) = 0`` for every image, and the max log-probability is
a monotone function of the max probability (the score gate already has it). What survives the
softmax is the *difference* of logits, ``z_1 - z_2 = log(p_1 / p_2)``: the margin. So for such
a model the second signal is the margin alone, and the manifest says why energy is absent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_MIN_SCORE = 0.8  # the sign demo's --min-confidence
DEFAULT_MAX_FALSE_RATE = 0.01  # share of held-out plain scenes allowed to count toward an announcement
NO_ENERGY = ("the class output is a softmax: probabilities carry no logit scale (log p = z - logsumexp z), "
             "so energy and max-logit cancel out; the margin over the runner-up is the second signal")


def margins(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of a ``(N, classes)`` score array: top index, top score, top minus runner-up."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, axis=1)
    top = np.take_along_axis(scores, order[:, :1], axis=1)[:, 0]
    second = np.take_along_axis(scores, order[:, 1:2], axis=1)[:, 0] if scores.shape[1] > 1 else 0 * top
    return order[:, 0], top, top - second


def energy(logits: np.ndarray) -> np.ndarray:
    """Free energy ``-logsumexp(z)`` per row of ``(N, classes)`` logits: low for what the model knows."""
    z = np.asarray(logits, dtype=np.float64)
    peak = z.max(axis=1, keepdims=True)
    return -(peak[:, 0] + np.log(np.exp(z - peak).sum(axis=1)))


def are_probabilities(rows: np.ndarray, tolerance: float = 0.05) -> bool:
    """True when every row lies in [0, 1] and sums to 1 within ``tolerance`` (a softmax output;
    the tolerance absorbs the 1/256 steps of a quantised one)."""
    rows = np.asarray(rows, dtype=np.float64)
    return bool(rows.size) and bool(np.all(rows >= -1e-6) and np.all(rows <= 1 + 1e-6)
                                    and np.all(np.abs(rows.sum(axis=1) - 1) <= tolerance))


def lowest_threshold(values: np.ndarray, passes: np.ndarray, max_rate: float, floor: float = 0.0) -> float:
    """The lowest ``t >= floor`` at which at most ``max_rate`` of the rows have ``passes & values >= t``.

    Lowest, because every item above it is kept: the bound is met while losing the fewest.
    """
    values, passes = np.asarray(values, np.float64), np.asarray(passes, bool)
    if not len(values):
        return floor
    for t in np.unique(np.concatenate([[floor], values[values >= floor] + 1e-6])):
        if np.mean(passes & (values >= t)) <= max_rate:
            return float(t)
    return float(values.max() + 1e-6)  # unreachable: above every value nothing passes


def fit_margin(item_margin: np.ndarray, item_ok: np.ndarray, bg_margin: np.ndarray, bg_passes: np.ndarray,
               max_false_rate: float) -> dict[str, float]:
    """The smallest margin threshold at which at most ``max_false_rate`` of the held-out
    background images would pass the gate, and what it leaves of the items.

    ``item_ok``: the item was classified right and passes the other checks; ``bg_passes``:
    the background image's top class is not background and clears ``min_confidence``.
    """
    bg_margin, bg_passes = np.asarray(bg_margin, np.float64), np.asarray(bg_passes, bool)
    chosen = lowest_threshold(bg_margin, bg_passes, max_false_rate)
    false_rate = float(np.mean(bg_passes & (bg_margin >= chosen))) if len(bg_margin) else 0.0
    recall = float(np.mean(item_ok & (item_margin >= chosen))) if len(item_margin) else 0.0
    return {"min_margin": round(min(chosen, 1.0), 6), "background_false_rate": false_rate, "item_recall": recall}


def folds(truth: np.ndarray) -> np.ndarray:
    """0 or 1 per row, alternating within each class: two halves with every class in both."""
    truth = np.asarray(truth)
    fold = np.zeros(len(truth), dtype=np.int64)
    for c in np.unique(truth):
        rows = np.flatnonzero(truth == c)
        fold[rows] = np.arange(len(rows)) % 2
    return fold


def fit(scores: np.ndarray, truth: np.ndarray, background: int, min_score: float = DEFAULT_MIN_SCORE,
        max_false_rate: float = DEFAULT_MAX_FALSE_RATE, logits: np.ndarray | None = None) -> dict[str, Any]:
    """Fit the second signal on a labelled set and measure it on images it was not fitted on.

    ``scores``: ``(N, classes)`` probabilities; ``truth``: each row's class, ``background``
    marking plain scenes; ``logits``: the raw class output when the model emits logits (then
    an energy threshold is fitted too). The thresholds are fitted on all rows. The rates are
    two-fold cross-validated: each row is judged by thresholds fitted on the other half, so
    ``false_announcement_rate`` is measured on background images the fit never saw.
    """
    truth = np.asarray(truth, dtype=np.int64)
    top, score, margin = margins(scores)
    known = -energy(logits) if logits is not None else None  # logsumexp: high for what the model knows
    counts = (top != background) & (score >= min_score)  # would count without a second signal
    scene, item = truth == background, truth != background
    right = counts & (top == truth)
    fold = folds(truth)
    held = np.zeros(len(truth), dtype=bool)  # passes the second signal fitted on the other half
    for k in (0, 1):
        thresholds = _fit_signals(margin, known, counts, scene & (fold != k), max_false_rate)
        held[fold == k] = _second_signal(thresholds, margin, known)[fold == k]
    final = _fit_signals(margin, known, counts, scene, max_false_rate)
    return {
        "min_score": min_score,
        "min_margin": round(min(final[0], 1.0), 6),
        "max_energy": round(-final[1], 6) if final[1] is not None and math.isfinite(final[1]) else None,
        "signal": "margin" if known is None else "margin+energy",
        "false_announcement_rate_without": _rate(counts[scene]),
        "false_announcement_rate": _rate((counts & held)[scene]),
        "item_recall_without": _rate(right[item]),
        "item_recall": _rate((right & held)[item]),
        "images": {"background": int(scene.sum()), "items": int(item.sum())},
        "max_false_rate": max_false_rate,
    }


def _fit_signals(margin: np.ndarray, known: np.ndarray | None, counts: np.ndarray, scenes: np.ndarray,
                 max_rate: float) -> tuple[float, float | None]:
    """(min margin, min logsumexp or None): each alone keeps the scenes that count within ``max_rate``."""
    min_margin = lowest_threshold(margin[scenes], counts[scenes], max_rate)
    if known is None:
        return min_margin, None
    return min_margin, lowest_threshold(known[scenes], counts[scenes], max_rate, floor=-math.inf)


def _second_signal(thresholds: tuple[float, float | None], margin: np.ndarray, known: np.ndarray | None) -> np.ndarray:
    ok = margin >= thresholds[0]
    return ok if known is None or thresholds[1] is None else ok & (known >= thresholds[1])


def _rate(flags: np.ndarray) -> float | None:
    return round(float(np.mean(flags)), 6) if len(flags) else None


def background_index(labels: Sequence[str], name: str | None = None) -> int | None:
    """Index of the label ``name`` (default ``background``), case-insensitive, or None."""
    wanted = (name or "background").strip().lower()
    return next((i for i, label in enumerate(labels) if label.strip().lower() == wanted), None)


_UNIT = ("min_score", "min_margin", "false_announcement_rate", "false_announcement_rate_without",
         "item_recall", "item_recall_without", "max_false_rate")


def check_manifest(openset: Any) -> str | None:
    """What is wrong with a manifest's ``openset`` (untrusted), or None when it is usable."""
    if openset is None:
        return None
    if not isinstance(openset, dict):
        return "'openset' is not an object"
    if not isinstance(openset.get("background_class"), (str, type(None))):
        return "'openset.background_class' is not a label"
    models = openset.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
        return "'openset.models' is not an object of objects"
    for where, entry in (("openset", openset), *((f"openset.models.{k}", v) for k, v in models.items())):
        problem = _check_entry(entry)
        if problem:
            return f"{where}: {problem}"
    return None


def _check_entry(entry: dict) -> str | None:
    for key in _UNIT:
        value = entry.get(key)
        if value is not None and (not _number(value) or not 0.0 <= value <= 1.0):
            return f"{key} {value!r} is not a number within 0..1"
    value = entry.get("max_energy")
    if value is not None and not _number(value):
        return f"max_energy {value!r} is not a finite number"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
