"""``edgekit diff BUNDLE BUNDLE``: the facts that differ, 0 same / 1 different / 2 trouble (issue 39 item 5).

Bundles are written with the real BundleWriter around a real ONNX detector (tests/helpers); the
differences are made the ways rebuilds make them: a variant dropped, another file, a gate figure,
the preprocessing, the provenance, and only the build time (which is not a difference)."""

from __future__ import annotations

import json
import shutil

import pytest

from edgekit.bundle import sha256_file
from edgekit.bundle_diff import diff_bundles, format_diff
from edgekit.cli import main as cli
from edgekit.errors import BundleError
from tests.helpers.detector_model import detector_bundle


def _edit(bundle, change) -> None:
    manifest = json.loads((bundle / "edgekit.json").read_text())
    change(manifest)
    (bundle / "edgekit.json").write_text(json.dumps(manifest))


@pytest.fixture()
def pair(tmp_path):
    a = detector_bundle(tmp_path / "dist/twobox-cpu")
    _edit(a, lambda m: m.update(provenance={"source_model": "m.onnx", "created": "2026-01-01T00:00:00+00:00",
                                            "host": "hostA", "build_seconds": 3.0},
                                verification={"passed": True, "models": {"fp32": {"eval": {"map": 0.5}}}}))
    b = tmp_path / "other/twobox-cpu"
    shutil.copytree(a, b)
    return a, b


def test_two_builds_that_differ_only_in_when_are_the_same(pair):
    a, b = pair
    _edit(b, lambda m: m["provenance"].update(created="2026-02-02T00:00:00+00:00", host="hostB", build_seconds=9.0))
    d = diff_bundles(a, b)
    assert d.identical and d.compared > 10 and d.built[str(b)]["host"] == "hostB"
    assert format_diff(d).startswith(f"{a} and {b} are the same bundle (")
    assert "built " + str(b) + ": 2026-02-02T00:00:00+00:00 on hostB (not compared)" in format_diff(d)


def test_what_differs_is_named_with_both_values(pair):
    a, b = pair

    def rebuild(m):
        m["models"][0]["input"]["interpolation"] = "linear"
        m["verification"]["models"]["fp32"]["eval"]["map"] = 0.25
        m["provenance"]["source_model"] = "other.onnx"
        m["target"] = "rpi"
    _edit(b, rebuild)
    d = diff_bundles(a, b)
    assert {k: (x, y) for k, x, y in d.differences} == {
        "target": ("cpu", "rpi"), "fp32 input interpolation": ("area", "linear"),
        "fp32 gate eval.map": (0.5, 0.25), "provenance source_model": ("m.onnx", "other.onnx")}
    text = format_diff(d)
    assert text.startswith(f"{a} and {b} differ in 4 of ") and "fp32 gate eval.map" in text


def test_a_variant_in_one_bundle_only_is_one_row_and_a_changed_file_its_sha256(pair, tmp_path):
    a, b = pair
    (b / "model.onnx").write_bytes((b / "model.onnx").read_bytes() + b"\0")  # another file, listed as it is
    _edit(b, lambda m: m["files"].update({"model.onnx": sha256_file(b / "model.onnx")}))
    d = diff_bundles(a, b)
    assert [(k, x[:12], y[:12]) for k, x, y in d.differences] == [
        ("fp32 sha256", sha256_file(a / "model.onnx")[:12], sha256_file(b / "model.onnx")[:12])]
    assert f"fp32 sha256  {sha256_file(a / 'model.onnx')[:12]} " in format_diff(d)  # sha256 cut to 12 digits
    c = tmp_path / "third/twobox-cpu"
    shutil.copytree(a, c)
    shutil.copy(c / "model.onnx", c / "model_int8.onnx")

    def add_int8(m):
        m["models"].append({**m["models"][0], "name": "int8", "file": "model_int8.onnx", "precision": "int8"})
        m["files"]["model_int8.onnx"] = m["files"]["model.onnx"]
    _edit(c, add_int8)
    d = diff_bundles(a, c)
    assert d.differences == [("variants", "fp32", "fp32, int8"), ("int8 file", None, "model_int8.onnx")]


def test_the_cli_exits_as_diff_does(pair, capsys, tmp_path):
    a, b = pair
    assert cli(["diff", str(a), str(b)]) == 0
    assert "are the same bundle" in capsys.readouterr().out
    assert cli(["diff", str(a), str(b), "-q"]) == 0 and capsys.readouterr().out == ""
    _edit(b, lambda m: m.update(target="rpi"))
    assert cli(["diff", str(a), str(b), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is False and report["differences"] == [{"fact": "target", "a": "cpu", "b": "rpi"}]
    (b / "model.onnx").write_bytes(b"tampered")
    assert cli(["diff", str(a), str(b)]) == 2
    assert "does not match its sha256" in capsys.readouterr().err
    with pytest.raises(BundleError, match="does not exist"):
        diff_bundles(a, tmp_path / "none")
