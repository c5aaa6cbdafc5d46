"""Bundle manifest: atomic writes and the checks a device makes before trusting a bundle."""

from __future__ import annotations

import json

import pytest

from edgekit.bundle import FORMAT_VERSION, BundleWriter, load_bundle
from edgekit.errors import BundleError
from edgekit.image import InputSpec

SPEC = InputSpec(shape=(1, 4, 4, 1), colour="gray").to_dict()


def _manifest():
    return {"target": "cpu", "default_model": "fp32",
            "models": [{"name": "fp32", "file": "m.tflite", "format": "tflite", "precision": "float32",
                        "input": SPEC, "outputs": []}]}


def _write(dest):
    with BundleWriter(dest) as w:
        (w.dir / "m.tflite").write_bytes(b"model-bytes")
        w.commit(_manifest())
    return dest


def test_writer_hashes_every_file_and_loads(tmp_path):
    b = load_bundle(_write(tmp_path / "b"))
    assert b.manifest["format_version"] == FORMAT_VERSION
    assert set(b.manifest["files"]) == {"m.tflite"}
    assert b.input_spec.shape == (1, 4, 4, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no temp dirs left


def test_interrupted_write_leaves_nothing_and_keeps_old(tmp_path):
    dest = _write(tmp_path / "b")
    with pytest.raises(KeyboardInterrupt), BundleWriter(dest) as w:
        (w.dir / "m.tflite").write_bytes(b"half")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["b"]
    assert (dest / "m.tflite").read_bytes() == b"model-bytes"


def test_tampered_file_is_refused(tmp_path):
    dest = _write(tmp_path / "b")
    (dest / "m.tflite").write_bytes(b"evil")
    with pytest.raises(BundleError, match="sha256"):
        load_bundle(dest)


def test_missing_corrupt_and_newer_manifest(tmp_path):
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="not an edgekit bundle"):
        load_bundle(tmp_path / "empty")
    dest = _write(tmp_path / "b")
    (dest / "edgekit.json").write_text("{ not json")
    with pytest.raises(BundleError, match="corrupt"):
        load_bundle(dest)
    dest = _write(tmp_path / "c")
    m = json.loads((dest / "edgekit.json").read_text())
    m["format_version"] = FORMAT_VERSION + 1
    (dest / "edgekit.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="upgrade edgekit"):
        load_bundle(dest)


def _edit(dest, change):
    m = json.loads((dest / "edgekit.json").read_text())
    change(m)
    (dest / "edgekit.json").write_text(json.dumps(m))


def test_malformed_files_section(tmp_path):
    dest = _write(tmp_path / "b")
    _edit(dest, lambda m: m.update(files=[]))
    with pytest.raises(BundleError, match="'files' is missing or not a dict"):
        load_bundle(dest)


def test_model_file_must_be_hashed_and_inside(tmp_path):
    dest = _write(tmp_path / "b")
    _edit(dest, lambda m: m["files"].pop("m.tflite"))
    with pytest.raises(BundleError, match="not listed"):
        load_bundle(dest)
    dest = _write(tmp_path / "c")
    (tmp_path / "outside.tflite").write_bytes(b"x")

    def escape(m):
        m["models"][0]["file"] = "../outside.tflite"
        m["files"]["../outside.tflite"] = m["files"]["m.tflite"]

    _edit(dest, escape)
    with pytest.raises(BundleError, match="outside the bundle"):
        load_bundle(dest)


def test_rejected_bundle_needs_explicit_consent(tmp_path):
    dest = _write(tmp_path / "b")
    _edit(dest, lambda m: m.update(verification={"passed": False, "reason": "int8 ratio 0.8 < 0.99"}))
    with pytest.raises(BundleError, match="failed its accuracy check"):
        load_bundle(dest)
    assert load_bundle(dest, allow_rejected=True).target == "cpu"


def test_open_model_hashes_every_bundle_file_once(tmp_path, model, monkeypatch):
    import collections
    import shutil

    import edgekit.bundle
    from edgekit.model import open_model

    with BundleWriter(tmp_path / "b") as w:
        shutil.copy(model("small_float"), w.dir / "m.tflite")
        (w.dir / "labels.txt").write_text("a\nb\n")
        w.commit(dict(_manifest(), labels="labels.txt", runtime={"adapter": "edgekit.runtime.litert:LiteRTRuntime"},
                      models=[dict(_manifest()["models"][0], input=InputSpec(shape=(1, 32, 32, 1)).to_dict())]))
    hashed = collections.Counter()
    real = edgekit.bundle.sha256_file

    def counting(path):
        hashed[str(path)] += 1
        return real(path)

    monkeypatch.setattr(edgekit.bundle, "sha256_file", counting)
    with open_model(tmp_path / "b") as m:
        assert m.labels == ["a", "b"]
    assert sorted(hashed.values()) == [1, 1] and len(hashed) == 2  # m.tflite and labels.txt, once each


def test_labels_are_read_one_way_for_bundles_and_label_files(tmp_path):
    from edgekit.bundle import read_labels
    from edgekit.errors import ModelError
    from edgekit.model import read_labels as model_read_labels

    assert model_read_labels is read_labels
    with BundleWriter(tmp_path / "b") as w:
        (w.dir / "m.tflite").write_bytes(b"model-bytes")
        (w.dir / "labels.txt").write_bytes("T-shirt \r\n\r\nAnkle boot\n  \nné\n".encode())
        w.commit(dict(_manifest(), labels="labels.txt"))
    bundle = load_bundle(tmp_path / "b")
    assert bundle.labels == read_labels(tmp_path / "b" / "labels.txt") == ["T-shirt", "Ankle boot", "né"]
    (tmp_path / "latin1.txt").write_bytes("n\xe9\n".encode("latin-1"))
    with pytest.raises(ModelError, match="cannot read labels file") as info:
        read_labels(tmp_path / "latin1.txt")
    assert "\n" not in info.value.message and "UTF-8" in info.value.hint
    with pytest.raises(ModelError, match="cannot read labels file"):
        read_labels(tmp_path / "missing.txt")


def test_task_defaults_to_classify_and_unknown_or_malformed_tasks_are_refused(tmp_path):
    assert load_bundle(_write(tmp_path / "old")).task == "classify"  # bundles from before the task field
    dest = _write(tmp_path / "b")
    _edit(dest, lambda m: m.update(task="raw"))
    assert load_bundle(dest).task == "raw"
    _edit(dest, lambda m: m.update(task="segment-everything"))
    with pytest.raises(BundleError, match="unknown task 'segment-everything'"):
        load_bundle(dest)
    _edit(dest, lambda m: m.update(task="classify"))
    for bad in ({"output_index": 3}, {"output_index": "0"}, ["output_index"]):
        def point(m, bad=bad):
            m["models"][0].update(outputs=[{"name": "scores", "shape": [1, 10]}], task_options=bad)
        _edit(dest, point)
        with pytest.raises(BundleError, match="malformed task_options"):
            load_bundle(dest)
