"""``edgekit bench`` read by a person: ratios within each model, one warning line per kind of
caveat, a warning when an accelerator's bundle ran without it, progress with an ETA, and one plot
panel per model (edgekit/bench/report.py, bench_warnings.py, bench_plots.py)."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.bench.caveats import noise_warnings, ran_on_accelerator
from edgekit.bench.report import BenchReport, RunResult, VariantResult
from edgekit.bench.runner import BenchConfig, run_bench
from tests.helpers import tflite_models
from tests.runtime.test_adapters import write_bundle

XNNPACK = {"backend": "ai_edge_litert", "delegate_requested": "xnnpack", "delegate_applied": True,
           "delegated_nodes": 9, "total_nodes": 9, "num_threads": 2}
ORT_CPU = {"backend": "onnxruntime", "providers_used": ["CPUExecutionProvider"], "num_threads": 2}


def _variant(name, model, p50, runtime=XNNPACK, target="cpu", spread=0.02, repeats=3):
    rng = np.random.default_rng(len(name))
    runs = []
    for k in range(repeats):
        samples = list(p50 * (1 + spread * rng.standard_normal(200)))
        stages = {"inference": samples, "end_to_end": samples, "preprocess": samples}
        runs.append(RunResult(k, True, 1.0, {"fps": 30.0}, stages, list(np.arange(200) * 0.01)))
    return VariantResult(name, "x", name.split(":")[-1], None, target, dict(runtime), runs=runs, model=model)


def _report(variants, **config):
    cfg = BenchConfig(**{"repeats": 3, "max_cv": 0.25, **config})
    machine = {"machine": "x86_64", "cpu_model": "test", "cores": 2, "cores_usable": 2, "libraries": {}}
    report = BenchReport(cfg, machine, variants, "2026-11-27T00:00:00")
    report.warnings = noise_warnings(report)
    return report


def test_ratios_are_taken_within_each_model_never_across_models():
    report = _report([_variant("demo-cpu:fp32", "demo.keras", 0.4), _variant("demo-cpu:int8", "demo.keras", 0.2),
                      _variant("detector-cpu:fp32", "detector.keras", 4.0),
                      _variant("detector-jetson:fp16", "detector.keras", 8.0, ORT_CPU, "jetson")])
    ratios = {v.name: round(report.ratio(v), 1) for v in report.variants}
    assert ratios == {"demo-cpu:fp32": 1.0, "demo-cpu:int8": 0.5, "detector-cpu:fp32": 1.0,
                      "detector-jetson:fp16": 2.0}
    table = report.table()
    assert "model demo.keras:" in table and "model detector.keras:" in table
    assert [v["ratio_to"] for v in report.to_dict(samples=False)["variants"]] == [
        "demo-cpu:fp32", "demo-cpu:fp32", "detector-cpu:fp32", "detector-cpu:fp32"]


def test_each_kind_of_caveat_is_one_line_naming_every_variant_it_concerns():
    many = [_variant(f"m-rpi:v{i}", "m", 1.0, {**XNNPACK, "num_threads": 4}, "rpi", spread=0.5) for i in range(6)]
    warnings = _report(many).warnings
    threads = [w for w in warnings if "threads" in w]
    noisy = [w for w in warnings if w.startswith("noisy")]
    assert len(threads) == 1 and len(noisy) == 1 and len(warnings) <= 3
    assert all(f"m-rpi:v{i} (4)" in threads[0] for i in range(6))
    assert threads[0].startswith("more threads than the 2 usable cores")
    assert all(f"m-rpi:v{i} " in noisy[0] for i in range(6))


@pytest.mark.parametrize(("runtime", "target", "accelerated"), [
    ({"delegate_requested": "edgetpu", "delegate_applied": True}, "edgetpu", True),
    ({"delegate_requested": "edgetpu", "delegate_applied": False}, "edgetpu", False),
    (XNNPACK, "edgetpu", False),
    ({"backend": "tensorrt"}, "jetson", True),
    ({"backend": "onnxruntime", "providers_used": ["CUDAExecutionProvider", "CPUExecutionProvider"]}, "jetson", True),
    (ORT_CPU, "jetson", False),
])
def test_a_bundle_built_for_an_accelerator_that_ran_without_it_is_named(runtime, target, accelerated):
    assert ran_on_accelerator(runtime) is accelerated
    warnings = _report([_variant(f"d-{target}:int8", "d", 1.0, runtime, target)]).warnings
    named = [w for w in warnings if w.startswith("built for an accelerator, ran without it")]
    assert bool(named) is not accelerated
    if named:
        assert f"d-{target}:int8 (built for {target}" in named[0] and "not the device's" in named[0]


def test_a_cpu_bundle_is_never_called_off_its_accelerator():
    assert not [w for w in _report([_variant("d-cpu:fp32", "d", 1.0)]).warnings if "accelerator" in w]


def test_progress_counts_runs_and_gives_an_eta(tmp_path):
    bundle = write_bundle(tmp_path / "demo-cpu", {"fp32": tflite_models.model_path("small_float"),
                                                  "int8": tflite_models.model_path("small_int8")})
    lines = []
    cfg = BenchConfig(min_duration_s=0.02, min_count=5, repeats=2, warmup=1, frames=2,
                      runtime_options={"num_threads": 1})
    report = run_bench([str(bundle)], cfg, "all", lines.append)
    runs = [line for line in lines if "repeat" in line]
    assert [line.split("]")[0] for line in runs][:3] == ["[1/4 ETA " + runs[0].split("ETA ")[1].split("]")[0],
                                                          "[2/4 ETA " + runs[1].split("ETA ")[1].split("]")[0],
                                                          "[3/4 ETA " + runs[2].split("ETA ")[1].split("]")[0]]
    assert runs[-1].startswith("[4/4 done]")
    assert {v.model for v in report.variants} == {"demo-cpu"}  # no provenance recorded: the bundle's name


def test_the_plot_has_one_row_of_panels_per_model(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from edgekit.bench.plots import _box_figure

    report = _report([_variant("a-cpu:fp32", "a", 0.4), _variant("a-cpu:int8", "a", 0.2),
                      _variant("b-cpu:fp32", "b", 40.0)], camera="file:clip.avi")
    fig = _box_figure(Figure, report)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == ["a: inference latency", "a: end-to-end latency (camera frame -> result)",
                      "b: inference latency", "b: end-to-end latency (camera frame -> result)"]
    a_panel, b_panel = fig.axes[0], fig.axes[2]
    assert a_panel.get_xlim()[1] < 5 < 40 < b_panel.get_xlim()[1]  # each model on its own scale
    labels = [t.get_text() for t in a_panel.get_yticklabels()]
    assert labels[0].startswith("a-cpu:fp32\n") and labels[1].startswith("a-cpu:int8\n")


def test_the_bundles_default_variant_is_marked(tmp_path):
    bundle = write_bundle(tmp_path / "demo-cpu", {"fp32": tflite_models.model_path("small_float"),
                                                  "int8": tflite_models.model_path("small_int8")},
                          default_model="int8")
    cfg = BenchConfig(min_duration_s=0.01, min_count=3, repeats=1, warmup=1, frames=2,
                      runtime_options={"num_threads": 1})
    report = run_bench([str(bundle)], cfg, "all")
    assert [(v.name, v.default) for v in report.variants] == [("demo-cpu:fp32", False), ("demo-cpu:int8", True)]
    rows = report.table().splitlines()
    assert rows[3].startswith("demo-cpu:int8 *") and rows[2].startswith("demo-cpu:fp32 ")
    assert "* = the bundle's default variant" in rows[-1]
    assert [v["default"] for v in report.to_dict(samples=False)["variants"]] == [False, True]


def test_quiet_bench_prints_no_warnings_but_the_json_keeps_them(tmp_path, capsys):
    import json

    from edgekit.cli import main

    bundle = write_bundle(tmp_path / "demo-cpu", {"fp32": tflite_models.model_path("small_float")})
    argv = ["bench", str(bundle), "--synthetic", "--min-duration", "0", "--min-count", "3", "--repeats", "1",
            "--frames", "2", "--max-cv", "0", "--threads", "1"]
    assert main([*argv, "-q", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "warning:" not in err and any("noisy" in w for w in json.loads(out)["warnings"])
    assert main(argv) == 0
    assert "warning: noisy" in capsys.readouterr().err


def test_outliers_do_not_widen_a_panel_they_are_drawn_at_its_edge_with_their_value():
    """Issue 39 item 7: a few slow calls must not make every box a sliver; each panel's axis comes
    from its own variants, the samples beyond it are marked at the edge with how many and the largest."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from edgekit.bench.plots import _box_figure, _timeline_figure

    slow = _variant("d-jetson:fp32", "d", 1.0, ORT_CPU, "jetson")
    slow.runs[0].samples_ms["inference"][:3] = [60.0, 55.0, 58.0]  # ONNX Runtime's odd slow calls
    report = _report([_variant("d-cpu:fp32", "d", 1.0), slow, _variant("e-cpu:fp32", "e", 40.0)])
    d_panel, e_panel = _box_figure(Figure, report).axes[:2]
    assert d_panel.get_xlim()[1] < 2  # the 60 ms calls did not set the axis
    notes = [t.get_text() for t in d_panel.texts]
    assert any(n.startswith("3 > ") and n.endswith("max 60 ms") for n in notes)
    assert e_panel.get_xlim()[1] > 40 and not e_panel.texts  # the other model's panel is its own
    timeline = _timeline_figure(Figure, report).axes[0]
    assert timeline.get_ylim()[1] < 2 and any("max 60 ms" in t.get_text() for t in timeline.texts)


def test_fourteen_variants_get_fourteen_colours_and_the_legend_sits_outside_the_data():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from edgekit.bench.plots import _timeline_figure, variant_style

    assert len({variant_style(i)[0] for i in range(20)}) == 20
    assert len({variant_style(i) for i in range(24)}) == 24  # past 20: a hatch and a marker tell them apart
    report = _report([_variant(f"m-cpu:v{i}", "m", 1.0 + i / 10) for i in range(14)])
    fig = _timeline_figure(Figure, report)
    ax = fig.axes[0]
    colours = {line.get_color() for line in ax.get_lines() if line.get_label().startswith("m-cpu")}
    assert len(colours) == 14
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # the layout places the legend at draw time
    renderer = canvas.get_renderer()
    legend, data = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= data.x1  # right of the axes, covering nothing


def _bundle_variants(default_ms: float, other_ms: float, path: str = "dist/m-cpu") -> list[VariantResult]:
    fp32 = _variant("m-cpu:fp32", "m", default_ms, spread=0.0)
    int8 = _variant("m-cpu:int8", "m", other_ms, spread=0.0)
    for v in (fp32, int8):
        v.path = path
    fp32.default = True
    return [fp32, int8]


@pytest.mark.parametrize(("default_ms", "warned"), [(1.3, True), (1.1501, True), (1.15, False), (1.1, False),
                                                    (0.9, False)])
def test_a_default_past_the_builds_promise_is_named_with_the_command_that_re_decides(default_ms, warned):
    """The build promises a default within 1.15x of its fastest passing variant (edgekit/bench/default_choice.py);
    bench --variants all says when this machine measures otherwise, by the same rule, and never when it does not."""
    warnings = [w for w in _report(_bundle_variants(default_ms, 1.0)).warnings if w.startswith("default more")]
    assert len(warnings) == warned
    if warned:
        assert "dist/m-cpu: default fp32, but int8 " in warnings[0] and "faster than fp32" in warnings[0]
        assert "edgekit bench BUNDLE --set-default" in warnings[0]
    two = _bundle_variants(1.3, 1.0, "a") + _bundle_variants(1.0, 1.0, "b")  # two bundles: each judged alone
    assert [w.count(": default") for w in _report(two).warnings if w.startswith("default more")] == [1]
