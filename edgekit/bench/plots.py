"""Plots of a bench report that still tell the truth once shared without the terminal beside them.

- Each variant's label says what ran it and where: ``demo-rpi:fp16`` / ``litert xnnpack 23/23 t4``
  / ``built for rpi, ran on x86_64``: a bundle's target is not the machine that measured it.
- A footer names the machine (CPU, cores usable, governor), the date and the library versions;
  threads above the usable cores are flagged there (they compete, so the number is not what a
  device with that many cores gives).
- One box per repeat, labelled with its sample count; medians drawn in black on every box.
- With ``--camera``, the end-to-end latency (capture wait, preprocessing, inference, decoding) is
  plotted beside the inference latency: the camera, not the model, is often the bottleneck.

matplotlib is imported only when a plot is asked for, and without pyplot: no GUI backend and
no global figure state.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bench.caveats import ACCELERATORS, ran_on_accelerator, threads_over_cores
from edgekit.bench.report import BenchReport, VariantResult, short_runtime

STAGE_TITLES = {"inference": "inference latency", "end_to_end": "end-to-end latency (camera frame -> result)"}


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        from edgekit.errors import BackendUnavailable

        raise BackendUnavailable("--plot needs matplotlib", "pip install 'edgekit-vision[plot]'") from exc
    return Figure


def plot_stages(report: BenchReport) -> list[str]:
    """The stages plotted: inference, plus end-to-end when frames came from a camera."""
    camera = getattr(report.config, "camera", None)
    return ["inference", "end_to_end"] if camera else ["inference"]


def variant_label(v: VariantResult, machine: dict[str, Any]) -> str:
    """``name`` / what ran it / what it was built for and where it ran (three short lines)."""
    where = f"ran on {machine.get('machine') or '?'}"
    if v.target in ACCELERATORS and not ran_on_accelerator(v.runtime):
        where += " without its accelerator"
    built = f"built for {v.target}, " if v.target else ""
    return f"{v.name}\n{short_runtime(v.runtime)}\n{built}{where}"


def footer(report: BenchReport) -> str:
    """Machine, date and versions, and the caveats a reader of the picture needs."""
    m = report.machine
    libs = m.get("libraries") or {}
    versions = ", ".join(f"{k} {v}" for k, v in libs.items() if k != "opencv-python")
    lines = [
        f"machine: {m.get('cpu_model') or '?'} ({m.get('machine') or '?'}), {m.get('cores_usable')}/{m.get('cores')} "
        f"cores usable, governor {m.get('governor') or 'unreadable'}; {m.get('system') or ''}",
        f"measured {report.started[:16].replace('T', ' ')} UTC with {versions}",
        f"{getattr(report.config, 'repeats', '?')} interleaved repeats of >= {getattr(report.config, 'min_count', '?')}"
        f" frames and {getattr(report.config, 'min_duration_s', '?')} s each; warm-up excluded; "
        f"input: {getattr(report.config, 'camera', None) or 'synthetic frames'}",
    ]
    over = threads_over_cores(report)
    if over:
        lines.append("caution: " + "; ".join(over) + ": threads compete for cores, so this is not what a device "
                     "with that many cores would measure")
    return "\n".join(textwrap.fill(line, 150, subsequent_indent="    ") for line in lines)


def write_plots(report: BenchReport, path: str | Path) -> list[Path]:
    """Write the box plot at ``path`` and a latency-over-time plot beside it (``<stem>-timeline.png``)."""
    figure = _figure_class()
    path = Path(path)
    path = path if path.suffix else path.with_name(path.name + ".png")  # what matplotlib would write
    timeline = path.with_name(f"{path.stem}-timeline{path.suffix}")
    _box_figure(figure, report).savefig(path, dpi=120)
    _timeline_figure(figure, report).savefig(timeline, dpi=120)
    return [path, timeline]


def _box_figure(figure: Any, report: BenchReport) -> Any:
    """One row of panels per model (its variants only, on its own scale), one column per stage;
    boxes lie horizontally so a variant's three-line label reads at any number of variants."""
    stages, groups = plot_stages(report), report.groups()
    heights = [0.24 * sum(len(v.runs) for v in vs) + 0.3 * len(vs) + 0.9 for vs in groups.values()]
    fig = figure(figsize=(4.0 + 6.5 * len(stages), sum(heights) + 1.6), layout="constrained")
    axes = fig.subplots(len(groups), len(stages), squeeze=False, gridspec_kw={"height_ratios": heights})
    cuts = []
    for row, (model, variants) in zip(axes, groups.items()):
        for col, (ax, stage) in enumerate(zip(row, stages)):
            cuts.append(_box_axis(ax, report, variants, stage, labels=col == 0))
            ax.set_title(f"{model}: {STAGE_TITLES[stage]}" if len(groups) > 1 else STAGE_TITLES[stage],
                         fontsize="medium", loc="left")
    title = "Latency per variant: one box per repeat (median = black line, n = samples in that repeat)"
    fig.suptitle(title + "".join(sorted({c for c in cuts if c})), fontsize="medium", wrap=True)
    _add_footer(fig, report)
    return fig


def _box_axis(ax: Any, report: BenchReport, variants: list[VariantResult], stage: str, labels: bool) -> str:
    """One panel of horizontal boxes, first variant on top; returns a note on samples beyond the
    shown range ("" if none)."""
    pos, data, cols, centres, counts = [], [], [], [], []
    y = 0
    for v in variants:
        first = y
        for r in v.runs:
            samples = r.samples_ms.get(stage) or []
            pos.append(y)
            data.append(samples or [np.nan])
            counts.append(len(samples))
            cols.append(f"C{report.variants.index(v) % 10}")
            y += 1
        centres.append((first + y - 1) / 2)
        y += 1  # a gap between variants
    box = ax.boxplot(data, positions=pos, widths=0.7, patch_artist=True, flierprops={"markersize": 2},
                     medianprops={"color": "black", "linewidth": 1.6}, **_horizontal(ax))  # fmt: skip
    for patch, c in zip(box["boxes"], cols):
        patch.set_facecolor(c)
        patch.set_alpha(0.45)
    ax.set_yticks(centres, [variant_label(v, report.machine) if labels else "" for v in variants], fontsize="small")
    ax.set_ylim(y - 0.5, -1)  # the first variant on top, as in the table
    ax.set_xlabel(f"{STAGE_TITLES[stage].split(' (')[0]} (ms)")
    log_scale, top = _y_axis(variants, stage)
    if log_scale:
        ax.set_xscale("log")  # variants an order of magnitude apart: keep both readable
    elif top:
        ax.set_xlim(0, top)
    _label_repeats(ax, pos, counts)  # threads over cores: said in the footer, below every panel
    ax.grid(axis="x", alpha=0.3)
    return f"; {_count_above(variants, top, stage)} {stage} samples above {top:.3g} ms not shown" if top else ""


def _horizontal(ax: Any) -> dict[str, Any]:
    """matplotlib 3.10 names it ``orientation`` and deprecates ``vert`` (removed in 3.13)."""
    import inspect

    return ({"orientation": "horizontal"} if "orientation" in inspect.signature(ax.boxplot).parameters
            else {"vert": False})


def _label_repeats(ax: Any, pos: list[int], counts: list[int]) -> None:
    """``#k n=N`` beside each box as minor tick labels; the variant labels sit left of them."""
    labels, repeat = [], 0
    for i, (y, n) in enumerate(zip(pos, counts)):
        repeat = repeat + 1 if i and pos[i - 1] == y - 1 else 1
        labels.append(f"#{repeat} n={n}")
    ax.set_yticks(pos, labels, minor=True)
    ax.tick_params(axis="y", which="minor", labelsize="x-small", labelcolor="0.3")
    ax.yaxis.remove_overlapping_locs = False  # a middle repeat sits at the variant's (major) tick
    ax.tick_params(axis="y", which="major", length=0, pad=62)


def _timeline_figure(figure: Any, report: BenchReport) -> Any:
    fig = figure(figsize=(11, 5.6), layout="constrained")
    ax = fig.add_subplot()
    for i, v in enumerate(report.variants):
        for k, r in enumerate(v.runs):
            label = f"{v.name} ({short_runtime(v.runtime)})" if k == 0 else None
            ax.plot(r.t_s, r.samples_ms["inference"], ".", markersize=2, color=f"C{i % 10}", label=label)
    ax.set_xlabel("time since the benchmark started (s)")
    ax.set_ylabel("inference latency (ms)")
    log_scale, top = _y_axis(report.variants, "inference")
    cut = f"; {_count_above(report.variants, top, 'inference')} samples above {top:.3g} ms not shown" if top else ""
    ax.set_title("Inference latency over time (repeats interleaved across variants)" + cut, fontsize="medium",
                 wrap=True)
    if log_scale:
        ax.set_yscale("log")
    elif top:
        ax.set_ylim(0, top)
    ax.legend(markerscale=5, fontsize="small", loc="upper right")
    ax.grid(alpha=0.3)
    _warn_threads(ax, report)
    _add_footer(fig, report)
    return fig


def _add_footer(fig: Any, report: BenchReport) -> None:
    fig.supxlabel(footer(report), fontsize="x-small", ha="left", x=0.01, color="0.3")


def _warn_threads(ax: Any, report: BenchReport) -> None:
    """The threads-over-cores caveat inside the plot, in red, where the numbers are."""
    over = threads_over_cores(report)
    if over:
        lo, hi = ax.get_ylim()
        if ax.get_yscale() == "linear":
            ax.set_ylim(lo, hi + 0.12 * (hi - lo))  # room for the note above the data
        ax.text(0.01, 0.99, "caution: " + "; ".join(over), transform=ax.transAxes, ha="left", va="top",
                fontsize="small", color="firebrick", wrap=True)


def _y_axis(variants: list[VariantResult], stage: str = "inference") -> tuple[bool, float | None]:
    """(log scale?, upper limit or None) of the latency axis for these variants.

    Rare outliers (a preempted thread, a page fault) must not squash every box to a line:
    the axis stops at twice the highest upper whisker (Q3 + 1.5 IQR) of any box.
    """
    pooled = [v.pooled(stage) for v in variants if v.pooled(stage).count]
    p50s = [s.p50_ms for s in pooled]
    if p50s and min(p50s) > 0 and max(p50s) / min(p50s) > 20:
        return True, None
    whiskers = []
    for v in variants:
        for r in v.runs:
            if r.samples_ms.get(stage):
                q1, q3 = np.percentile(r.samples_ms[stage], [25, 75])
                whiskers.append(q3 + 1.5 * (q3 - q1))
    if not whiskers:
        return False, None
    top = 2 * max(whiskers)
    return False, (top if max(s.max_ms for s in pooled) > top else None)


def _count_above(variants: list[VariantResult], top: float | None, stage: str = "inference") -> int:
    return 0 if top is None else sum(x > top for v in variants for x in v.samples(stage))
