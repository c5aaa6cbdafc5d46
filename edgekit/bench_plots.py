"""Plots of a bench report: a box per variant and repeat, and latency over time.

matplotlib is imported only when a plot is asked for, and without pyplot: no GUI backend and
no global figure state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.bench_report import BenchReport


def write_plots(report: BenchReport, path: str | Path) -> list[Path]:
    """Write a box-and-whisker PNG (variants x repeats) at ``path`` and a latency-over-time PNG
    beside it (``<stem>-timeline.png``). Returns both paths."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        from edgekit.errors import BackendUnavailable

        raise BackendUnavailable("--plot needs matplotlib", "pip install 'edgekit[plot]'") from exc
    path = Path(path)
    timeline = path.with_name(f"{path.stem}-timeline{path.suffix or '.png'}")
    colours = [f"C{i % 10}" for i in range(len(report.variants))]

    boxes = sum(len(v.runs) for v in report.variants)
    fig = Figure(figsize=(min(14.0, max(6.0, 0.8 * boxes)), 4.5), layout="constrained")
    ax = fig.add_subplot()
    pos, data, cols, centres = [], [], [], []
    x = 0
    for v, c in zip(report.variants, colours):
        first = x
        for r in v.runs:
            pos.append(x)
            data.append(r.samples_ms["inference"] or [np.nan])
            cols.append(c)
            x += 1
        centres.append((first + x - 1) / 2)
        x += 1  # a gap between variants
    box = ax.boxplot(data, positions=pos, widths=0.7, patch_artist=True, flierprops={"markersize": 2})
    for patch, c in zip(box["boxes"], cols):
        patch.set_facecolor(c)
        patch.set_alpha(0.5)
    ax.set_xticks(centres, [v.name for v in report.variants], rotation=15, ha="right")
    ax.set_ylabel("inference latency (ms)")
    ax.set_title("Inference latency per variant, one box per repeat")
    log_scale, top = _y_axis(report)
    cut = f" ({_count_above(report, top)} samples above {top:.3g} ms not shown)" if top and not log_scale else ""
    if log_scale:
        ax.set_yscale("log")  # variants an order of magnitude apart: keep both readable
    elif top:
        ax.set_ylim(0, top)
    ax.set_title("Inference latency per variant, one box per repeat" + cut, fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=120)

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for v, c in zip(report.variants, colours):
        for k, r in enumerate(v.runs):
            ax.plot(r.t_s, r.samples_ms["inference"], ".", markersize=2, color=c, label=v.name if k == 0 else None)
    ax.set_xlabel("time since the benchmark started (s)")
    ax.set_ylabel("inference latency (ms)")
    ax.set_title("Latency over time (runs interleaved across variants)" + cut, fontsize="medium")
    if log_scale:
        ax.set_yscale("log")
    elif top:
        ax.set_ylim(0, top)
    ax.legend(markerscale=5, fontsize="small")
    ax.grid(alpha=0.3)
    fig.savefig(timeline, dpi=120)
    return [path, timeline]


def _y_axis(report: BenchReport) -> tuple[bool, float | None]:
    """(log scale?, upper limit or None).

    Rare outliers (a preempted thread, a page fault) must not squash every box to a line:
    the axis stops at twice the highest upper whisker (Q3 + 1.5 IQR) of any box.
    """
    pooled = [v.pooled() for v in report.variants if v.pooled().count]
    p50s = [s.p50_ms for s in pooled]
    if p50s and min(p50s) > 0 and max(p50s) / min(p50s) > 20:
        return True, None
    whiskers = []
    for v in report.variants:
        for r in v.runs:
            if r.samples_ms["inference"]:
                q1, q3 = np.percentile(r.samples_ms["inference"], [25, 75])
                whiskers.append(q3 + 1.5 * (q3 - q1))
    if not whiskers:
        return False, None
    top = 2 * max(whiskers)
    return False, (top if max(s.max_ms for s in pooled) > top else None)


def _count_above(report: BenchReport, top: float) -> int:
    return sum(x > top for v in report.variants for x in v.samples())
