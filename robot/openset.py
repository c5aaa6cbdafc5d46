"""Open-set rejection and announce-once for the sign demo (device side: numpy only).

A frame counts toward an announcement only when (a) its top class is not the background
class, (b) its score clears ``min_confidence`` and (c) its margin over the runner-up clears
``min_margin`` and, for a model that emits logits, its energy ``-logsumexp(z)`` is at most
``max_energy``. The build fits the margin on its eval set when the model has a background
class and stores it in the bundle's manifest (``openset``, :mod:`edgekit.heads.openset`, which also
holds the math); ``python -m robot.thresholds`` fits it after the build on any held-out images
(items and plain scenes) and writes it beside the bundle, so a model without a background
class still has a second signal. The :class:`Debouncer` then needs ``agree``
such frames in a row and says a label once per appearance.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.heads.openset import fit_margin, margins

__all__ = ["Debouncer", "Gate", "build_thresholds", "describe_background", "fit_margin", "gate_thresholds",
           "margins", "read_thresholds", "thresholds_path", "write_thresholds"]

CAMERA_FRAME_S = 1 / 15  # a real Vector's frame interval: the clock when update() is given no time
THRESHOLDS_SUFFIX = ".signs.json"  # written beside the bundle: dist/demo-cpu -> dist/demo-cpu.signs.json


@dataclass(frozen=True)
class Gate:
    """Whether one frame's prediction may count toward an announcement (see the module doc)."""

    min_confidence: float = 0.8
    min_margin: float = 0.0
    background: int | None = None
    max_energy: float | None = None

    def accepts(self, index: int, score: float, margin: float = 1.0, energy: float | None = None) -> bool:
        """True when class ``index`` at ``score``, ``margin`` above the runner-up (and with the
        logits' ``energy``, None for a softmax output: not checked), may count."""
        known = self.max_energy is None or energy is None or energy <= self.max_energy
        return index != self.background and score >= self.min_confidence and margin >= self.min_margin and known


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
    max_energy: float | None = None
    _candidate: int | None = None
    _streak: int = 0
    _announced: int | None = None
    _away_since: float | None = None
    _t: float = 0.0

    @property
    def gate(self) -> Gate:
        return Gate(self.min_confidence, self.min_margin, self.background, self.max_energy)

    def update(self, index: int, score: float, margin: float = 1.0, t_s: float | None = None,
               energy: float | None = None) -> int | None:
        """Feed one frame's top class (and its margin over the runner-up, the capture time in
        seconds, default one camera frame after the previous call, and the logits' energy);
        returns the class index to announce, or None."""
        self._t = self._t + CAMERA_FRAME_S if t_s is None else t_s
        if self._away_since is not None and self._t - self._away_since >= self.rearm_s - 1e-9:
            self._announced, self._away_since = None, None  # gone long enough: the next one is new
        if index == self._announced:
            self._away_since = None  # still there
        elif self._announced is not None and self._away_since is None:
            self._away_since = self._t
        vote = index if self.gate.accepts(index, score, margin, energy) else None
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

    The loader has range-checked the entry (:func:`edgekit.heads.openset.check_manifest`).
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


def gate_thresholds(bundle: str | None, thresholds: str | None, min_margin: float | None,
                    max_energy: float | None) -> tuple[float, float | None, str]:
    """The gate's second signal: ``(min margin, max energy or None, where they came from)``.

    The margin: ``min_margin`` when given, else the ``thresholds`` file, else the one the
    build fitted (the manifest's ``openset``), else the one fitted after it (beside the
    bundle), else 0. The energy: ``max_energy`` when given, else the build's (logit models only).
    """
    margin, note = _min_margin(bundle, thresholds, min_margin)
    if max_energy is not None:
        if not math.isfinite(max_energy):
            raise UsageError("--max-energy must be a finite number")
        return margin, max_energy, note
    built = build_thresholds(bundle) if bundle else None
    energy = built.get("max_energy") if built else None
    return margin, (float(energy) if isinstance(energy, (int, float)) else None), note


def _min_margin(bundle: str | None, thresholds: str | None, min_margin: float | None) -> tuple[float, str]:
    path = Path(thresholds) if thresholds else (thresholds_path(bundle) if bundle else None)
    if min_margin is not None:
        if not 0.0 <= min_margin <= 1.0:
            raise UsageError("--min-margin must be within 0..1")
        return min_margin, ""
    built = build_thresholds(bundle) if bundle and not thresholds else None
    if built is not None:
        rate = built.get("false_announcement_rate")
        return float(built["min_margin"]), (f" (fitted at build on {built['images']['background']} background "
                                            f"images, score >= {built['min_score']:g}: false announcements "
                                            f"{'n/a' if rate is None else f'{rate:.1%}'})")
    if path is None or (not thresholds and not path.is_file()):
        return 0.0, " (no fitted thresholds: python -m robot.thresholds)"
    data = read_thresholds(path)
    return float(data["min_margin"]), f" (fitted: {path})"
