"""A variant that misses the gate does not throw away those that passed; the last line and the hints fit the gate.

The real builds calibrate the demo model's int8 on black images only (its top-1 collapses to ~10 %
while fp32/fp16 keep the original's), and make an FP16 rejection with a two-output model whose
second output is the difference of two weights 0.1 apart at 1000: float16 stores both as 1000.0,
so that output is 0 (cosine 0.0) while fp32 reproduces it.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from edgekit.builders.contract import TargetBuild
from edgekit.builders.outcome import gate_fix, outcome
from edgekit.bundle import load_bundle
from edgekit.cli import main
from edgekit.commands.build import format_table
from edgekit.errors import ModelError
from tests.conftest import CALIB, DEMO_MODEL, EVAL


def _cli(*argv) -> tuple[int, str, str]:
    """``edgekit build ARGV``: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["build", *map(str, argv)])
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


def _error_line(err: str) -> str:
    [line] = [ln for ln in err.splitlines() if ln.startswith("edgekit build: error:")]
    return line


def _fix_line(err: str) -> str:
    [line] = [ln for ln in err.splitlines() if ln.startswith("  fix: ")]
    return line


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "edgekit.json").read_text())


@pytest.fixture(scope="module")
def black(tmp_path_factory) -> Path:
    """Four black frames: int8 calibrated on them alone loses the demo model's classes."""
    import cv2

    folder = tmp_path_factory.mktemp("black")
    for i in range(4):
        cv2.imwrite(str(folder / f"{i}.png"), np.zeros((32, 32), np.uint8))
    return folder


# --- the final line and the fix, from results (no TensorFlow) ------------------------------------------


def _result(target, bundle, passed, rejected=(), task="classify", gated=True):
    return TargetBuild(target, Path(bundle) if bundle else None, passed, 1.0,
                       {"task": task, "verification": {"gated": gated}}, "why" if rejected else None, rejected)


def test_the_outcome_names_each_target_as_written_written_without_rejected_or_failed():
    results = [_result("cpu", "d/x-cpu", False, ("int8",)), _result("edgetpu", None, False, ("int8",)),
               _result("rpi", "d/x-rpi", True)]
    failure = {"jetson": ModelError("no")}
    assert outcome(results, failure) == "(written: cpu without int8, rpi; rejected: edgetpu; failed: jetson)"
    assert outcome(results, {}) == "(written: cpu without int8, rpi; rejected: edgetpu; exit 3 unless --allow-partial)"
    assert outcome(results, {}, allow_partial=True) == "(written: cpu without int8, rpi; rejected: edgetpu)"
    assert outcome([_result("cpu", None, False, ("fp32",))], {}) == "(written: none; rejected: cpu)"


def test_a_cosine_gate_names_min_cosine_and_an_fp16_rejection_does_not_mention_calibration():
    fix = gate_fix([_result("cpu", "d/x-cpu", False, ("fp16",), task="raw")])
    assert "lower --min-cosine" in fix and "--min-accuracy-ratio" not in fix and "--min-map-ratio" not in fix
    assert "calibrat" not in fix and "--allow-partial to accept cpu" in fix
    assert "--allow-partial" not in gate_fix([_result("cpu", "d/x-cpu", False, ("fp16",), task="raw")], True)


def test_an_int8_rejection_says_calibrate_and_names_its_gates_flag():
    fix = gate_fix([_result("cpu", None, False, ("int8",)), _result("edgetpu", None, False, ("int8", "int8_edgetpu"),
                                                                    task="classify")])
    assert fix.startswith("no bundle was written for cpu, edgetpu; calibrate int8 with more representative images")
    assert "or lower --min-accuracy-ratio;" in fix and "--variants" not in fix
    fix = gate_fix([_result("cpu", None, False, ("int8",), task="detect")])
    assert "lower --min-map-ratio" in fix and "calibrate int8" in fix
    # without --eval only a broken conversion fails: no threshold to lower
    fix = gate_fix([_result("cpu", None, False, ("int8",), gated=False)])
    assert "lower" not in fix and "build other --variants" in fix


def test_a_raw_table_shows_each_models_worst_output_and_cosine():
    def measured(cosine, passed):
        return {"holdout": {"cosine": cosine, "worst_output": "boxes", "passed": passed,
                            "outputs": {"boxes": {"cosine": cosine, "mean_abs_diff": round(1 - cosine, 6)}}}}

    lost = {"file": "m_int8.tflite", "kept_in": "m-cpu.rejected", "bytes": 1024, "verification": measured(0.91, False)}
    manifest = {"task": "raw", "models": [{"name": "fp32", "file": "m_fp32.tflite", "format": "tflite", "bytes": 2048}],
                "verification": {"models": {"fp32": measured(0.999912, True)}, "rejected": {"int8": lost}}}
    why = "int8 output boxes cosine 0.91 < 0.98"
    table = format_table([TargetBuild("cpu", Path("d/m-cpu"), False, 2.0, manifest, why, ("int8",))]).splitlines()
    assert table[0].split() == ["target", "model", "file", "size", "worst", "output", "cosine", "MAE", "gate",
                                "delegated", "build", "s"]
    assert table[2].split() == ["cpu", "m_fp32.tflite", "2", "KiB", "boxes", "0.999912", "8.8e-05", "PASS", "-", "2.0"]
    assert table[3].split() == ["cpu", "m-cpu.rejected/m_int8.tflite", "1", "KiB", "boxes", "0.910000", "0.09", "FAIL",
                                "-", "2.0"]
    assert table[4] == f"cpu: d/m-cpu without int8 ({why})"


# --- real builds ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, black):
    """cpu (int8 misses), edgetpu (int8 only: misses), rpi (passes) and jetson (its conversion fails) in one
    build: (exit code, stdout, stderr, dist)."""
    import edgekit.builders.onnx as onnx_builder

    def no_onnx(*args, **kwargs):
        raise ModelError("tf2onnx cannot convert this model", "build the TFLite targets")

    dist = tmp_path_factory.mktemp("mixed") / "dist"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_builder, "to_onnx", no_onnx)
        code, out, err = _cli("--model", DEMO_MODEL, "--target", "cpu,edgetpu,rpi,jetson", "--calib", black,
                              "--eval", EVAL, "--out", dist, "--min-accuracy-ratio", "0.5")
    return code, out, err, dist


@pytest.mark.slow  # cpu fp32/fp16/int8, edgetpu int8 (+ its quantisation report), rpi fp32/fp16: ~30 s on 2 cores
def test_the_last_line_lists_exactly_what_was_written_rejected_and_failed(mixed):
    code, out, err, dist = mixed
    line = _error_line(err)
    assert code == 2 and line.startswith("edgekit build: error: jetson: tf2onnx cannot convert this model")
    assert line.endswith("(written: cpu without int8, rpi; rejected: edgetpu; failed: jetson)")
    assert sorted(p.name for p in dist.iterdir()) == ["demo-cpu", "demo-cpu.rejected", "demo-edgetpu.rejected",
                                                     "demo-rpi"]


@pytest.mark.slow
def test_a_partial_bundle_holds_the_variants_that_passed_and_names_the_one_that_did_not(mixed):
    dist = mixed[3]
    bundle = load_bundle(dist / "demo-cpu")  # no --allow-rejected needed: every model in it passed
    # the default is the fastest passing variant as the build timed them (fp16 won on a quiet clean-clone run)
    assert [m.name for m in bundle.models] == ["fp32", "fp16"] and bundle.manifest["default_model"] in ("fp32", "fp16")
    assert sorted(bundle.manifest["files"]) == ["build.log", "demo_fp16.tflite", "demo_fp32.tflite", "labels.txt"]
    v = bundle.manifest["verification"]
    assert v["passed"] is True and v["reason"] is None and list(v["models"]) == ["fp32", "fp16"]
    lost = v["rejected"]["int8"]
    assert lost["kept_in"] == "demo-cpu.rejected" and lost["file"] == "demo_int8.tflite"
    assert lost["reason"].startswith("int8 top-1 0.") and "ratio 0." in lost["reason"]
    assert "< 0.5 (--min-accuracy-ratio)" in lost["reason"]  # the figure and the flag that governs it
    assert lost["verification"]["eval"]["passed"] is False and lost["verification"]["eval"]["converted"] < 0.5
    assert set(bundle.manifest["delegation"]) == {"fp32", "fp16"}


@pytest.mark.slow
def test_the_rejected_variant_is_kept_as_evidence_with_every_variants_numbers(mixed):
    dist = mixed[3]
    evidence = load_bundle(dist / "demo-cpu.rejected", allow_rejected=True)  # every sha256 checked
    assert [m.name for m in evidence.models] == ["int8"] and evidence.manifest["default_model"] == "int8"
    assert sorted(evidence.manifest["files"]) == ["build.log", "demo_int8.tflite", "labels.txt"]
    v = evidence.manifest["verification"]
    assert v["passed"] is False and v["reason"].startswith("int8 top-1 ") and "(--min-accuracy-ratio)" in v["reason"]
    assert [v["models"][n]["eval"]["passed"] for n in ("fp32", "fp16", "int8")] == [True, True, False]
    assert v["published"] == {"bundle": "demo-cpu", "models": ["fp32", "fp16"]}
    edgetpu = _manifest(dist / "demo-edgetpu.rejected")  # a single-variant target: rejected as a whole
    assert edgetpu["verification"]["passed"] is False and "published" not in edgetpu["verification"]


@pytest.mark.slow
def test_the_table_goes_to_stdout_with_the_rejected_variant_and_target(mixed):
    code, out, err, dist = mixed
    rows = {tuple(line.split()[:2]): line for line in out.splitlines() if line.split()}
    assert "PASS" in rows[("cpu", "demo_fp32.tflite")] and "PASS" in rows[("cpu", "demo_fp16.tflite")]
    assert "FAIL" in rows[("cpu", "demo-cpu.rejected/demo_int8.tflite")]
    assert "FAIL" in rows[("edgetpu", "demo_int8.tflite")] and "PASS" in rows[("rpi", "demo_fp32.tflite")]
    assert f"cpu: {dist / 'demo-cpu'} without int8 (int8 top-1 " in out and "edgetpu: REJECTED (int8 top-1 " in out
    assert "model file" not in err  # the table is not split between the two streams


@pytest.mark.slow  # two builds of two variants: ~10 s
def test_without_allow_partial_it_exits_3_saying_both_and_with_it_0_and_the_best_passing_default(tmp_path, black):
    argv = ["--model", DEMO_MODEL, "--target", "cpu", "--calib", black, "--eval", EVAL, "--min-accuracy-ratio", "0.5",
            "--variants", "int8,fp16", "--no-recover"]  # no fp32: int8 is the default
    code, out, err = _cli(*argv, "--out", tmp_path / "strict")
    assert code == 3 and _error_line(err).endswith("(written: cpu without int8; exit 3 unless --allow-partial)")
    fix = _fix_line(err)
    assert "calibrate int8 with more representative images" in fix and "lower --min-accuracy-ratio" in fix
    assert "no bundle was written" not in fix and "pass --allow-partial to accept cpu" in fix
    code, out, err = _cli(*argv, "--out", tmp_path / "partial", "--allow-partial")
    assert code == 0 and "edgekit build: error:" not in err
    warning = next(ln for ln in err.splitlines() if "--allow-partial" in ln)
    assert warning.startswith(f"WARNING: cpu: bundle {tmp_path / 'partial' / 'demo-cpu'} written without int8 (int8 ")
    assert warning.endswith("; exit 0 as --allow-partial asks (3 without it)")
    bundle = load_bundle(tmp_path / "partial" / "demo-cpu")
    assert [m.name for m in bundle.models] == ["fp16"] and bundle.manifest["default_model"] == "fp16"  # never int8
    assert bundle.manifest["input"]["dtype"] == "float32"  # the bundle's input is its new default's


@pytest.fixture(scope="module")
def fine_model(tmp_path_factory) -> Path:
    """Two outputs: ``head`` (3 values) and ``fine`` = 1000.1 * x - 1000.0 * x, which float16 weights zero."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((32, 32, 1))
    x = layers.GlobalAveragePooling2D()(layers.Conv2D(4, 3, activation="relu")(inp))
    big = layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(1000.1), name="big")(x)
    base = layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(1000.0), name="base")(x)
    model = keras.Model(inp, [layers.Dense(3, name="head")(x), layers.Subtract(name="fine")([big, base])])
    path = tmp_path_factory.mktemp("fine") / "fine.keras"
    model.save(path)
    return path


@pytest.mark.slow  # fp32 + fp16 conversions: ~6 s
def test_an_fp16_rejection_on_the_cosine_gate_names_min_cosine_and_not_calibration(tmp_path, fine_model):
    from edgekit.runtime import open_runtime

    code, out, err = _cli("--model", fine_model, "--target", "cpu", "--task", "raw", "--calib", CALIB,
                          "--calib-count", "40", "--variants", "fp32,fp16", "--min-cosine", "0.999", "--out", tmp_path)
    line = _error_line(err)
    assert code == 3 and "cpu: fp16 output fine cosine 0.0 < 0.999" in line
    assert line.endswith("(written: cpu without fp16; exit 3 unless --allow-partial)")
    fix = _fix_line(err)
    assert "lower --min-cosine" in fix and "calibrat" not in fix and "--min-accuracy-ratio" not in fix
    rows = {tuple(ln.split()[:2]): ln.split() for ln in out.splitlines() if ln.split()}
    assert rows[("target", "model")][4:7] == ["worst", "output", "cosine"]
    # the columns: worst output, its cosine, its mean absolute error (raw's MAE, not gated), the gate
    fp16 = rows[("cpu", "fine-cpu.rejected/fine_fp16.tflite")]
    assert fp16[4:6] == ["fine", "0.000000"] and float(fp16[6]) > 0 and fp16[7] == "FAIL"
    fp32 = rows[("cpu", "fine_fp32.tflite")]
    assert float(fp32[5]) >= 0.999 and fp32[7] == "PASS"
    with open_runtime(tmp_path / "fine-cpu") as rt:  # the partial bundle runs as any other
        outs = rt.infer(np.full((1, 32, 32, 1), 0.5, np.float32))
    assert [o.shape for o in outs] == [(1, 3), (1, 1)] and abs(float(outs[1][0, 0])) > 1e-4
