"""Open-set rejection and announce-once for the sign demo (device side: numpy only).

A frame counts toward an announcement only when (a) its top class is not the background
class, (b) its score clears ``min_confidence`` and (c) its margin over the runner-up clears
``min_margin``. The margin threshold is fitted on held-out images (items and plain scenes)
by ``python -m robot.thresholds`` and stored beside the bundle, so a model without a
background class still has a second signal. The :class:`Debouncer` then needs ``agree``
such frames in a row and says a label once per appearance.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import UsageError

CAMERA_FRAME_S = 1 / 15  # a real Vector's frame interval: the clock when update() is given no time
THRESHOLDS_SUFFIX = ".signs.json"  # written beside the bundle: dist/demo-cpu -> dist/demo-cpu.signs.json


@dataclass(frozen=True)
class Gate:
    """Whether one frame's prediction may count toward an announcement (see the module doc)."""

    min_confidence: float = 0.8
    min_margin: float = 0.0
    background: int | None = None

    def accepts(self, index: int, score: float, margin: float = 1.0) -> bool:
        """True when class ``index`` at ``score``, ``margin`` above the runner-up, may count."""
        return index != self.background and score >= self.min_confidence and margin >= self.min_margin


@dataclass
class Debouncer:
    """Announce a class once it passed the :class:`Gate` for ``agree`` frames in a row, once per appearance.

    After a label is said it is not said again while it stays the top class. It is re-armed
    only after ``rearm_s`` seconds in a row in which it was not the top class (the scene went
    back to background, or another label showed up): an item held for 10 s is said once, a
    one-frame flicker does not re-arm it, and a *different* label is never masked.
    """

    agree: int = 3
    min_confidence: float = 0.8
    background: int | None = None
    rearm_s: float = 0.5
    min_margin: float = 0.0
    _candidate: int | None = None
    _streak: int = 0
    _announced: int | None = None
    _away_since: float | None = None
    _t: float = 0.0

    @property
    def gate(self) -> Gate:
        return Gate(self.min_confidence, self.min_margin, self.background)

    def update(self, index: int, score: float, margin: float = 1.0, t_s: float | None = None) -> int | None:
        """Feed one frame's top class (and its margin over the runner-up, and the capture time
        in seconds; default one camera frame after the previous call); returns the class index
        to announce, or None."""
        self._t = self._t + CAMERA_FRAME_S if t_s is None else t_s
        if self._away_since is not None and self._t - self._away_since >= self.rearm_s - 1e-9:
            self._announced, self._away_since = None, None  # gone long enough: the next one is new
        if index == self._announced:
            self._away_since = None  # still there
        elif self._announced is not None and self._away_since is None:
            self._away_since = self._t
        vote = index if self.gate.accepts(index, score, margin) else None
        if vote is None or vote != self._candidate:
            self._candidate, self._streak = vote, (0 if vote is None else 1)
        else:
            self._streak += 1
        if vote is None or self._streak < self.agree or vote == self._announced:
            return None
        self._announced, self._away_since = vote, None
        return vote


def margins(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of a ``(N, classes)`` score array: top index, top score, top minus runner-up."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, axis=1)
    top = np.take_along_axis(scores, order[:, :1], axis=1)[:, 0]
    second = np.take_along_axis(scores, order[:, 1:2], axis=1)[:, 0] if scores.shape[1] > 1 else 0 * top
    return order[:, 0], top, top - second


def fit_margin(item_margin: np.ndarray, item_ok: np.ndarray, bg_margin: np.ndarray, bg_passes: np.ndarray,
               max_false_rate: float) -> dict[str, float]:
    """The smallest margin threshold at which at most ``max_false_rate`` of the held-out
    background images would pass the gate, and what it leaves of the items.

    ``item_ok``: the item was classified right and passes the other checks; ``bg_passes``:
    the background image's top class is not background and clears ``min_confidence``.
    """
    bg_margin, bg_passes = np.asarray(bg_margin, np.float64), np.asarray(bg_passes, bool)
    chosen = 0.0
    if len(bg_margin):
        # ascending: the first threshold that meets the bound keeps the most items
        for t in np.unique(np.concatenate([[0.0], bg_margin + 1e-6])):
            chosen = float(t)
            if np.mean(bg_passes & (bg_margin >= t)) <= max_false_rate:
                break
    false_rate = float(np.mean(bg_passes & (bg_margin >= chosen))) if len(bg_margin) else 0.0
    recall = float(np.mean(item_ok & (item_margin >= chosen))) if len(item_margin) else 0.0
    return {"min_margin": round(min(chosen, 1.0), 6), "background_false_rate": false_rate, "item_recall": recall}


def thresholds_path(bundle: str | Path) -> Path:
    """Where ``robot.thresholds`` writes a bundle's fitted thresholds: beside it, not inside it
    (every file inside a bundle is hashed in its manifest)."""
    path = Path(str(bundle).split(":", 1)[0]) if not Path(str(bundle)).exists() else Path(bundle)
    return path.with_name(path.name + THRESHOLDS_SUFFIX)


def read_thresholds(path: str | Path) -> dict[str, Any]:
    """Read a thresholds file, checking what the demo uses (it is untrusted input)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read thresholds {path}: {exc}", "rerun python -m robot.thresholds") from exc
    margin = data.get("min_margin") if isinstance(data, dict) else None
    if not isinstance(margin, (int, float)) or not 0.0 <= float(margin) <= 1.0:
        raise UsageError(f"{path} has no min_margin within 0..1", "rerun python -m robot.thresholds")
    return data


def write_thresholds(path: str | Path, data: dict[str, Any]) -> Path:
    """Write atomically (temp file, then rename): a crash never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def describe_background(labels: Sequence[str], background: int | None) -> str | None:
    """The start-up warning for a model that cannot say "nothing there", or None."""
    if background is not None:
        return None
    return (f"warning: this model's {len(labels)} labels have no background class, so it cannot tell "
            "\"nothing there\": plain scenes are rejected only by --min-confidence and the margin "
            "(fit one with python -m robot.thresholds)")
