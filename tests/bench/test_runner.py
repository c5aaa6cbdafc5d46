"""``edgekit bench``: SingleStream validity, interleaving, ratios, outputs, accuracy and profiles."""

from __future__ import annotations

import csv
import json

import cv2
import numpy as np
import pytest

from edgekit.bench.accuracy import eval_items, evaluate
from edgekit.bench.runner import BenchConfig, expand_variants, run_bench, synthetic_frames
from edgekit.cli import main as cli
from edgekit.errors import CalibrationError, UsageError
from tests.helpers import tflite_models
from tests.runtime.test_adapters import compiled_for_edgetpu, onnx_model, write_bundle

FAST = BenchConfig(min_duration_s=0.05, min_count=20, repeats=2, warmup=2, frames=4, runtime_options={"num_threads": 1})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    fp32, int8 = tflite_models.model_path("small_float"), tflite_models.model_path("small_int8")
    onnx = onnx_model(d / "light.onnx")
    (d / "light.txt").write_text("dark\nbright\n")
    return {
        "bundle": write_bundle(d / "demo-cpu", {"fp32": fp32, "int8": int8}),
        "onnx": onnx,
        "labels": d / "light.txt",
    }


def test_variant_expansion(models):
    b = str(models["bundle"])
    assert expand_variants([b]) == [(b, None)]
    assert expand_variants([b], "all") == [(b, "fp32"), (b, "int8")]
    assert expand_variants([f"{b}:int8", str(models["onnx"])], "all") == [(b, "int8"), (str(models["onnx"]), None)]
    with pytest.raises(UsageError, match="no variant fp16"):
        expand_variants([b], "fp32,fp16")


def test_single_stream_runs_are_valid_interleaved_and_compared(models):
    report = run_bench([str(models["bundle"]), str(models["onnx"])], FAST, variants="all")
    assert [v.name for v in report.variants] == ["demo-cpu:fp32", "demo-cpu:int8", "light.onnx"]
    assert report.valid
    for v in report.variants:
        assert len(v.runs) == 2 and v.init_ms is not None and v.first_inference_ms > 0
        for r in v.runs:
            assert r.valid and r.duration_s >= FAST.min_duration_s
            assert len(r.samples_ms["inference"]) == r.summary["measured"] >= FAST.min_count
            assert len(r.t_s) == len(r.samples_ms["inference"])
    assert report.ratio(report.variants[0]) == 1.0
    assert report.variants[1].runtime["input"]["dtype"] == "uint8"
    # Interleaved and rotated: repeat 1 runs A B C, repeat 2 runs B C A.
    first = {v.name: [r.t_s[0] for r in v.runs] for v in report.variants}
    assert first["demo-cpu:fp32"][0] < first["demo-cpu:int8"][0] < first["light.onnx"][0]
    assert first["demo-cpu:int8"][1] < first["light.onnx"][1] < first["demo-cpu:fp32"][1]
    assert report.machine["cpu_model"] and "ai-edge-litert" in report.machine["libraries"]
    table = report.table()
    assert "demo-cpu:int8" in table and "1.00x" in table and "litert xnnpack" in table


def test_a_run_that_cannot_reach_both_minimums_is_invalid(models, capsys):
    cfg = BenchConfig(min_duration_s=0.0, min_count=10**9, max_duration_s=0.1, repeats=1, warmup=0, frames=2)
    report = run_bench([str(models["onnx"])], cfg)
    assert not report.valid and any("invalid" in w for w in report.warnings)
    rc = cli(
        [
            "bench",
            str(models["onnx"]),
            "--min-count",
            "1000000000",
            "--max-duration",
            "0.1",
            "--repeats",
            "1",
            "--frames",
            "2",
        ]
    )
    assert rc == 1 and "NO" in capsys.readouterr().out


def test_noise_warning(models):
    cfg = BenchConfig(**{**FAST.__dict__, "max_cv": 0.0})
    report = run_bench([str(models["onnx"])], cfg)
    assert any("noisy, coefficient of variation" in w for w in report.warnings)


def test_cli_writes_json_csv_and_plots(models, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli(
        [
            "bench",
            str(models["bundle"]),
            "--variants",
            "all",
            "--synthetic",
            "--min-duration",
            "0.05",
            "--min-count",
            "20",
            "--repeats",
            "2",
            "--warmup",
            "2",
            "--frames",
            "4",
            "--threads",
            "1",
            "--json-file",
            f"{out}.json",
            "--csv",
            f"{out}.csv",
            "--plot",
            str(out),  # no suffix: matplotlib writes PNG, and the report names the file it wrote
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert f"plots: {out}.png, {out}-timeline.png" in text
    assert text.startswith("machine: ") and "p50 x" in text and "demo-cpu:int8" in text
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["valid"] and data["machine"]["libraries"]["numpy"] == np.__version__
    v = data["variants"][1]
    assert v["name"] == "demo-cpu:int8" and v["runtime"]["delegate_requested"] == "xnnpack"
    assert len(v["runs"][0]["samples_ms"]["inference"]) == v["runs"][0]["summary"]["measured"]
    assert v["inference"]["count"] == sum(r["summary"]["measured"] for r in v["runs"])
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    assert [(r["variant"], r["repeat"]) for r in rows] == [
        ("demo-cpu:fp32", "0"),
        ("demo-cpu:fp32", "1"),
        ("demo-cpu:fp32", "all"),
        ("demo-cpu:int8", "0"),
        ("demo-cpu:int8", "1"),
        ("demo-cpu:int8", "all"),
    ]
    assert float(rows[2]["ratio_p50"]) == 1.0
    for png in ("out.png", "out-timeline.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert cv2.imread(str(tmp_path / png)).shape[1] >= 600


def _quick(bundle) -> list[str]:
    return ["bench", str(bundle), "--min-duration", "0.05", "--min-count", "10", "--repeats", "1", "--warmup", "1",
            "--frames", "2"]


def test_json_is_a_stdout_switch(models, capsys):
    # --json means "JSON on stdout" as in run/build/inspect/doctor/targets; the table moves to stderr.
    rc = cli(["bench", "--json", *_quick(models["bundle"])[1:]])  # before the model: not taken as a file name
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    data = json.loads(captured.out)
    assert data["variants"][0]["name"] == "demo-cpu:fp32" and "samples_ms" not in data["variants"][0]["runs"][0]
    assert "p50 x" in captured.err


def test_old_json_file_spelling_still_works_with_a_note(models, tmp_path, capsys):
    rc = cli([*_quick(models["bundle"]), "--json", str(tmp_path / "r.json")])
    captured = capsys.readouterr()
    assert rc == 0
    assert "--json FILE is deprecated; use --json-file" in captured.err
    assert json.loads((tmp_path / "r.json").read_text())["variants"][0]["runs"][0]["samples_ms"]["inference"]


def test_plot_without_matplotlib_fails_before_measuring(models, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed (import raises ImportError)
    rc = cli([*_quick(models["bundle"]), "--plot", str(tmp_path / "p.png")])
    captured = capsys.readouterr()
    assert rc != 0 and "--plot needs matplotlib" in captured.err
    assert "repeat 1/1" not in captured.err  # nothing was measured first


def test_camera_input_is_captured_once_and_replayed(models, tmp_path, capsys):
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i}.png"), synthetic_frames(1, (160, 90), seed=i)[0])
    rc = cli(
        [
            "bench",
            str(models["onnx"]),
            "--camera",
            f"folder:{tmp_path}",
            "--min-duration",
            "0.02",
            "--min-count",
            "5",
            "--repeats",
            "1",
        ]
    )
    assert rc == 0 and "light.onnx" in capsys.readouterr().out
    rc = cli(["bench", str(models["onnx"]), "--camera", f"folder:{tmp_path / 'none'}"])
    assert rc == 2 and "no such folder" in capsys.readouterr().err


def test_profile_onnx_measured_and_litert_static(models, capsys):
    rc = cli(
        [
            "bench",
            str(models["onnx"]),
            f"{models['bundle']}:int8",
            "--profile",
            "--min-duration",
            "0.02",
            "--min-count",
            "10",
            "--repeats",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "light.onnx: per-op profile (measured)" in out and "Reshape" in out
    assert "demo-cpu:int8: per-op profile (static)" in out and "CONV_2D" in out


def _image_folder(root, classes: dict[str, list[int]]):
    for name, values in classes.items():
        (root / name).mkdir(parents=True)
        for i, v in enumerate(values):
            cv2.imwrite(str(root / name / f"{i}.png"), np.full((40, 40, 3), v, np.uint8))
    return root


def test_eval_accuracy_and_agreement(models, tmp_path, capsys):
    data = _image_folder(tmp_path / "eval", {"Dark": [0, 20, 200], "BRIGHT": [255, 230]})
    (data / "Dark" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnope")
    results = evaluate(
        [str(models["onnx"]), str(models["onnx"])],
        data,
        labels=str(models["labels"]),
        runtime_options={"num_threads": 1},
    )
    r = results[0]
    assert (r.images, r.unreadable) == (5, 1)
    assert r.accuracy == pytest.approx(4 / 5) and r.per_class == {"dark": pytest.approx(2 / 3), "bright": 1.0}
    assert results[1].agreement == 1.0
    rc = cli(["bench", str(models["onnx"]), "--labels", str(models["labels"]), "--eval", str(data)])
    out = capsys.readouterr().out
    assert rc == 0 and "80.0%" in out and "1 unreadable image(s) skipped" in out


def test_eval_folder_problems(models, tmp_path, capsys):
    with pytest.raises(CalibrationError, match="does not exist"):
        eval_items(tmp_path / "nope", ["a"])
    (tmp_path / "flat").mkdir()
    with pytest.raises(CalibrationError, match="no class subfolders"):
        eval_items(tmp_path / "flat", ["a"])
    data = _image_folder(tmp_path / "eval", {"a": [1], "zebra": [2]})
    with pytest.raises(CalibrationError, match="zebra"):
        eval_items(data, ["a", "b"])
    items, _ = eval_items(_image_folder(tmp_path / "idx", {"0": [1], "1": [2]}), [])
    assert [c for _, c in items] == [0, 1]  # numeric folders stand for class indices without labels
    rc = cli(["bench", str(models["bundle"]), "--eval", str(data)])
    assert rc == 2 and "match no label" in capsys.readouterr().err


def test_skip_unavailable_leaves_out_what_cannot_run_here(models, tmp_path, capsys):
    compiled = compiled_for_edgetpu(tflite_models.model_path("small_int8"), tmp_path / "m_edgetpu.tflite")
    tpu = write_bundle(
        tmp_path / "demo-edgetpu",
        {"int8": compiled},
        target="edgetpu",
        runtime={"adapter": "edgekit.runtime.litert:LiteRTRuntime", "options": {"delegate": "none"}},
    )
    argv = ["bench", str(models["onnx"]), str(tpu), "--min-duration", "0.02", "--min-count", "5", "--repeats", "1"]
    assert cli(argv) == 2
    assert "compiled for the Edge TPU" in capsys.readouterr().err
    assert cli([*argv, "--skip-unavailable"]) == 0
    cap = capsys.readouterr()
    assert "light.onnx" in cap.out and "demo-edgetpu" not in cap.out
    assert "warning: skipped demo-edgetpu: model_int8.tflite is compiled for the Edge TPU" in cap.err


def test_camera_options_reach_the_bench_camera(models, monkeypatch):
    from edgekit import camera
    from edgekit.camera import Frame

    seen = {}

    class TwoFrames:
        def __iter__(self):
            return iter([Frame(f, 0, i) for i, f in enumerate(synthetic_frames(2, (160, 90)))])

        def close(self):
            pass

    def open_camera(uri, **options):
        seen.update(uri=uri, options=options)
        return TwoFrames()

    monkeypatch.setattr(camera, "open_camera", open_camera)
    argv = ["bench", str(models["onnx"]), "--camera", "v4l2:1", "-O", "fps=30", "--frames", "2"]
    assert cli([*argv, "--min-duration", "0.02", "--min-count", "5", "--repeats", "1"]) == 0
    assert seen == {"uri": "v4l2:1", "options": {"fps": "30"}}
    with pytest.raises(SystemExit):
        cli(["bench", str(models["onnx"]), "--camera", "v4l2:1", "-O", "=30"])


def test_a_flag_applies_to_the_variants_that_take_it_and_says_where_it_did_not(models):
    # --delegate is a LiteRT option: in a TFLite-vs-ONNX comparison it reaches the TFLite variant,
    # and the report says it was not applied to the ONNX one.
    cfg = BenchConfig(min_duration_s=0.01, min_count=3, repeats=1, warmup=1,
                      runtime_options={"delegate": "none"})
    report = run_bench([f"{models['bundle']}:int8", str(models["onnx"])], cfg)
    assert [v.name for v in report.variants] == ["demo-cpu:int8", "light.onnx"]
    assert report.variants[0].runtime["delegate_requested"] == "none"
    assert "delegate not applied to light.onnx: its runtime does not take it" in report.warnings


def test_a_flag_no_variant_takes_is_an_error(models):
    cfg = BenchConfig(min_duration_s=0.01, min_count=3, repeats=1, warmup=1, runtime_options={"delegate": "none"})
    with pytest.raises(UsageError, match="delegate"):
        run_bench([str(models["onnx"])], cfg)
