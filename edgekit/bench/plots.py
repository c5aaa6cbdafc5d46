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


PALETTE = "tab20"  # 20 distinct colours: the default cycle has 10, and a bench of 14 variants reused them
HATCHES = ("", "//", "..", "xx")  # past 20 variants a box is told apart by its hatch as well
MARKERS = (".", "x", "+", "^")  # ... and a timeline point by its marker
LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1}  # readable over points
LOG_RATIO = 8  # medians further apart than this share a panel on a log scale
EDGE = 0.985  # where a sample beyond the axis is drawn: just inside the panel's edge


def variant_style(index: int) -> tuple[Any, str, str]:
    """``(colour, hatch, marker)`` of the ``index``-th variant of a report, the same in both figures."""
    from matplotlib import colormaps

    colours = colormaps[PALETTE].colors
    # tab20 pairs a dark and a light shade: the darks first, so 10 variants get 10 different hues
    order = list(range(0, 20, 2)) + list(range(1, 20, 2))
    turn = index // len(order)
    return colours[order[index % len(order)]], HATCHES[turn % len(HATCHES)], MARKERS[turn % len(MARKERS)]


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
    """One panel of horizontal boxes, first variant on top, on a scale of its own variants; returns
    a note when samples lie beyond it ("" if none): they are drawn at the edge, not lost."""
    pos, data, styles, centres, counts = [], [], [], [], []
    y = 0
    for v in variants:
        first, style = y, variant_style(report.variants.index(v))
        for r in v.runs:
            samples = r.samples_ms.get(stage) or []
            pos.append(y)
            data.append(samples or [np.nan])
            counts.append(len(samples))
            styles.append(style)
            y += 1
        centres.append((first + y - 1) / 2)
        y += 1  # a gap between variants
    box = ax.boxplot(data, positions=pos, widths=0.7, patch_artist=True, flierprops={"markersize": 2},
                     medianprops={"color": "black", "linewidth": 1.6}, **_horizontal(ax))  # fmt: skip
    for patch, (colour, hatch, _) in zip(box["boxes"], styles):
        patch.set_facecolor(colour)
        patch.set_alpha(0.6)
        patch.set_hatch(hatch)
    ax.set_yticks(centres, [variant_label(v, report.machine) if labels else "" for v in variants], fontsize="small")
    ax.set_ylim(y - 0.5, -1)  # the first variant on top, as in the table
    ax.set_xlabel(f"{STAGE_TITLES[stage].split(' (')[0]} (ms)")
    log_scale, top = panel_scale(variants, stage)
    if log_scale:
        ax.set_xscale("log")  # variants an order of magnitude apart: keep both readable
    if top:
        ax.set_xlim(_low_end(variants, stage) if log_scale else 0, top)
        _mark_beyond(ax, pos, data, top, vertical=False)
    _label_repeats(ax, pos, counts)  # threads over cores: said in the footer, below every panel
    ax.grid(axis="x", alpha=0.3)
    return f"; {_count_above(variants, top, stage)} {stage} samples beyond an axis are drawn at its edge" if top \
        else ""


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
    """Latency over time, one panel per model on a scale of its own variants (a slow model's
    outliers must not flatten a fast one), the legend right of the data."""
    groups = report.groups()
    fig = figure(figsize=(13, 2.9 * len(groups) + 1.6), layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False, sharex=True)[:, 0]
    cut = 0
    for ax, (model, variants) in zip(axes, groups.items()):
        for v in variants:
            colour, _, marker = variant_style(report.variants.index(v))
            for k, r in enumerate(v.runs):
                label = f"{v.name} ({short_runtime(v.runtime)})" if k == 0 else None
                ax.plot(r.t_s, r.samples_ms["inference"], marker, markersize=2, color=colour, label=label,
                        linestyle="none")
        log_scale, top = panel_scale(variants, "inference")
        if log_scale:
            ax.set_yscale("log")
        if top:
            ax.set_ylim(_low_end(variants, "inference") if log_scale else 0, top)
            cut += _mark_beyond_in_time(ax, report, variants, top)
        ax.set_ylabel("inference (ms)")
        ax.set_title(model if len(groups) > 1 else "", fontsize="medium", loc="left")
        ax.legend(markerscale=5, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time since the benchmark started (s)")
    note = f"; {cut} samples beyond an axis are drawn at its edge" if cut else ""
    fig.suptitle("Inference latency over time (repeats interleaved across variants)" + note, fontsize="medium",
                 wrap=True)
    _warn_threads(axes[0], report)
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


def panel_scale(variants: list[VariantResult], stage: str = "inference") -> tuple[bool, float | None]:
    """(log scale?, upper limit or None) of one panel's latency axis, from its own variants only.

    Outliers (a preempted thread, ONNX Runtime's slow calls) must not squash every box to a
    sliver: the axis stops at 1.5 x the longest whisker (the largest sample within Q3 + 1.5 IQR)
    of the panel's boxes, and what lies beyond is drawn at the edge with its value. Not the 99th
    percentile: on a busy 2-core host 5 % of a 0.2 ms model's calls took 4 ms, and an axis to
    their p99 (7 ms) made every box a sliver again. Medians more than 8x apart get a log scale,
    so a 0.7 ms int8 box and a 8 ms ONNX Runtime box both stay readable.
    """
    pooled = [v.pooled(stage) for v in variants if v.pooled(stage).count]
    p50s = [s.p50_ms for s in pooled]
    log_scale = bool(p50s) and min(p50s) > 0 and max(p50s) / min(p50s) > LOG_RATIO
    whiskers = []
    for v in variants:
        for r in v.runs:
            samples = np.asarray(r.samples_ms.get(stage) or [])
            if samples.size:
                q1, q3 = np.percentile(samples, [25, 75])
                whiskers.append(samples[samples <= q3 + 1.5 * (q3 - q1)].max())
    if not whiskers:
        return log_scale, None
    top = 1.5 * float(max(whiskers))
    return log_scale, (top if max(s.max_ms for s in pooled) > top else None)


def _low_end(variants: list[VariantResult], stage: str) -> float:
    """The lower limit of a log axis: a little under the fastest sample (zero has no place there)."""
    return 0.8 * min((x for v in variants for x in v.samples(stage) if x > 0), default=1e-3)


def _mark_beyond(ax: Any, pos: list[int], data: list[list[float]], top: float, vertical: bool) -> None:
    """A box's samples beyond ``top``: one marker at the panel's edge, with how many and the largest."""
    for y, samples in zip(pos, data):
        beyond = [x for x in samples if x > top]
        if not beyond:
            continue
        where = ax.get_xaxis_transform() if vertical else ax.get_yaxis_transform()  # edge in axes units
        xy = (y, EDGE) if vertical else (EDGE, y)
        ax.plot(*xy, "^" if vertical else ">", color="firebrick", markersize=5, transform=where, clip_on=False)
        ax.annotate(f"{len(beyond)} > {top:.3g}, max {max(beyond):.3g} ms", xy, xycoords=where,
                    xytext=(-6, 0), textcoords="offset points", ha="right", va="center", fontsize="xx-small",
                    color="firebrick", bbox=LABEL_BOX)


def _mark_beyond_in_time(ax: Any, report: BenchReport, variants: list[VariantResult], top: float) -> int:
    """Timeline samples beyond ``top`` drawn at the top edge in their variant's colour, the largest
    labelled with its value; returns how many."""
    where, count, worst = ax.get_xaxis_transform(), 0, None
    for v in variants:
        colour, _, _ = variant_style(report.variants.index(v))
        for r in v.runs:
            above = [(t, x) for t, x in zip(r.t_s, r.samples_ms["inference"]) if x > top]
            if above:
                count += len(above)
                ax.plot([t for t, _ in above], [EDGE] * len(above), "^", color=colour, markersize=4,
                        transform=where, clip_on=False)
                worst = max([worst, *above], key=lambda p: -1 if p is None else p[1])
    if worst is not None:
        ax.annotate(f"max {worst[1]:.3g} ms", (worst[0], EDGE), xycoords=where, xytext=(4, -2),
                    textcoords="offset points", va="top", fontsize="x-small", color="firebrick",
                    bbox=LABEL_BOX)
    return count


def _count_above(variants: list[VariantResult], top: float | None, stage: str = "inference") -> int:
    return 0 if top is None else sum(x > top for v in variants for x in v.samples(stage))
