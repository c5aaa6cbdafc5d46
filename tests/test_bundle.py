"""Bundle manifest: atomic writes and the checks a device makes before trusting a bundle."""

from __future__ import annotations

import json

import pytest

from edgekit.bundle import FORMAT_VERSION, BundleWriter, load_bundle, sha256_file
from edgekit.errors import BundleError
from edgekit.imaging.image import InputSpec

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
        (w.dir / "labels.txt").write_text("a\nb\nc\nd\ne\n")  # one per class: a mismatch is refused at open
        w.commit(dict(_manifest(), labels="labels.txt", runtime={"adapter": "edgekit.runtime.litert:LiteRTRuntime"},
                      models=[dict(_manifest()["models"][0], input=InputSpec(shape=(1, 32, 32, 1)).to_dict())]))
    hashed = collections.Counter()
    real = edgekit.bundle.sha256_file

    def counting(path, **kw):
        hashed[str(path)] += 1
        return real(path, **kw)

    monkeypatch.setattr(edgekit.bundle, "sha256_file", counting)
    with open_model(tmp_path / "b") as m:
        assert m.labels == ["a", "b", "c", "d", "e"]
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


def _drop_manifest(dest):
    (dest / "edgekit.json").unlink()


def _not_a_dir(dest):
    import shutil

    shutil.rmtree(dest)


# Every refusal: (tamper, the message's words, the fix it gives). The fix is half of the error line.
REFUSALS = [
    (_not_a_dir, "does not exist", "build one with: edgekit build ..."),
    (_drop_manifest, r"is not an edgekit bundle \(no edgekit.json\)", "build one with: edgekit build ..."),
    (lambda d: (d / "edgekit.json").write_text("{ not json"), "edgekit.json is corrupt", "rebuild the bundle"),
    (lambda d: (d / "edgekit.json").write_bytes(b'{"a": "\xff"}'), "edgekit.json is corrupt", "rebuild the bundle"),
    (lambda d: (d / "edgekit.json").write_text("[1]"), r"is not an edgekit manifest \(no format_version\)",
     "rebuild the bundle"),
    (lambda d: (d / "edgekit.json").write_text("{}"), "no format_version", "rebuild the bundle"),
    (lambda d: _edit(d, lambda m: m.update(format_version=FORMAT_VERSION + 1)),
     f"uses bundle format {FORMAT_VERSION + 1}; this edgekit reads up to {FORMAT_VERSION}",
     "upgrade edgekit on this device"),
    (lambda d: _edit(d, lambda m: m.update(format_version="1")), "uses bundle format 1;",
     "upgrade edgekit on this device"),
    (lambda d: _edit(d, lambda m: m.update(target=3)), "'target' is missing or not a str", "rebuild the bundle"),
    (lambda d: _edit(d, lambda m: m.pop("models")), "'models' is missing or not a list", "rebuild the bundle"),
    (lambda d: _edit(d, lambda m: m.update(runtime=[])), "'runtime' is not an object", "rebuild the bundle"),
    (lambda d: _edit(d, lambda m: m["models"][0].pop("format")), "has a malformed model entry: 'format'",
     "rebuild the bundle"),
    (lambda d: _edit(d, lambda m: m.update(default_model="int8")), "has no model 'int8'", "choose one of: fp32"),
    (lambda d: _edit(d, lambda m: m["files"].pop("m.tflite")), "model file 'm.tflite' is not listed in 'files'",
     "rebuild the bundle"),
    (lambda d: _edit(d, lambda m: m["files"].update({"../x": "0"})), "file '../x' points outside the bundle",
     "rebuild the bundle"),
    (lambda d: (d / "labels.txt").unlink(), "is missing labels.txt", "copy the whole bundle directory again"),
    (lambda d: (d / "build.log").write_text("x"), "build.log does not match its sha256 in edgekit.json",
     "copy the bundle again or rebuild it"),
    (lambda d: _edit(d, lambda m: m.update(task="depth")), "unknown task 'depth' .this edgekit knows classify",
     "upgrade edgekit on this device, or rebuild the bundle"),
    (lambda d: _edit(d, lambda m: m["models"][0].update(task_options={"output_index": 1})),
     r"model 'fp32' has malformed task_options \{'output_index': 1\}", "rebuild the bundle"),
    (lambda d: _edit(d, lambda m: m.update(verification={"passed": False})),
     r"failed its accuracy check at build time \(see edgekit.json\)",
     "rebuild it, or pass --allow-rejected to run it anyway for inspection"),
]


@pytest.mark.parametrize(("tamper", "words", "fix"), REFUSALS, ids=[str(i) for i in range(len(REFUSALS))])
def test_every_refusal_is_one_line_with_its_fix(tmp_path, tamper, words, fix):
    dest = _write_full(tmp_path / "b")
    tamper(dest)
    with pytest.raises(BundleError, match=words) as err:
        load_bundle(dest)
    assert err.value.hint == fix and "\n" not in err.value.message and str(dest) in err.value.message


def test_the_bundle_reads_its_entries_and_paths(tmp_path):
    dest = _write_full(tmp_path / "b")
    _edit(dest, lambda m: m.update(runtime={"adapter": "a:B"}, task=None,
                                   models=[dict(m["models"][0], task_options={"output_index": 0}, extra_key=1)]))
    b = load_bundle(dest)
    [entry] = b.models
    assert (entry.name, entry.file, entry.format, entry.precision, entry.outputs) == (
        "fp32", "m.tflite", "tflite", "float32", [])
    assert entry.extra == {"task_options": {"output_index": 0}, "extra_key": 1}
    assert b.model() == b.model("fp32") == entry and b.model_path() == dest / "m.tflite"
    assert b.runtime == {"adapter": "a:B"} and b.task == "classify" and b.target == "cpu"
    assert b.input_spec == InputSpec(shape=(1, 4, 4, 1), colour="gray")


def test_writer_lists_nested_files_replaces_an_old_bundle_and_shares_it(tmp_path):
    import numpy as np

    dest = _write(tmp_path / "b")
    with BundleWriter(dest) as w:
        (w.dir / "m.tflite").write_bytes(b"new-model")
        (w.dir / "cache").mkdir()
        (w.dir / "cache" / "engine.bin").write_bytes(b"e")
        w.commit(dict(_manifest(), extra={"n": np.int64(3), "a": np.arange(2), "p": tmp_path / "x"}))
    text = (dest / "edgekit.json").read_text()
    m = json.loads(text)
    assert m["files"] == {"cache/engine.bin": sha256_file(dest / "cache" / "engine.bin"),
                          "m.tflite": sha256_file(dest / "m.tflite")}
    assert list(m)[0] == "format_version" and list(m)[-1] == "files" and text.endswith("}\n") and '\n  "' in text
    assert m["extra"] == {"n": 3, "a": [0, 1], "p": str(tmp_path / "x")}
    assert (dest / "m.tflite").read_bytes() == b"new-model" and sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert dest.stat().st_mode & 0o777 == 0o755
    with pytest.raises(TypeError, match="object is not JSON serialisable"), BundleWriter(tmp_path / "c") as w:
        w.commit(dict(_manifest(), extra=object()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


# --- values, branches and messages the mutation run found unpinned (issue 18, docs/mutation.md) --------

_LOCALE_PROBE = """
import locale, sys
sys.path.insert(0, sys.argv[1])
from edgekit.bundle import load_bundle
print(locale.getencoding())
b = load_bundle(sys.argv[2])
print(ascii(b.labels), ascii(b.manifest["extra"]))
"""


def test_labels_and_manifest_are_utf8_whatever_the_device_locale(tmp_path):
    """A device in the C locale (Python's locale encoding is ASCII there) still reads both as UTF-8."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import edgekit.bundle

    with BundleWriter(tmp_path / "b") as w:
        (w.dir / "m.tflite").write_bytes(b"model-bytes")
        (w.dir / "labels.txt").write_bytes("caf\u00e9\nna\u00efve\n".encode())
        w.commit(dict(_manifest(), labels="labels.txt"))
    m = json.loads((tmp_path / "b" / "edgekit.json").read_text())
    m["extra"] = {"author": "Zo\u00eb"}  # another tool may write the manifest as UTF-8, not \u escapes
    (tmp_path / "b" / "edgekit.json").write_bytes(json.dumps(m, ensure_ascii=False).encode())
    b = load_bundle(tmp_path / "b")  # here too, so that mutmut runs this test for load_bundle and read_labels
    assert b.labels == ["caf\u00e9", "na\u00efve"] and b.manifest["extra"] == {"author": "Zo\u00eb"}
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    root = str(Path(edgekit.bundle.__file__).resolve().parents[1])  # the edgekit under test (mutmut's copy too)
    run = subprocess.run([sys.executable, "-c", _LOCALE_PROBE, root, str(tmp_path / "b")], env=env,
                         capture_output=True, text=True, encoding="ascii", timeout=60)
    assert run.returncode == 0, run.stderr[-500:]
    encoding, result = run.stdout.splitlines()
    assert encoding == "ANSI_X3.4-1968"  # the probe really ran in an ASCII locale
    assert result == "['caf\\xe9', 'na\\xefve'] {'author': 'Zo\\xeb'}"


def test_an_unreadable_labels_file_hint_is_exact(tmp_path):
    from edgekit.bundle import read_labels
    from edgekit.errors import ModelError

    with pytest.raises(ModelError) as info:
        read_labels(tmp_path / "missing.txt")
    assert info.value.hint == "give a UTF-8 text file, one label per line"


def _write_two_models(dest):
    with BundleWriter(dest) as w:
        (w.dir / "m.tflite").write_bytes(b"model-bytes")
        (w.dir / "m_int8.tflite").write_bytes(b"int8-bytes")
        entry = _manifest()["models"][0]
        outputs = [{"name": "scores", "shape": [1, 10]}]
        w.commit(dict(_manifest(), models=[
            dict(entry, outputs=outputs),
            {k: v for k, v in dict(entry, name="int8", file="m_int8.tflite").items() if k != "outputs"}]))
    return dest


def test_a_bundle_with_two_models_names_paths_and_outputs_each(tmp_path):
    dest = _write_two_models(tmp_path / "b")
    b = load_bundle(dest)
    fp32, int8 = b.models
    assert fp32.outputs == [{"name": "scores", "shape": [1, 10]}] and int8.outputs == []  # outputs are optional
    assert b.model_path("int8") == dest / "m_int8.tflite" and b.model_path() == dest / "m.tflite"
    with pytest.raises(BundleError, match="has no model 'fp16'") as err:
        b.model("fp16")
    assert err.value.hint == "choose one of: fp32, int8"


@pytest.mark.parametrize(("key", "value", "kind"), [
    ("task", 3, "str"), ("verification", [False], "dict"), ("default_model", 0, "str")])
def test_optional_manifest_keys_are_typed(tmp_path, key, value, kind):
    dest = _write(tmp_path / "b")
    _edit(dest, lambda m: m.update({key: value}))
    with pytest.raises(BundleError) as err:
        load_bundle(dest)
    assert err.value.message == f"{dest / 'edgekit.json'}: {key!r} is not a {kind}"
    assert err.value.hint == "rebuild the bundle"
    if key != "default_model":  # null is the same as absent (a bundle without a default model has no model)
        _edit(dest, lambda m: m.update({key: None}))
        assert load_bundle(dest).target == "cpu"


def test_a_corrupt_manifest_message_is_cut_at_300_characters(tmp_path):
    dest = _write(tmp_path / ("d" * max(1, 200 - len(str(tmp_path)))) / "b")  # the error runs past 300
    (dest / "edgekit.json").write_text("{ not json")
    with pytest.raises(BundleError, match="is corrupt") as err:
        load_bundle(dest)
    assert len(err.value.message) == 300


def test_a_rejected_bundle_says_why_and_unknown_tasks_list_every_known_one(tmp_path):
    from edgekit.heads.table import TASK_HEADS

    dest = _write(tmp_path / "b")
    _edit(dest, lambda m: m.update(verification={"passed": False, "reason": "int8 ratio 0.8 < 0.99"}))
    with pytest.raises(BundleError) as err:
        load_bundle(dest)
    assert err.value.message.endswith("failed its accuracy check at build time (int8 ratio 0.8 < 0.99)")
    _edit(dest, lambda m: m.update(verification=None, task="depth"))
    with pytest.raises(BundleError) as err:
        load_bundle(dest)
    assert err.value.message.endswith(f"(this edgekit knows {', '.join(TASK_HEADS)})")
    assert "classify, raw" in err.value.message


def test_a_model_entry_that_is_not_an_object_is_refused(tmp_path):
    dest = _write(tmp_path / "b")
    _edit(dest, lambda m: m.update(models=["m.tflite"]))
    with pytest.raises(BundleError, match="model file None is not listed in 'files'"):
        load_bundle(dest)


def test_writer_makes_missing_parents_and_a_hidden_temp_dir_beside_the_bundle(tmp_path):
    dest = tmp_path / "dist" / "nested" / "b"
    with BundleWriter(dest) as w:
        assert w.dir.parent == dest.parent  # the final rename stays on one filesystem
        assert w.dir.name.startswith(".b.tmp-")  # hidden: a half-written bundle does not look like one
        (w.dir / "m.tflite").write_bytes(b"model-bytes")
        w.commit(_manifest())
    assert load_bundle(dest).target == "cpu"


def test_commit_outside_a_with_block_is_a_clear_programming_error(tmp_path):
    with pytest.raises(AssertionError, match="^use BundleWriter as a context manager$"):
        BundleWriter(tmp_path / "b").commit(_manifest())


def test_cleanup_never_hides_the_error_that_stopped_the_write(tmp_path):
    import shutil

    with pytest.raises(KeyboardInterrupt), BundleWriter(tmp_path / "b") as w:
        shutil.rmtree(w.dir)  # the temp dir is already gone when the cleanup runs
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_bundle_has_the_manifests_name_and_the_package_lists_only_its_api(tmp_path):
    """Issue 39 item 9: ``Bundle.name``; ``dir(edgekit)`` without Any/TYPE_CHECKING/annotations."""
    import edgekit

    with BundleWriter(tmp_path / "demo-cpu") as w:
        (w.dir / "m.tflite").write_bytes(b"model-bytes")
        w.commit({**_manifest(), "name": "demo"})
    assert load_bundle(tmp_path / "demo-cpu").name == "demo"
    assert load_bundle(_write(tmp_path / "old-cpu")).name == "old-cpu"  # no name in the manifest: its folder
    names = dir(edgekit)
    assert not {"Any", "TYPE_CHECKING", "annotations", "importlib"} & set(names)
    assert {"Bundle", "Pipeline", "build", "open_camera", "load_bundle"} <= set(names)
