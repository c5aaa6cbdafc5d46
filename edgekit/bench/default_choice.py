"""Which variant a bundle opens by default, decided from interleaved timing rounds that a busy machine disturbs.

The build (edgekit/builders/gate/speed.py) and ``edgekit bench --set-default`` time every passing variant in
rounds, each round running each variant in turn. On a loaded machine a round's median moves with
whatever else ran during that variant's slot: PaddleOCR's classifier, built on a loaded 2-core host,
kept fp32 as its default while ``edgekit bench`` measured int8 1.27x faster, because the build moved
the default only when every round's median agreed past 1.15x (issue 37). The margin a candidate must
clear (:data:`DEFAULT_MARGIN`) now sits below what the bundle promises (:data:`PROMISE`), so that the
noise between the build's timing and a later bench cannot leave the default past the promise.

Two things make the decision hold there. Within a round, a variant's cost is the **fastest** of its
runs (the floor): load only ever adds time, so a run that went unhindered is the one that measured
the model, and with tens of runs per slot one of them usually did. Across rounds, the ratio of the
configured default's floor to the candidate's is taken per round (both ran within a fraction of a
second of each other) and the **median** of those ratios decides: a burst that lands on one variant's
slots for a whole round moves one ratio, not the median. When the rounds disagree (some past the margin,
some not) more rounds are run, up to :data:`MAX_ROUNDS` (the build: three times its timing budget).
numpy only: the device side uses it as the build does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

PROMISE = 1.15
"""What a bundle promises: its default is never more than this much slower than the fastest variant
that passed, as ``edgekit bench --variants all`` measures it later (issue 37)."""
DEFAULT_MARGIN = 1.05
"""A passing variant faster than the configured default past this ratio becomes the default. It sits
under :data:`PROMISE` by the noise between two measurements on a shared host: on a 2-core machine
running other work, the build measured PaddleOCR's classifier's int8 1.11x faster than fp32 (so a
1.15x switch kept fp32) while five ``bench --variants all`` runs put fp32 1.00x-1.65x behind. A
configured default that is more than 5 % slower gives way; one within 5 % keeps its accuracy."""
MAX_ROUNDS = 9
"""The most rounds a decision may take: three times the three a build runs when they agree."""
STATISTIC = "median over rounds of the ratio of each round's fastest run"
"""What the recorded ratio is, in words (the manifest and the log say it)."""


def floor(samples: Sequence[float]) -> float:
    """A round's cost of one variant: its fastest run (ms); load only adds time."""
    return float(np.min(np.asarray(samples, np.float64))) if len(samples) else float("nan")


@dataclass(frozen=True)
class Verdict:
    """The configured default against one candidate: per round, the default's floor over the
    candidate's (above 1: the candidate is faster), and the margin the decision needs."""

    configured: str
    candidate: str
    ratios: tuple[float, ...]
    margin: float = DEFAULT_MARGIN

    @property
    def ratio(self) -> float:
        """The robust statistic: the median over rounds of the per-round floor ratio."""
        return float(np.median(self.ratios)) if self.ratios else float("nan")

    @property
    def faster(self) -> bool:
        """The candidate is faster than the configured default past the margin."""
        return self.ratio > self.margin

    @property
    def rounds_past(self) -> int:
        """Rounds whose own ratio is past the margin."""
        return sum(r > self.margin for r in self.ratios)

    @property
    def split(self) -> bool:
        """Rounds on both sides of the margin: more rounds would tell."""
        return 0 < self.rounds_past < len(self.ratios)

    def text(self) -> str:
        """``int8 1.27x faster than fp32 (median of 5 rounds' fastest runs; 4 of 5 past 1.05x)``."""
        word = "faster than" if self.ratio > 1 else "as fast as" if self.ratio == 1 else "slower than"
        shown = self.ratio if self.ratio >= 1 else 1 / self.ratio
        return (f"{self.candidate} {shown:.2f}x {word} {self.configured} (median of {len(self.ratios)} rounds' "
                f"fastest runs; {self.rounds_past} of {len(self.ratios)} past {self.margin:g}x)")

    def to_dict(self) -> dict:
        return {"configured": self.configured, "candidate": self.candidate, "ratio": round(self.ratio, 4),
                "round_ratios": [round(r, 4) for r in self.ratios], "margin": self.margin,
                "rounds_past_margin": self.rounds_past, "statistic": STATISTIC}


def verdict(configured: str, candidate: str, rounds: Mapping[str, Sequence[Sequence[float]]],
            margin: float = DEFAULT_MARGIN) -> Verdict:
    """The :class:`Verdict` of ``candidate`` against ``configured`` from ``rounds`` (variant -> per round
    its run times in ms), over the rounds both ran."""
    pairs = zip(rounds[configured], rounds[candidate])
    ratios = tuple(floor(a) / floor(b) for a, b in pairs if len(a) and len(b) and floor(b) > 0)
    return Verdict(configured, candidate, ratios, margin)


def fastest(variants: Sequence[str], rounds: Mapping[str, Sequence[Sequence[float]]]) -> str:
    """The variant with the lowest median over rounds of its floor (the first of equals)."""
    return min(variants, key=lambda v: float(np.median([floor(r) for r in rounds[v] if len(r)] or [np.inf])))


@dataclass(frozen=True)
class Choice:
    """The default decided: the variant, and the verdict behind it (None when nothing was compared)."""

    variant: str
    verdict: Verdict | None = None
    reason: str = ""


def choose(configured: str, passing: Sequence[str], rounds: Mapping[str, Sequence[Sequence[float]]],
           margin: float = DEFAULT_MARGIN) -> Choice:
    """The configured default, unless the fastest passing variant is faster past ``margin`` by the
    median per-round floor ratio (or the configured one did not pass: then the fastest that did)."""
    timed = [v for v in passing if rounds.get(v)]
    if not timed:
        return Choice(configured, None, "no passing variant was timed")
    best = fastest(timed, rounds)
    if configured not in timed:
        return Choice(best, None, f"{configured} did not pass or was not timed: the fastest that passed")
    if best == configured:
        # by the rule's own statistic, which can differ from a p50 the same log prints beside it
        return Choice(configured, None, f"{configured} is the fastest that passed by each round's fastest run")
    found = verdict(configured, best, rounds, margin)
    return Choice(best if found.faster else configured, found, found.text())


def undecided(configured: str, passing: Sequence[str], rounds: Mapping[str, Sequence[Sequence[float]]],
              margin: float = DEFAULT_MARGIN) -> bool:
    """Whether the rounds so far disagree about the decision (:attr:`Verdict.split`), so that more
    rounds are worth running (the caller bounds them: :data:`MAX_ROUNDS`)."""
    found = choose(configured, passing, rounds, margin).verdict
    return found is not None and found.split
