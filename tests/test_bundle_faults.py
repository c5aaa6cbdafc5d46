"""Fault catalogue, tampered bundles: every manifest field, paths, links, types, ranges, adapters, labels.

A bundle is untrusted input (copied from another machine, edited by hand, cut short). Each
case takes a real bundle built by ``edgekit build``, changes one thing, and runs
``edgekit run BUNDLE --camera synthetic`` in this process: it must be refused at load with one
line and a fix, exit 2, never a traceback, never a file read from outside the bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.faults import assert_nothing_left, assert_refused, edgekit, snapshot


def _rehash(b: Path, m: dict) -> None:
    """Recompute every listed file's sha256, as a careful attacker would."""
    for name in m.get("files", {}):
        path = b / name
        if path.is_file():
            m["files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()


def _set(path: str, value) -> Callable[[Path, dict], None]:
    """A mutation setting the manifest key at dotted ``path`` (``models.0.input.crop``)."""

    def change(_b: Path, m: dict) -> None:
        keys = path.split(".")
        node = m
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = keys[-1]
        if value is _DELETE:
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


_DELETE = object()


def _model_file(b: Path, m: dict) -> Path:
    return b / m["models"][0]["file"]


def _outside(b: Path) -> Path:
    """A file next to the bundle, outside it: what an escaping path would read."""
    secret = b.parent / "secret.txt"
    secret.write_text("root:x:0:0:secret\n" * 11)
    return secret


def _symlink_model_out(b: Path, m: dict) -> None:
    secret = _outside(b)
    f = _model_file(b, m)
    f.unlink()
    f.symlink_to(secret)
    _rehash(b, m)


def _symlink_labels_out(b: Path, m: dict) -> None:
    secret = _outside(b)
    (b / "labels.txt").unlink()
    (b / "labels.txt").symlink_to(secret)
    _rehash(b, m)


def _labels_outside(b: Path, m: dict) -> None:
    m["labels"] = str(_outside(b))


def _labels_dotdot(b: Path, m: dict) -> None:
    _outside(b)
    m["labels"] = "../secret.txt"


def _labels_edited(b: Path, _m: dict) -> None:
    (b / "labels.txt").write_text("\n".join(f"evil{i}" for i in range(11)) + "\n")


def _labels_unlisted(b: Path, m: dict) -> None:
    (b / "other.txt").write_text("\n".join(f"x{i}" for i in range(11)) + "\n")
    m["labels"] = "other.txt"


def _three_labels(b: Path, m: dict) -> None:
    (b / "labels.txt").write_text("a\nb\nc\n")
    _rehash(b, m)


def _labels_binary(b: Path, m: dict) -> None:
    (b / "labels.txt").write_bytes(b"\xff\xfe\x00" * 50)
    _rehash(b, m)


def _truncate_model(b: Path, m: dict) -> None:
    f = _model_file(b, m)
    f.write_bytes(f.read_bytes()[:1000])


def _garbage_model_rehashed(b: Path, m: dict) -> None:
    _model_file(b, m).write_bytes(os.urandom(4096))
    _rehash(b, m)


def _truncated_model_rehashed(b: Path, m: dict) -> None:
    f = _model_file(b, m)
    f.write_bytes(f.read_bytes()[:5000])
    _rehash(b, m)


def _empty_model_rehashed(b: Path, m: dict) -> None:
    _model_file(b, m).write_bytes(b"")
    _rehash(b, m)


def _model_is_directory(b: Path, m: dict) -> None:
    f = _model_file(b, m)
    f.unlink()
    f.mkdir()


def _model_deleted(b: Path, m: dict) -> None:
    _model_file(b, m).unlink()


def _onnx_bytes_as_tflite(b: Path, m: dict) -> None:
    _model_file(b, m).write_bytes(b"\x08\x07\x12\x07pytorch" + b"\0" * 100)
    _rehash(b, m)


def _file_entry_outside(b: Path, m: dict) -> None:
    secret = _outside(b)
    m["files"]["../secret.txt"] = hashlib.sha256(secret.read_bytes()).hexdigest()


def _file_entry_absolute(b: Path, m: dict) -> None:
    secret = _outside(b)
    m["files"][str(secret)] = hashlib.sha256(secret.read_bytes()).hexdigest()


def _model_file_dotdot(b: Path, m: dict) -> None:
    secret = _outside(b)
    m["models"][0]["file"] = "../secret.txt"
    m["files"]["../secret.txt"] = hashlib.sha256(secret.read_bytes()).hexdigest()


def _model_file_absolute(b: Path, m: dict) -> None:
    secret = _outside(b)
    m["models"][0]["file"] = str(secret)
    m["files"][str(secret)] = hashlib.sha256(secret.read_bytes()).hexdigest()


def _sha_not_hex(b: Path, m: dict) -> None:
    name = m["models"][0]["file"]
    m["files"][name] = 12345


M = "models.0"
IN = "models.0.input"
R = "runtime.options"

CASES: dict[str, tuple[Callable[[Path, dict], None], str]] = {
    # the manifest's own keys
    "format_version-missing": (_set("format_version", _DELETE), "format_version"),
    "format_version-string": (_set("format_version", "1"), "format"),
    "format_version-newer": (_set("format_version", 99), "format 99"),
    "format_version-float": (_set("format_version", 1.5), "format"),
    "format_version-null": (_set("format_version", None), "format"),
    "target-missing": (_set("target", _DELETE), "target"),
    "target-number": (_set("target", 5), "target"),
    "models-missing": (_set("models", _DELETE), "models"),
    "models-object": (_set("models", {}), "models"),
    "models-empty": (_set("models", []), "model"),
    "models-numbers": (_set("models", [5]), "model"),
    "models-empty-entry": (_set("models", [{}]), "model"),
    "files-missing": (_set("files", _DELETE), "files"),
    "files-list": (_set("files", []), "files"),
    "files-empty": (_set("files", {}), "not listed"),
    "default_model-unknown": (_set("default_model", "nope"), "nope"),
    "default_model-number": (_set("default_model", 5), "model"),
    "verification-failed": (_set("verification.passed", False), "accuracy"),
    "verification-string": (_set("verification", "passed"), "verification"),
    "task-unknown": (_set("task", "detect"), "task"),
    "task-number": (_set("task", 5), "task"),
    "task_options-index-out": (_set(f"{M}.task_options", {"output_index": 7}), "task_options"),
    "task_options-index-negative": (_set(f"{M}.task_options", {"output_index": -1}), "task_options"),
    "task_options-index-bool": (_set(f"{M}.task_options", {"output_index": True}), "task_options"),
    "task_options-string": (_set(f"{M}.task_options", "x"), "task_options"),
    # model entries
    "model-name-missing": (_set(f"{M}.name", _DELETE), "model"),
    "model-file-missing": (_set(f"{M}.file", _DELETE), "file"),
    "model-file-number": (_set(f"{M}.file", 5), "file"),
    "model-file-unlisted": (_set(f"{M}.file", "other.tflite"), "not listed"),
    "model-file-dotdot": (_model_file_dotdot, "outside"),
    "model-file-absolute": (_model_file_absolute, "outside"),
    "model-format-missing": (_set(f"{M}.format", _DELETE), "format"),
    "model-outputs-number": (_set(f"{M}.outputs", 5), "malformed"),
    "model-runtime_options-list": (_set(f"{M}.runtime_options", []), "runtime options"),
    # files and their hashes
    "file-entry-dotdot": (_file_entry_outside, "outside"),
    "file-entry-absolute": (_file_entry_absolute, "outside"),
    "sha-mismatch-truncated": (_truncate_model, "sha256"),
    "sha-not-a-string": (_sha_not_hex, "sha256"),
    "model-deleted": (_model_deleted, "missing"),
    "model-is-directory": (_model_is_directory, ""),
    "model-symlink-out": (_symlink_model_out, "outside"),
    "model-garbage-rehashed": (_garbage_model_rehashed, ""),
    "model-truncated-rehashed": (_truncated_model_rehashed, ""),
    "model-empty-rehashed": (_empty_model_rehashed, ""),
    "model-not-tflite-rehashed": (_onnx_bytes_as_tflite, ""),
    # the input description
    "input-missing": (_set(f"{M}.input", _DELETE), "input"),
    "input-string": (_set(IN, "rgb"), "input"),
    "input-shape-missing": (_set(f"{IN}.shape", _DELETE), "shape"),
    "input-shape-strings": (_set(f"{IN}.shape", ["a", 32, 32, 1]), "input"),
    "input-shape-number": (_set(f"{IN}.shape", 5), "input"),
    "input-shape-negative": (_set(f"{IN}.shape", [1, -32, 32, 1]), "shape"),
    "input-shape-zero": (_set(f"{IN}.shape", [1, 0, 0, 1]), "shape"),
    "input-shape-huge": (_set(f"{IN}.shape", [1, 100000, 100000, 1]), "shape"),
    "input-shape-3d": (_set(f"{IN}.shape", [32, 32, 1]), "shape"),
    "input-shape-floats": (_set(f"{IN}.shape", [1, 32.5, 32, 1]), "input"),
    "input-shape-five-channels": (_set(f"{IN}.shape", [1, 32, 32, 5]), "shape"),
    "input-dtype-complex": (_set(f"{IN}.dtype", "complex64"), "dtype"),
    "input-dtype-uint8-no-scale": (_set(f"{IN}.dtype", "uint8"), "scale"),
    "input-layout-bad": (_set(f"{IN}.layout", "HWNC"), "layout"),
    "input-colour-bad": (_set(f"{IN}.colour", "purple"), "colour"),
    "input-crop-negative": (_set(f"{IN}.crop", [-5, 0]), "crop"),
    "input-crop-zero": (_set(f"{IN}.crop", [0, 0]), "crop"),
    "input-crop-three": (_set(f"{IN}.crop", [1, 2, 3]), "crop"),
    "input-crop-circle": (_set(f"{IN}.crop", "circle"), "crop"),
    "input-crop-huge": (_set(f"{IN}.crop", [10**9, 10**9]), "crop"),
    "input-crop-strings": (_set(f"{IN}.crop", ["a", "b"]), "crop"),
    "input-mean-string": (_set(f"{IN}.mean", "x"), "input"),
    "input-mean-three-for-gray": (_set(f"{IN}.mean", [1, 2, 3]), "mean"),
    "input-std-zero": (_set(f"{IN}.std", [0]), "std"),
    "input-std-null": (_set(f"{IN}.std", None), "input"),
    "input-std-nan-text": (_set(f"{IN}.std", ["nan"]), "std"),
    "input-resize-bad": (_set(f"{IN}.resize", "zoom"), "resize"),
    "input-interpolation-bad": (_set(f"{IN}.interpolation", "lanczos"), "interpolation"),
    "input-extra-number": (_set(f"{IN}.extra", 5), "input"),
    # runtime adapter and options
    "runtime-string": (_set("runtime", "x"), "runtime"),
    "runtime-options-list": (_set(R, []), "runtime options"),
    "adapter-os-system": (_set("runtime.adapter", "os:system"), "adapter"),
    "adapter-module-attribute": (_set("runtime.adapter", "edgekit.runtime.litert:ctypes"), "adapter"),
    "adapter-number": (_set("runtime.adapter", 5), "adapter"),
    "adapter-subprocess": (_set("runtime.adapter", "subprocess:Popen"), "adapter"),
    "num_threads-text": (_set(f"{R}.num_threads", "many"), "num_threads"),
    "num_threads-huge": (_set(f"{R}.num_threads", 100000), "num_threads"),
    "num_threads-zero": (_set(f"{R}.num_threads", 0), "num_threads"),
    "num_threads-negative": (_set(f"{R}.num_threads", -1), "num_threads"),
    "num_threads-float": (_set(f"{R}.num_threads", 1.5), "num_threads"),
    "num_threads-bool": (_set(f"{R}.num_threads", True), "num_threads"),
    "num_threads-list": (_set(f"{R}.num_threads", [1]), "num_threads"),
    "delegate-unknown": (_set(f"{R}.delegate", "gpu"), "delegate"),
    "delegate-number": (_set(f"{R}.delegate", 5), "delegate"),
    "option-unknown": (_set(f"{R}.bogus", 1), "bogus"),
    "device-number": (_set(f"{R}.device", 5), "device"),
    # labels
    "labels-number": (_set("labels", 5), "labels"),
    "labels-missing-file": (_set("labels", "nope.txt"), "labels"),
    "labels-directory": (_set("labels", "."), "labels"),
    "labels-count": (_three_labels, "3 labels"),
    "labels-binary": (_labels_binary, "labels"),
}

# Labels read from outside the bundle (and published with every result), or not covered by the sha256 list.
LABEL_PATH_CASES: dict[str, tuple[Callable[[Path, dict], None], str]] = {
    "labels-absolute": (_labels_outside, "labels"),
    "labels-dotdot": (_labels_dotdot, "labels"),
    "labels-symlink-out": (_symlink_labels_out, "labels"),
    "labels-edited-not-hashed": (_labels_edited, "labels"),
    "labels-unlisted-file": (_labels_unlisted, "labels"),
}


def _tampered(cpu_bundle: Path, tmp_path: Path, change) -> Path:
    b = tmp_path / "bundle" / "demo-cpu"
    shutil.copytree(cpu_bundle, b)
    m = json.loads((b / "edgekit.json").read_text())
    change(b, m)
    (b / "edgekit.json").write_text(json.dumps(m))
    return b


def _run(capsys, b: Path, *extra: str):
    return edgekit(capsys, "run", str(b), "--camera", "synthetic:64x64", "--max-frames", "3", "--quiet", *extra)


@pytest.mark.parametrize("case", sorted(CASES))
def test_tampered_bundle_is_refused(tmp_path, capsys, cpu_bundle, case):
    change, needle = CASES[case]
    b = _tampered(cpu_bundle, tmp_path, change)
    before = snapshot(tmp_path)
    assert_refused(_run(capsys, b), needle)
    assert_nothing_left(before, tmp_path)


@pytest.mark.parametrize("case", sorted(LABEL_PATH_CASES))
def test_bundle_labels_outside_or_unhashed_is_refused(tmp_path, capsys, cpu_bundle, case):
    change, needle = LABEL_PATH_CASES[case]
    b = _tampered(cpu_bundle, tmp_path, change)
    result = _run(capsys, b, "--json", "--every", "0")
    assert "secret" not in result.out and "evil" not in result.out, "a label from outside the bundle was published"
    assert_refused(result, needle)


@pytest.mark.parametrize("text", ["", "{ not json", "[1, 2]", "null", '"edgekit"', "\xff\xfe", "[" * 100000,
                                  '{"format_version": 1e400}', '{"format_version": 1, "target": "cpu"}'])
def test_corrupt_manifest_text(tmp_path, capsys, cpu_bundle, text):
    b = tmp_path / "b"
    shutil.copytree(cpu_bundle, b)
    (b / "edgekit.json").write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff\xfe" else b"\xff\xfe")
    assert_refused(_run(capsys, b), "")


def test_manifest_is_a_directory(tmp_path, capsys, cpu_bundle):
    b = tmp_path / "b"
    shutil.copytree(cpu_bundle, b)
    (b / "edgekit.json").unlink()
    (b / "edgekit.json").mkdir()
    assert_refused(_run(capsys, b), "edgekit.json")


def test_manifest_symlinked_out(tmp_path, capsys, cpu_bundle):
    b = tmp_path / "b"
    shutil.copytree(cpu_bundle, b)
    (b / "edgekit.json").unlink()
    (b / "edgekit.json").symlink_to("/etc/passwd")
    assert_refused(_run(capsys, b), "")


def test_bundle_path_is_a_file(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    assert_refused(_run(capsys, f), "")


def test_missing_variant(tmp_path, capsys, cpu_bundle):
    assert_refused(_run(capsys, Path(f"{cpu_bundle}:int4")), "int4")


@pytest.mark.parametrize("flags,needle", [
    (("--threads", "0"), "--threads"),
    (("--threads", "100000"), "num_threads"),
    (("--threads", "x"), "--threads"),
    (("--delegate", "gpu"), "--delegate"),
    (("--backend", "nope"), "--backend"),
    (("--backend", "onnxruntime", "--providers", "cuda"), ""),
    (("--device", "usb:0"), "--device"),
    (("--top-k", "0"), "--top-k"),
    (("--max-frames", "0"), "--max-frames"),
    (("--labels", "/nonexistent/labels.txt"), "labels"),
])
def test_bad_run_flag(capsys, cpu_bundle, flags, needle):
    assert_refused(_run(capsys, cpu_bundle, *flags), needle)
