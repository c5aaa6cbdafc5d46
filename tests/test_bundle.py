"""Bundle manifest: atomic writes and the checks a device makes before trusting a bundle."""

from __future__ import annotations

import json

import pytest

from edgekit.bundle import FORMAT_VERSION, BundleWriter, load_bundle, sha256_file
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


# --- integrity: every listed file, labels and sidecars included (issue 15 security, issue 18) ---------


def _write_full(dest):
    """A bundle with a model, labels and a build log, as ``edgekit build`` writes one."""
    with BundleWriter(dest) as w:
        (w.dir / "m.tflite").write_bytes(b"model-bytes")
        (w.dir / "labels.txt").write_text("cat\ndog\n")
        (w.dir / "build.log").write_text("built\n")
        w.commit(dict(_manifest(), labels="labels.txt"))
    return dest


@pytest.mark.parametrize("name", ["labels.txt", "build.log"])
def test_every_listed_file_is_hashed_not_only_models(tmp_path, name):
    dest = _write_full(tmp_path / "b")
    assert load_bundle(dest).labels == ["cat", "dog"]
    (dest / name).write_text("tampered\n")
    with pytest.raises(BundleError, match=f"{name} does not match its sha256"):
        load_bundle(dest)
    load_bundle(dest, check_hashes=False)  # preflight's quick look still reads it


@pytest.mark.parametrize("check_hashes", [True, False])
@pytest.mark.parametrize("name", ["labels.txt", "build.log", "m.tflite"])
def test_a_listed_file_that_is_missing_is_an_error(tmp_path, name, check_hashes):
    dest = _write_full(tmp_path / "b")
    (dest / name).unlink()  # a half-copied bundle
    with pytest.raises(BundleError, match=f"is missing {name}") as err:
        load_bundle(dest, check_hashes=check_hashes)
    assert "copy the whole bundle directory again" in err.value.hint


def test_labels_must_be_listed_and_inside_the_bundle(tmp_path):
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0\n")
    dest = _write_full(tmp_path / "b")
    _edit(dest, lambda m: m.update(labels=str(secret)))  # absolute and unlisted
    with pytest.raises(BundleError, match="labels file .*passwd' is not listed in 'files'"):
        load_bundle(dest)
    for name in (str(secret), "../passwd"):  # listed with the right digest, but outside
        dest = _write_full(tmp_path / f"b{len(name)}")
        _edit(dest, lambda m, name=name: (m.update(labels=name), m["files"].update({name: sha256_file(secret)})))
        with pytest.raises(BundleError, match="points outside the bundle"):
            load_bundle(dest)
        with pytest.raises(BundleError, match="points outside the bundle"):
            load_bundle(dest, check_hashes=False)
    for bad in (["labels.txt"], 7, ""):
        dest = _write_full(tmp_path / f"c{bad!r}")
        _edit(dest, lambda m, bad=bad: m.update(labels=bad))
        with pytest.raises(BundleError, match="labels file .* is not listed in 'files'"):
            load_bundle(dest)
    dest = _write_full(tmp_path / "none")
    _edit(dest, lambda m: m.update(labels=None))  # no labels at all is allowed
    assert load_bundle(dest).labels == []


def test_a_symlinked_listed_file_out_of_the_bundle_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("cat\ndog\n")
    dest = _write_full(tmp_path / "b")
    (dest / "labels.txt").unlink()
    (dest / "labels.txt").symlink_to(secret)  # same bytes, same digest: only the path check stops it
    with pytest.raises(BundleError, match="'labels.txt' points outside the bundle"):
        load_bundle(dest)


def test_the_adapter_must_be_an_exact_module_class_from_the_table(tmp_path, model):
    """A bundle cannot name any attribute of an allowed module (``litert:ctypes``), nor a look-alike."""
    import shutil

    from edgekit.runtime import open_runtime

    with BundleWriter(tmp_path / "b") as w:
        shutil.copy(model("small_float"), w.dir / "m.tflite")
        w.commit(dict(_manifest(), runtime={"adapter": "edgekit.runtime.litert:LiteRTRuntime"},
                      models=[dict(_manifest()["models"][0], input=InputSpec(shape=(1, 32, 32, 1)).to_dict())]))
    with open_runtime(tmp_path / "b") as rt:  # the allowed adapter, exactly as written by build
        assert rt.describe()["backend"]
    for bad in ("edgekit.runtime.litert:ctypes", "edgekit.runtime.litert", "edgekit.runtime.litert:LiteRTRuntime ",
                "edgekit.runtime.litert.LiteRTRuntime", "os:system"):
        _edit(tmp_path / "b", lambda m, bad=bad: m["runtime"].update(adapter=bad))
        with pytest.raises(BundleError, match="unknown runtime adapter"):
            open_runtime(tmp_path / "b")
