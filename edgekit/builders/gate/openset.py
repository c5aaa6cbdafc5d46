"""The open-set thresholds of a classifier bundle, fitted at build time on the evaluation set.

A classifier with a background class (the label ``background``, any case, or
``--background-class NAME``) and an ``--eval`` set gets, per variant, the margin over the
runner-up (and for a model that emits logits, the energy) at which at most 1 % of the eval
set's background images would still be announced (:func:`edgekit.heads.openset.fit`). Per variant,
not once on the original: an int8 model's softmax comes in steps of 1/256, so its margins are
not the float model's. The rates are cross-validated (two folds), so the false-announcement
rate in the log and the manifest is measured on background images the fit did not see.

A bundle without a background class gets no fit: its manifest says it cannot tell "nothing
there", and the sign demo prints that warning at start.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.errors import UsageError
from edgekit.heads.openset import (
    DEFAULT_MAX_FALSE_RATE,
    DEFAULT_MIN_SCORE,
    NO_ENERGY,
    are_probabilities,
    background_index,
    fit,
)
from edgekit.heads.tensors import softmax

NO_BACKGROUND = ("no background class: the bundle cannot tell \"nothing there\" and a plain scene gets its "
                 "most likely label (train one with a 'background' label, or name it with --background-class)")


def background_of(labels: list[str], name: str | None) -> int | None:
    """The background class's index: ``name`` when given (it must be a label), else ``background``."""
    index = background_index(labels, name)
    if name is not None and index is None:
        raise UsageError(f"--background-class {name!r} is not one of the model's labels",
                         f"choose one of: {', '.join(labels[:12])}")
    return index


def fit_variant(class_rows: np.ndarray, truth: np.ndarray, background: int) -> dict[str, Any]:
    """The open-set fit of one variant from its class output on the eval set (one row per image)."""
    rows = np.asarray(class_rows, dtype=np.float64).reshape(len(class_rows), -1)
    if are_probabilities(rows):
        return {**fit(rows, truth, background, DEFAULT_MIN_SCORE, DEFAULT_MAX_FALSE_RATE), "energy_note": NO_ENERGY}
    return fit(softmax(rows), truth, background, DEFAULT_MIN_SCORE, DEFAULT_MAX_FALSE_RATE, logits=rows)


def manifest_entry(labels: list[str], background: int | None, per_variant: dict[str, dict],
                   default: str) -> dict[str, Any]:
    """The manifest's ``openset``: the default model's fit at the top, every model's under ``models``
    (without ``--eval``: the background class only, and a note that nothing was fitted)."""
    if background is None:
        return {"background_class": None, "can_tell_nothing_there": False, "note": NO_BACKGROUND}
    fits = {v: r["eval"]["openset"] for v, r in per_variant.items()
            if isinstance(r.get("eval"), dict) and "openset" in r["eval"]}
    if not fits:
        return {"background_class": labels[background], "can_tell_nothing_there": True,
                "note": "no --eval: no thresholds fitted (build again with --eval DIR: a folder per class, "
                        "the background one included)"}
    top = fits.get(default) or next(iter(fits.values()))
    models = {v: {k: x for k, x in f.items() if k != "energy_note"} for v, f in fits.items()}
    return {"background_class": labels[background], "can_tell_nothing_there": True,
            "fitted_on": "eval (rates two-fold cross-validated)", **top, "models": models}


def log_line(openset: dict[str, Any] | None) -> str | None:
    """The build log's open-set line for one target, or None when nothing was fitted."""
    if not openset:
        return None
    if not openset.get("can_tell_nothing_there"):
        return f"open-set: {NO_BACKGROUND}"
    if "min_margin" not in openset:  # no --eval
        return f"open-set: background class {openset['background_class']!r}; {openset['note']}"
    energy = openset.get("max_energy")
    signal = f"margin >= {openset['min_margin']:.3f}" + (f" and energy <= {energy:.3f}" if energy is not None else "")
    return (f"open-set: {signal} at score >= {openset['min_score']:g}: false announcements on "
            f"{openset['images']['background']} held-out background images "
            f"{_pct(openset['false_announcement_rate_without'])} -> {_pct(openset['false_announcement_rate'])}, "
            f"items kept {_pct(openset['item_recall'])} (of {_pct(openset['item_recall_without'])} named right "
            f"at that score)" + _energy_note(openset))


def _energy_note(openset: dict[str, Any]) -> str:
    if openset.get("max_energy") is not None:
        return ""
    if openset.get("signal") == "margin+energy":  # logits, but no plain scene counted even without it
        return "; no energy limit needed: no held-out background image counts at that score"
    return "; no energy signal: softmax output"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
