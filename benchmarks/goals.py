"""The goals a benchmark prints, checked: ``make bench`` must not exit 0 over a missed goal.

Each script keeps printing its figures as before; :class:`Goals` marks each checked figure
``ok``/``MISSED`` in the line and the script returns :meth:`Goals.exit_code`: 1 when any goal
was missed, with one line on stderr naming them, so a CI job or ``make bench`` fails on it.
"""

from __future__ import annotations

import operator
import sys

_OPS = {"<=": operator.le, ">=": operator.ge}


class Goals:
    """Goals checked so far in one benchmark run."""

    def __init__(self, script: str):
        self.script = script
        self.missed: list[str] = []

    def check(self, what: str, value: float, op: str, bound: float) -> str:
        """Check ``value op bound``; returns the mark to print beside the figure."""
        if _OPS[op](value, bound):
            return "ok"
        self.missed.append(f"{what} {value:.3g} (goal {op} {bound:g})")
        return "MISSED"

    def exit_code(self) -> int:
        """0 when every goal was met, else 1 after naming the missed ones on stderr."""
        if not self.missed:
            return 0
        print(f"{self.script}: {len(self.missed)} goal(s) missed: " + "; ".join(self.missed), file=sys.stderr)
        return 1
