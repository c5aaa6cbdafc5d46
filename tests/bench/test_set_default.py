"""``edgekit bench BUNDLE --set-default`` (edgekit/bench/set_default.py): the fastest passing variant as
measured on this machine becomes the bundle's default, written into edgekit.json whole or not at all;
every file keeps its sha256; a signed bundle is told it must be re-signed. Injected timings: no clock."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from edgekit.bench.report import BenchReport, RunResult, VariantResult
from edgekit.bench.set_default import SIGNATURE_FILE, check_request, set_default
from edgekit.bundle import BundleWriter, load_bundle
from edgekit.errors import UsageError

MACHINE = {"cpu_model": "Test CPU", "machine": "x86_64", "system": "Linux 6", "cores": 2, "cores_usable": 2,
           "governor": "powersave", "load_average": [2.1, 1.8, 1.5], "libraries": {"ai-edge-litert": "2.3.0"},
           "warnings": []}


def _entry(name: str, dtype: str) -> dict:
    return {"name": name, "file": f"m_{name}.tflite", "format": "tflite", "precision": name,
            "input": {"shape": [1, 4, 4, 1], "layout": "NHWC", "dtype": dtype,
                      **({"scale": 1 / 255, "zero_point": 0} if dtype == "uint8" else {})},
            "outputs": [{"name": "scores", "shape": [1, 3], "dtype": dtype}]}


def _result(ratio: float, agreement: float) -> dict:
    return {"eval": {"original": 0.9, "converted": round(0.9 * ratio, 4), "ratio": ratio, "agreement": agreement,
                     "cosine": 0.99, "passed": True, "openset": {"min_margin": round(ratio - 0.9, 3)}}}


def _bundle(dest: Path) -> Path:
    models = [_entry("fp32", "float32"), _entry("int8", "uint8")]
    manifest = {"name": "m", "target": "cpu", "default_model": "fp32", "models": models,
                "input": models[0]["input"], "outputs": models[0]["outputs"], "labels": None, "task": "classify",
                "verification": {"dataset": {"eval_images": 10, "heldback_images": 2}, "gated": True, "passed": True,
                                 "models": {"fp32": _result(1.0, 1.0), "int8": _result(1.016, 0.965)},
                                 "ratio": 1.0, "agreement": 1.0, "converted": 0.9, "original": 0.9},
                "openset": {"background_class": "none", "can_tell_nothing_there": True, "min_margin": 0.1,
                            "models": {"fp32": {"min_margin": 0.1}, "int8": {"min_margin": 0.116}}}}
    with BundleWriter(dest) as w:
        for m in models:
            (w.dir / m["file"]).write_bytes(m["name"].encode() * 100)
        w.commit(manifest)
    return dest


def _report(bundle: Path, per_repeat: dict[str, list[float]]) -> BenchReport:
    """A bench report whose variants ran with the given inference times, each repeat one list."""
    variants = []
    for name, repeats in per_repeat.items():
        runs = [RunResult(i, True, 2.0, {"fps": 100.0}, {"inference": [t] * 50}, []) for i, t in enumerate(repeats)]
        variants.append(VariantResult(f"m-cpu:{name}", str(bundle), name, name, "cpu", {}, runs=runs))
    return BenchReport(type("Config", (), {"runtime_options": {"threads": 2}})(), MACHINE, variants, "2026-12-02")


def test_the_fastest_passing_variant_becomes_the_default_and_every_hash_still_holds(tmp_path):
    bundle = _bundle(tmp_path / "m-cpu")
    done = set_default(_report(bundle, {"fp32": [0.439, 0.44, 0.6], "int8": [0.346, 0.5, 0.35]}), bundle)
    assert (done.previous, done.choice.variant, done.written, done.signed) == ("fp32", "int8", True, False)
    loaded = load_bundle(bundle)  # hashes checked
    m = loaded.manifest
    assert m["default_model"] == "int8" and loaded.input_spec.dtype == "uint8" and m["outputs"][0]["dtype"] == "uint8"
    assert (m["verification"]["ratio"], m["verification"]["agreement"]) == (1.016, 0.965)  # the default's figures
    assert m["openset"]["min_margin"] == 0.116 and m["openset"]["models"]["fp32"] == {"min_margin": 0.1}
    choice = m["default_choice"]
    assert (choice["variant"], choice["previous"], choice["repeats"]) == ("int8", "fp32", {"fp32": 3, "int8": 3})
    # per repeat 0.439 / 0.346, 0.44 / 0.5 (int8's repeat loaded), 0.6 / 0.35 (fp32's): the median is the first
    assert choice["ratio"] == pytest.approx(0.439 / 0.346, abs=1e-4) and choice["round_ratios"][1] < 1
    assert choice["measured_on"]["cpu_model"] == "Test CPU" and choice["measured_on"]["load_average"] == [2.1, 1.8, 1.5]
    assert choice["runtime_options"] == {"threads": 2} and set(choice["p50_ms"]) == {"fp32", "int8"}
    assert list(m) == [*[k for k in m if k != "default_choice"], "default_choice"]  # keys kept in their order
    assert done.lines() == [f"default: fp32 -> int8 ({done.choice.reason}); wrote {bundle / 'edgekit.json'}"]
    assert not list(tmp_path.glob("m-cpu/.edgekit.json.*"))  # no temporary file left


def test_a_variant_under_the_margin_leaves_the_manifest_untouched(tmp_path):
    bundle = _bundle(tmp_path / "m-cpu")
    before = (bundle / "edgekit.json").read_bytes()
    done = set_default(_report(bundle, {"fp32": [0.4, 0.41, 0.4], "int8": [0.39, 0.385, 0.392]}), bundle)
    assert (done.choice.variant, done.written) == ("fp32", False)
    assert (bundle / "edgekit.json").read_bytes() == before
    line = done.lines()[0]
    assert line.startswith("default: fp32 kept (int8 1.03x faster than fp32") and line.endswith("unchanged")


def test_a_signed_bundle_is_told_to_be_signed_again(tmp_path):
    bundle = _bundle(tmp_path / "m-cpu")
    (bundle / SIGNATURE_FILE).write_text("{}")  # not in the file list: a signature signs edgekit.json
    done = set_default(_report(bundle, {"fp32": [1.0, 1.0, 1.0], "int8": [0.5, 0.5, 0.5]}), bundle)
    assert done.signed and done.written
    assert done.lines()[1] == (f"warning: {bundle / SIGNATURE_FILE} signs the old edgekit.json: re-sign the bundle "
                               f"(edgekit sign {bundle} --key KEY) before a device that checks signatures takes it")


def test_what_cannot_be_decided_is_refused(tmp_path):
    bundle = _bundle(tmp_path / "m-cpu")
    with pytest.raises(UsageError, match="the bundle's default fp32 was not measured"):
        set_default(_report(bundle, {"int8": [0.5]}), bundle)
    for models, eval_dir, words in (([str(bundle), str(bundle)], None, "rewrites one bundle; 2 models"),
                                    ([f"{bundle}:int8"], None, "is not a bundle folder"),
                                    ([str(bundle)], "eval/", "decides by speed")):
        with pytest.raises(UsageError, match=words):
            check_request(models, eval_dir)


def test_the_cli_measures_every_variant_and_writes_the_default(tmp_path, monkeypatch):
    import edgekit.bench.runner as runner
    from edgekit.cli import main

    bundle = _bundle(tmp_path / "m-cpu")
    asked = {}

    def run_bench(models, config, variants, progress):
        asked.update(models=models, variants=variants)
        return _report(bundle, {"fp32": [0.439, 0.44, 0.45], "int8": [0.346, 0.35, 0.34]})

    monkeypatch.setattr(runner, "run_bench", run_bench)
    monkeypatch.setattr("edgekit.commands.bench._print_report", lambda report, args: None)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["bench", str(bundle), "--set-default"])
    assert code == 0 and asked == {"models": [str(bundle)], "variants": "all"}, err.getvalue()
    assert out.getvalue().startswith("default: fp32 -> int8 (int8 1.2")
    assert json.loads((bundle / "edgekit.json").read_text())["default_model"] == "int8"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        refused = main(["bench", str(bundle), str(bundle), "--set-default"])
    assert refused == 2 and "--set-default rewrites one bundle" in err.getvalue()
