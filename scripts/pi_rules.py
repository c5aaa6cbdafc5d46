"""``make pi-check``'s comparison rules and its one table: pure functions, no I/O (tests/scripts/test_pi_rules.py).

The rules (issue 26): a classifier's top-1 is the same on at least 99.5 % of the images; a quantised
output's bytes differ by at most 1 LSB; a float output by at most 1e-4 of the tensor's largest
magnitude (relative to the tensor, since an element near zero has no useful relative error);
a detector's boxes lie within 1 px of each other with the same labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP1_MIN = 0.995
MAX_LSB = 1
MAX_REL = 1e-4
MAX_BOX_PX = 1.0
OK, FAIL, INFO = "ok", "FAIL", "info"


@dataclass(frozen=True)
class Row:
    """One line of the table: which install, what was checked, ok/FAIL/info, and the figures."""

    install: str
    check: str
    status: str
    detail: str


def raw_difference(a: np.ndarray, b: np.ndarray) -> tuple[bool, float, str]:
    """(within the rule, the figure, its unit) for one output tensor on both machines.

    Integer tensors (int8/uint8 quantised outputs) are compared in LSB; float ones relative to the
    largest magnitude of the reference tensor. A shape or dtype that differs is a failure.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, float("inf"), f"shape/dtype {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    if np.issubdtype(a.dtype, np.integer):
        lsb = float(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0))
        return lsb <= MAX_LSB, lsb, "LSB"
    x, y = a.astype(np.float64), b.astype(np.float64)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        same = bool(np.array_equal(x, y, equal_nan=True))
        return same, 0.0 if same else float("inf"), "rel"
    scale = max(float(np.abs(x).max(initial=0.0)), 1e-12)
    rel = float(np.abs(x - y).max(initial=0.0)) / scale
    return rel <= MAX_REL, rel, "rel"


def top1_agreement(ref: list[dict], got: list[dict]) -> float:
    """Share of frames whose best class is the same (classification results as ``to_dict`` gives them)."""
    if not ref or len(ref) != len(got):
        return 0.0
    same = sum(r["top"][0]["index"] == g["top"][0]["index"] for r, g in zip(ref, got))
    return same / len(ref)


def _ordered(detections: list[dict]) -> list[dict]:
    # best-first order may swap two equal scores: compare in an order that does not depend on score ties
    return sorted(detections, key=lambda d: (d["index"], [round(v) for v in d["box"]]))


def detection_difference(ref: dict, got: dict) -> tuple[bool, float]:
    """(same labels and every box within 1 px, the largest box-corner difference in px) for one frame."""
    a, b = _ordered(ref["detections"]), _ordered(got["detections"])
    if len(a) != len(b) or any(x["index"] != y["index"] for x, y in zip(a, b)):
        return False, float("inf")
    px = max((abs(u - v) for x, y in zip(a, b) for u, v in zip(x["box"], y["box"])), default=0.0)
    return px <= MAX_BOX_PX, float(px)


def compare_outputs(ref: dict[str, np.ndarray], got: dict[str, np.ndarray], prefix: str) -> tuple[bool, str]:
    """Every raw output of one bundle (keys starting with ``prefix``): (all within the rules, the worst figure)."""
    keys = sorted(k for k in ref if k.startswith(prefix))
    if not keys or any(k not in got for k in keys):
        return False, f"{sum(k in got for k in keys)}/{len(keys)} outputs came back"
    worst: dict[str, float] = {}
    ok = True
    for key in keys:
        within, figure, unit = raw_difference(ref[key], got[key])
        ok = ok and within
        worst[unit] = max(worst.get(unit, 0.0), figure)
    return ok, ", ".join(f"max {_figure(v, u)}" for u, v in sorted(worst.items()))


def _figure(value: float, unit: str) -> str:
    if unit == "LSB":
        return f"{value:g} LSB"
    return f"rel {value:.1e}" if unit == "rel" else f"{unit}"


def compare_bundle(task: str, ref: dict, got: dict, raw: tuple[bool, str]) -> tuple[str, str]:
    """(status, detail) of one bundle variant: the raw outputs' rule, then the task's rule on the decoded results."""
    raw_ok, raw_text = raw
    if got.get("error") and got["error"].startswith("open"):
        return FAIL, got["error"]
    n = len(ref.get("results", []))
    if got.get("error"):  # decoding could not run on this install: the raw outputs still tell
        return FAIL, f"{raw_text}; {got['error']}"
    if task == "classify":
        share = top1_agreement(ref["results"], got["results"])
        ok = raw_ok and share >= TOP1_MIN
        return (OK if ok else FAIL), f"top-1 same {share:.1%} of {n}; {raw_text}"
    pairs = [detection_difference(r, g) for r, g in zip(ref["results"], got["results"])]
    same = sum(ok for ok, _ in pairs) if len(pairs) == n else 0
    px = max((p for _, p in pairs), default=0.0)
    boxes = sum(len(r["detections"]) for r in ref["results"])
    ok = raw_ok and n > 0 and same == n
    return (OK if ok else FAIL), f"{same}/{n} frames same labels, boxes max {px:.2f} px ({boxes} boxes); {raw_text}"


def format_table(rows: list[Row]) -> str:
    """The one table ``make pi-check`` prints: fixed-width columns, the detail last and unpadded."""
    head = Row("install", "check", "result", "detail")
    widths = [max(len(getattr(r, f)) for r in [head, *rows]) for f in ("install", "check", "status")]
    lines = []
    for r in [head, *rows]:
        cells = [r.install.ljust(widths[0]), r.check.ljust(widths[1]), r.status.ljust(widths[2]), r.detail]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(lines)


def failed(rows: list[Row]) -> list[Row]:
    """The rows that make the check fail (exit non-zero)."""
    return [r for r in rows if r.status == FAIL]


def human_size(n_bytes: int) -> str:
    """``123456789`` -> ``'117.7 MiB'``."""
    return f"{n_bytes / 2**20:.1f} MiB"
