"""edgekit build: real TensorFlow converter, real ai_edge_litert and ONNX Runtime, the repo's demo model."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgekit.bundle import load_bundle
from edgekit.imaging.image import Preprocessor, read_image
from edgekit.runtime import open_runtime
from tests.conftest import CALIB, DEMO_MODEL, EVAL, FRAMES


def test_every_target_gets_a_verified_bundle(demo_bundles):
    assert set(demo_bundles) == {"edgetpu", "rpi", "cpu", "jetson"}
    for target, result in demo_bundles.items():
        bundle = load_bundle(result.bundle)  # checks every sha256
        m = bundle.manifest
        for key in ("format_version", "target", "files", "input", "outputs", "runtime", "provenance", "verification"):
            assert key in m, (target, key)
        v = m["verification"]
        assert v["metric"] == "top1" and v["passed"] is True
        assert v["ratio"] >= 0.99 and v["original"] >= 0.88, (target, v)
        assert set(m["provenance"]["versions"]) >= {"edgekit", "numpy"}
        assert len(m["provenance"]["calibration"]["sha256"]) == 64
        assert bundle.labels[:2] == ["t-shirt", "trouser"]
        assert {"labels.txt", "build.log"} <= set(m["files"])


def test_int8_bundle_is_full_integer_with_uint8_io(demo_bundles):
    m = load_bundle(demo_bundles["edgetpu"].bundle).manifest
    [model] = m["models"]
    assert model["precision"] == "int8"
    assert model["input"]["dtype"] == "uint8" and model["input"]["scale"] > 0
    assert model["input"]["shape"] == [1, 32, 32, 1]
    assert model["outputs"][0]["dtype"] == "uint8"
    assert m["runtime"]["options"]["delegate"] == "edgetpu"  # on a device; the plain int8 model says xnnpack


def test_cpu_bundles_record_measured_xnnpack_coverage(demo_bundles):
    for target in ("cpu", "rpi"):
        m = load_bundle(demo_bundles[target].bundle).manifest
        for name, cov in m["delegation"].items():
            assert cov["delegate"] == "XNNPACK"
            assert 0 < cov["delegated_nodes"] <= cov["total_nodes"], (target, name, cov)
    assert {m["name"] for m in load_bundle(demo_bundles["rpi"].bundle).manifest["models"]} == {"fp32", "fp16"}


def test_jetson_bundle_has_fp32_and_fp16_onnx_with_float_io(demo_bundles):
    b = load_bundle(demo_bundles["jetson"].bundle)
    models = {m.name: m for m in b.models}
    assert set(models) == {"fp32", "fp16"} and b.manifest["default_model"] == "fp16"
    assert models["fp16"].input.dtype == "float32"  # keep_io_types: the device feeds float32
    assert b.manifest["verification"]["models"]["fp16"]["eval"]["agreement"] >= 0.99


@pytest.mark.parametrize("target", ["cpu", "edgetpu", "jetson"])
def test_bundles_classify_eval_images_on_the_device_runtime(demo_bundles, target):
    path = demo_bundles[target].bundle
    kwargs = {"backend": "onnxruntime"} if target == "jetson" else {}  # no TensorRT here
    with open_runtime(path, **kwargs) as rt:
        prep = Preprocessor(rt.input_spec)
        labels = load_bundle(path).labels
        hits = total = 0
        for cls in ("trouser", "bag", "sneaker"):
            for f in sorted((EVAL / cls).glob("*.png"))[:10]:
                scores = rt.infer(prep(read_image(f)))[0]
                hits += labels[int(np.argmax(scores))] == cls
                total += 1
    assert hits / total >= 0.85


def test_calibration_is_deterministic_and_hashed(tmp_path):
    from edgekit.builders.log import BuildLog
    from edgekit.builders.sources.images import load_calibration
    from edgekit.imaging.image import InputSpec

    prep = Preprocessor(InputSpec(shape=(1, 32, 32, 1), colour="gray", crop=(200, 200)))
    log = BuildLog(quiet=True)
    a = load_calibration([CALIB, FRAMES], prep, 100, 0, log)
    b = load_calibration([CALIB, FRAMES], prep, 100, 0, log)
    c = load_calibration([CALIB, FRAMES], prep, 100, 1, log)
    assert a.sha256 == b.sha256 != c.sha256
    assert len(a) == 100 and set(a.sources) == {str(CALIB), str(FRAMES)}
    assert any("recommended" in line for line in log.lines)  # fewer than 300 images warns


def test_onnx_input_builds_for_jetson(demo_bundles, tmp_path):
    from edgekit.builders.build import build

    onnx_model = tmp_path / "demo.onnx"
    onnx_model.write_bytes((demo_bundles["jetson"].bundle / "demo_fp32.onnx").read_bytes())
    [r] = build(onnx_model, "jetson", [CALIB], out=tmp_path / "out", eval_dir=EVAL, labels=DEMO_MODEL.with_suffix(
        "").as_posix() + ".labels.txt", preprocess={"crop": [200, 200]}, quiet=True)
    assert r.passed and (r.bundle / "demo_fp16.onnx").is_file()


def test_savedmodel_and_h5_inputs(tmp_path):
    import keras

    from edgekit.builders.build import build

    model = keras.models.load_model(DEMO_MODEL)
    model.export(str(tmp_path / "sm"), verbose=False)
    h5 = tmp_path / "demo.h5"
    model.save(h5)
    for src in (tmp_path / "sm", h5):
        [r] = build(src, "cpu", [CALIB], out=tmp_path / "out", eval_dir=EVAL, variants=["fp32"], quiet=True,
                    preprocess={"crop": [200, 200], "colour": "gray"})
        assert r.passed and load_bundle(r.bundle).manifest["verification"]["ratio"] >= 0.99


def test_build_side_imports_tensorflow_only_inside_functions():
    code = ("import sys, edgekit, edgekit.builders.build, edgekit.builders.tflite, edgekit.builders.onnx, "
            "edgekit.commands.build, edgekit.cli; edgekit.cli.build_parser(); "
            "print(sorted(m for m in ('tensorflow', 'keras', 'torch', 'tf2onnx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().replace("'", '"')) == []


@pytest.fixture()
def fake_compiler(tmp_path, monkeypatch):
    """The stand-in edgetpu_compiler (a test double of the process boundary) on PATH."""
    import os
    import shutil

    from tests.conftest import ROOT

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "edgetpu_compiler"
    body = (ROOT / "tests" / "fixtures" / "edgetpu" / "edgetpu_compiler").read_text().split("\n", 1)[1]
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("edgetpu_compiler") == str(script)
    return monkeypatch


def test_edgetpu_build_compiles_and_keeps_plain_int8(tmp_path, fake_compiler):
    from edgekit.builders.build import build

    [r] = build(DEMO_MODEL, "edgetpu", [CALIB, FRAMES], out=tmp_path / "out", quiet=True)
    m = load_bundle(r.bundle).manifest
    names = {x["name"]: x for x in m["models"]}
    assert set(names) == {"int8", "int8_edgetpu"} and m["default_model"] == "int8_edgetpu"
    assert names["int8_edgetpu"]["file"] == "demo_int8_edgetpu.tflite"
    assert names["int8_edgetpu"]["runtime_options"] == {"delegate": "edgetpu"}
    assert names["int8"]["runtime_options"] == {"delegate": "xnnpack"}
    assert m["edgetpu"]["status"] == "compiled" and m["edgetpu"]["offline"]["op_share"] == 1.0
    assert "demo_int8_edgetpu.tflite" in m["files"]


def test_edgetpu_compiler_failure_fails_the_build(tmp_path, fake_compiler, capsys):
    from edgekit.cli import main

    fake_compiler.setenv("EDGEKIT_FAKE_EDGETPU_MODE", "fail")
    code = main(["build", "--model", str(DEMO_MODEL), "--target", "edgetpu", "--calib", str(CALIB),
                 "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "edgetpu_compiler" in err
    assert not (tmp_path / "out" / "demo-edgetpu").exists()


def test_edgetpu_bundle_without_compiler_says_not_compiled(demo_bundles):
    m = load_bundle(demo_bundles["edgetpu"].bundle).manifest
    if m["edgetpu"]["status"] == "compiled":
        pytest.skip("a real edgetpu_compiler is installed here")
    assert m["edgetpu"]["status"] == "not compiled" and "apt" in m["edgetpu"]["reason"]
    assert m["default_model"] == "int8" and m["edgetpu"]["offline"]["cache_status"] == "fits"
