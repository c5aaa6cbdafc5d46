"""Recovery's table for the build log and its attempts' one-line verdicts (builders/int8/recovery.py
makes the rows)."""

from __future__ import annotations

from typing import Any

from edgekit.builders.gate.figures import Figure


def table_lines(target: str, rows: list[dict[str, Any]]) -> list[str]:
    """The recovery table for the build log: one line per attempt (what changed, the figure attempts
    are compared by, each figure an attempt missed with its limit, p50 here, ops predicted on the
    TPU, kept). A figure some attempt missed gets a column of its own, named in the header."""
    width = max(len(r["label"]) for r in rows)
    judged_name = rows[0]["figure_name"]
    names = list(dict.fromkeys(m["figure"] for r in rows for m in r.get("missed") or [] if m["figure"] != judged_name))
    cells = [[_cell(r, judged_name, r["figure"]), *(_cell(r, n, (r.get("figures") or {}).get(n)) for n in names)]
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate([judged_name, *names])]
    head = "  ".join(h.rjust(w) for h, w in zip([judged_name, *names], widths))
    lines = [f"[{target}] int8 recovery: {'attempt'.ljust(width)}  {head}  p50 ms  TPU ops  kept"]
    for r, row_cells in zip(rows, cells):
        p50 = f"{r['p50_ms']:.3g}" if r.get("p50_ms") is not None else "-"
        figures = "  ".join(c.rjust(w) for c, w in zip(row_cells, widths))
        lines.append(f"[{target}] int8 recovery: {r['label'].ljust(width)}  {figures}  {p50:>6}  "
                     f"{r.get('tpu_ops') or '-':>7}  {'yes' if r.get('kept') else ''}")
    return lines


def _cell(row: dict[str, Any], name: str, value: float | None) -> str:
    """One figure of one row: its value, and the limit when the row missed it (``0.94 < 0.97``)."""
    miss = next((m for m in row.get("missed") or [] if m["figure"] == name), None)
    if miss is not None:
        return Figure.from_dict(miss).value_text()
    return f"{value:.6g}" if isinstance(value, (int, float)) else "-"


def missed_text(row: dict[str, Any]) -> str:
    """``missed (top-1 agreement 0.94 < 0.97)``: what an attempt's log line says it failed on."""
    misses = [Figure.from_dict(m).text() for m in row.get("missed") or []]
    return f"missed ({'; '.join(misses)})" if misses else "missed"
