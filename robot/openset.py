"""Open-set rejection and announce-once for the sign demo (device side: numpy only).

A frame counts toward an announcement only when (a) its top class is not the background
class, (b) its score clears ``min_confidence`` and (c) its margin over the runner-up clears
``min_margin``. The build fits the margin on its eval set when the model has a background
class and stores it in the bundle's manifest (``openset``, :mod:`edgekit.openset`, which also
holds the math); ``python -m robot.thresholds`` fits it after the build on any held-out images
(items and plain scenes) and writes it beside the bundle, so a model without a background
class still has a second signal. The :class:`Debouncer` then needs ``agree``
such frames in a row and says a label once per appearance.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.openset import fit_margin, margins

__all__ = ["Debouncer", "Gate", "build_thresholds", "describe_background", "fit_margin", "margins",
           "read_thresholds", "thresholds_path", "write_thresholds"]

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


def build_thresholds(spec: str | Path) -> dict[str, Any] | None:
    """The open-set thresholds the build fitted for the bundle ``spec`` (``BUNDLE[:VARIANT]``):
    that model's entry of the manifest's ``openset``, or None when the build fitted none.

    The loader has range-checked the entry (:func:`edgekit.openset.check_manifest`).
    """
    from edgekit.bundle import load_bundle
    from edgekit.model import split_model_spec

    path, variant = split_model_spec(spec)
    if not (path / "edgekit.json").is_file():
        return None  # a bare model file: no manifest
    manifest = load_bundle(path, check_hashes=False, allow_rejected=True).manifest
    openset = manifest.get("openset") or {}
    entry = (openset.get("models") or {}).get(variant or manifest.get("default_model"), openset)
    return entry if isinstance(entry.get("min_margin"), (int, float)) else None
