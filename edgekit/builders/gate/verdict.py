"""What a gate decided about one variant on one data set, as a type: passed, the figures that failed, why.

Every gate (a classifier's top-1 ratio and agreement, a detector's mAP and fidelity, a landmark
model's pixels, a segmenter's mask IoU, a raw model's cosine) ends in a :class:`Verdict`. The
manifest keeps it as two keys of the data set's result, ``passed`` and ``gate_failures`` (flag ->
one line naming the figure, its value and its limit); :meth:`Verdict.of` reads them back, so every
reader of a result (publish, recovery, the calibration check, the speed pass, the tables) asks the
type, never the dict, whether a variant passed and why not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PASSED, FAILURES = "passed", "gate_failures"  # the manifest's keys: written and read here only


@dataclass(frozen=True)
class Verdict:
    """A gate's decision: ``passed`` (None: no gate judged this data set, its figures only reported)
    and ``failures``, flag -> one line per figure that missed its limit (empty when passed, or for a
    gate of one figure whose line the caller words itself)."""

    passed: bool | None
    failures: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def judged(cls, failures: Mapping[str, str], also: bool = True) -> Verdict:
        """Passed when no figure failed and ``also`` (a figure judged without a line, e.g. the ratio)."""
        return cls(bool(also) and not failures, dict(failures))

    @classmethod
    def of(cls, result: Mapping[str, Any] | None) -> Verdict:
        """The verdict recorded in a data set's result (manifest or in memory); ``passed`` None when none."""
        if not isinstance(result, Mapping):
            return cls(None)
        failures = dict(result.get(FAILURES) or {})
        if PASSED not in result:  # figures that failed, recorded without the flag: a refusal all the same
            return cls(False, failures) if failures else cls(None)
        return cls(bool(result[PASSED]), failures)

    @property
    def failed(self) -> bool:
        """A gate judged and refused it (not merely unjudged)."""
        return self.passed is False

    @property
    def reason(self) -> str:
        """Every failed figure's line, in the gate's order ("" when none was worded)."""
        return "; ".join(line for line in self.failures.values() if line)

    def fields(self) -> dict[str, Any]:
        """The keys it takes in a data set's result (nothing when no gate judged)."""
        if self.passed is None:
            return {}
        return {PASSED: self.passed, **({FAILURES: dict(self.failures)} if self.failures else {})}

    def merged(self, other: Verdict) -> Verdict:
        """Both gates' verdict on one result: failed when either failed, their lines together."""
        if self.passed is None:
            return other
        if other.passed is None:
            return self
        return Verdict(self.passed and other.passed, {**self.failures, **other.failures})


def failed(verification: Mapping[str, Any]) -> bool:
    """Whether a gate refused the variant on any data set of its verification."""
    return any(Verdict.of(res).failed for res in verification.values())


def judged_result(verification: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The result a gate judged: the eval set's, else the held-back images' (a gated one only)."""
    for dataset in ("eval", "holdout"):
        res = verification.get(dataset)
        if Verdict.of(res).passed is not None:
            return res
    return None
