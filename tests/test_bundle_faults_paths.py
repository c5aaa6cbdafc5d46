"""Fault catalogue 2 (issue 29), run/serve side: nothing a manifest names leaves the bundle,
no file edgekit reads for a user can hang it, and what can be checked at start is.

A bundle's ``task_options.anchors`` may name only a ``.npy`` listed and hashed in its
``files``, inside it; a FIFO, device, symlink out or ``..`` anywhere a bundle, a labels file,
a TLS file or a configuration is read is one error line, at once. ``task_options.outputs`` is
checked against the model's outputs when the model opens; ``serve --print-config`` loads the
TLS files as the start does; ``inspect`` refuses an adapter outside the allowlist. Each case:
exit 2, one ``error:`` line with a ``fix:``, no traceback, nothing left behind, and (where a
FIFO is involved) an answer within seconds, never a hang.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edgekit.bundle import MANIFEST, BundleWriter, load_bundle
from edgekit.errors import BundleError
from tests.conftest import ROOT
from tests.helpers.detector_model import detector_bundle
from tests.helpers.faults import assert_nothing_left, assert_refused, edgekit, snapshot

ANCHORS = np.float32([[0.5, 0.5, 0.1, 0.1]] * 3)
OPENSSL = shutil.which("openssl")


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory) -> Path:
    """A real LiteRT classifier bundle (5 classes, written by BundleWriter; no build)."""
    from tests.helpers import tflite_models
    from tests.runtime.test_adapters import write_bundle

    d = tmp_path_factory.mktemp("small")
    return write_bundle(d / "small", {"fp32": tflite_models.model_path("small_float", d)})


def _detector(tmp_path: Path, **task_options) -> tuple[Path, dict]:
    """A real ONNX detector bundle (tests/detector_model.py) and its manifest."""
    b = detector_bundle(tmp_path / "det")
    m = json.loads((b / MANIFEST).read_text())
    m["models"][0]["task_options"].update(task_options)
    return b, m


def _save(b: Path, m: dict) -> None:
    """Rehash every listed regular file (a careful attacker) and write the manifest."""
    for name in m["files"]:
        p = b / name
        if p.is_file():
            m["files"][name] = hashlib.sha256(p.read_bytes()).hexdigest()
    (b / MANIFEST).write_text(json.dumps(m))


def _run(capsys, bundle, *extra: str):
    return edgekit(capsys, "run", str(bundle), "--camera", "synthetic:64x64", "--max-frames", "2", "--quiet", *extra)


def within(seconds: float, call, *args):
    """``call(*args)`` in a thread that must finish within ``seconds`` (a FIFO must never hang it)."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = call(*args)
        except BaseException as exc:  # raised again in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s: {args}"
    if "error" in box:
        raise box["error"]
    return box["result"]


# ---- task_options.anchors: a listed, hashed file inside the bundle, or nothing ------------------------------

def _outside_npy(b: Path) -> Path:
    path = b.parent / "outside.npy"
    np.save(path, ANCHORS)
    return path


def _absolute(b: Path, m: dict) -> None:
    m["models"][0]["task_options"]["anchors"] = str(_outside_npy(b))


def _absolute_listed(b: Path, m: dict) -> None:
    path = _outside_npy(b)
    m["models"][0]["task_options"]["anchors"] = m["files"][str(path)] = str(path)


def _dotdot(b: Path, m: dict) -> None:
    _outside_npy(b)
    m["models"][0]["task_options"]["anchors"] = "../outside.npy"
    m["files"]["../outside.npy"] = ""


def _symlink_out(b: Path, m: dict) -> None:
    (b / "anchors.npy").symlink_to(_outside_npy(b))
    m["models"][0]["task_options"]["anchors"] = "anchors.npy"
    m["files"]["anchors.npy"] = ""


def _unlisted(b: Path, m: dict) -> None:
    np.save(b / "anchors.npy", ANCHORS)
    m["models"][0]["task_options"]["anchors"] = "anchors.npy"


def _fifo(b: Path, m: dict) -> None:
    os.mkfifo(b / "anchors.npy")
    m["models"][0]["task_options"]["anchors"] = "anchors.npy"
    m["files"]["anchors.npy"] = "0" * 64


def _device(b: Path, m: dict) -> None:
    (b / "anchors.npy").symlink_to("/dev/zero")
    m["models"][0]["task_options"]["anchors"] = "anchors.npy"
    m["files"]["anchors.npy"] = "0" * 64


def _tampered(b: Path, m: dict) -> None:
    np.save(b / "anchors.npy", ANCHORS)
    m["models"][0]["task_options"]["anchors"] = "anchors.npy"
    m["files"]["anchors.npy"] = "0" * 64  # not its hash: changed after the build


ANCHOR_CASES = {
    "absolute path, not listed": (_absolute, "is not listed in 'files'"),
    "absolute path, listed": (_absolute_listed, "points outside the bundle"),
    "..": (_dotdot, "points outside the bundle"),
    "symlink out of the bundle": (_symlink_out, "points outside the bundle"),
    "inside, not listed": (_unlisted, "is not listed in 'files'"),
    "FIFO": (_fifo, "is not a regular file"),
    "device": (_device, "points outside the bundle"),
    "changed after the build": (_tampered, "does not match its sha256"),
}


@pytest.mark.parametrize("case", ANCHOR_CASES)
def test_anchors_a_manifest_names_never_leave_the_bundle(capsys, tmp_path, case):
    change, words = ANCHOR_CASES[case]
    b, m = _detector(tmp_path)
    change(b, m)
    if case in ("absolute path, not listed", "inside, not listed", "changed after the build"):
        (b / MANIFEST).write_text(json.dumps(m))  # the hashes it holds stay as they are
    else:
        _save(b, m)
    before = snapshot(tmp_path)
    result = within(20, _run, capsys, b)
    line = assert_refused(result, words)
    assert "outside.npy" not in result.out  # nothing read from outside made it to the output
    assert "anchors" in line or "sha256" in line
    assert_nothing_left(before, tmp_path)


def test_anchors_listed_in_the_bundle_are_read_from_it(capsys, tmp_path):
    """The legitimate form: a relative name in ``files``; opening turns it into the bundle file's path."""
    b, m = _detector(tmp_path)
    np.save(b / "anchors.npy", np.float32([[0.5, 0.5]]))  # wrong shape: proves this very file is read
    m["models"][0]["task_options"]["anchors"] = "anchors.npy"
    m["files"]["anchors.npy"] = ""
    _save(b, m)
    assert_refused(_run(capsys, b), "detect anchors must be [N, 4]")
    np.save(b / "anchors.npy", ANCHORS)
    _save(b, m)
    result = _run(capsys, b)
    assert result.code == 0, result.text


def test_the_bundle_writer_takes_an_absolute_anchors_file_in(tmp_path):
    """``edgekit build -T anchors=/data/anchors.npy``: the bundle carries (and hashes) a copy."""
    outside = _outside_npy(tmp_path / "x")
    b = detector_bundle(tmp_path / "det")
    m = json.loads((b / MANIFEST).read_text())
    with BundleWriter(tmp_path / "det2") as w:
        for name in m["files"]:
            shutil.copy(b / name, w.dir / name)
        m["models"][0]["task_options"]["anchors"] = str(outside)
        dest = w.commit({k: v for k, v in m.items() if k not in ("files", "format_version")})
    written = json.loads((dest / MANIFEST).read_text())
    name = written["models"][0]["task_options"]["anchors"]
    assert not os.path.isabs(name) and name in written["files"] and (dest / name).read_bytes() == outside.read_bytes()
    load_bundle(dest)
    os.mkfifo(tmp_path / "fifo.npy")
    with pytest.raises(BundleError, match="not a regular file"), BundleWriter(tmp_path / "det3") as w:
        shutil.copy(b / "model.onnx", w.dir / "model.onnx")
        m["models"][0]["task_options"]["anchors"] = str(tmp_path / "fifo.npy")
        within(10, w.commit, {k: v for k, v in m.items() if k not in ("files", "format_version", "labels")})
    assert not (tmp_path / "det3").exists()


def test_anchors_given_by_the_user_must_be_a_regular_file(capsys, tmp_path):
    b, _m = _detector(tmp_path)
    os.mkfifo(tmp_path / "fifo.npy")
    assert_refused(within(20, _run, capsys, b, "-T", f"anchors={tmp_path / 'fifo.npy'}"), "FIFO")


# ---- every other file: labels, manifest, model ---------------------------------------------------------------

def _fifo_file(name: str):
    def change(b: Path, m: dict) -> None:
        (b / name).unlink()
        os.mkfifo(b / name)

    return change


@pytest.mark.parametrize("name", ["labels.txt", "model.onnx"])
def test_a_fifo_in_place_of_a_bundle_file_is_refused_at_once(capsys, tmp_path, name):
    b, m = _detector(tmp_path)
    _fifo_file(name)(b, m)
    assert_refused(within(20, _run, capsys, b), "not a regular file")


def test_a_fifo_manifest_or_labels_flag_is_refused_at_once(capsys, tmp_path):
    b, m = _detector(tmp_path)
    (b / MANIFEST).unlink()
    os.mkfifo(b / MANIFEST)
    assert_refused(within(20, _run, capsys, b), "not an edgekit bundle")
    os.mkfifo(tmp_path / "labels.fifo")
    result = within(20, _run, capsys, ROOT / "models" / "detector.onnx", "--labels", str(tmp_path / "labels.fifo"))
    assert_refused(result, "FIFO")


# ---- output indices: checked when the model opens ------------------------------------------------------------

@pytest.mark.parametrize(("option", "words"), [
    ("outputs=[5,6]", "name output 6, but the model has 1 output"),
    ("outputs=[]", "outputs is empty"),
])
def test_run_with_detect_outputs_past_the_model_is_one_line(capsys, tmp_path, option, words):
    b, _m = _detector(tmp_path)
    assert_refused(_run(capsys, b, "-T", option), words)


def test_serve_refuses_a_bundle_whose_outputs_point_past_the_model_at_start(capsys, tmp_path):
    """Was: every frame an IndexError, /healthz 503 and the model reopened in a loop."""
    b, m = _detector(tmp_path, outputs=[5, 6])
    _save(b, m)
    before = snapshot(tmp_path)
    result = edgekit(capsys, "serve", str(b), "--camera", "synthetic:64x64", "--max-frames", "3",
                     "--http", "off", "--output", str(tmp_path / "results.jsonl"))
    assert_refused(result, "detect outputs [5, 6]")
    assert_nothing_left(before, tmp_path)


def test_classify_output_index_past_the_model_is_one_line(capsys, small_bundle):
    assert_refused(_run(capsys, small_bundle, "-T", "output_index=3"), "output_index")


# ---- inspect: an adapter outside the allowlist is an error --------------------------------------------------

@pytest.mark.parametrize(("key", "value", "words"), [
    ("adapter", "os:system", "unknown runtime adapter 'os:system'"),
    ("target", "/etc/evil.toml", "is not a shipped target"),
])
def test_inspect_refuses_what_run_would_refuse(capsys, tmp_path, small_bundle, key, value, words):
    b = tmp_path / "b"
    shutil.copytree(small_bundle, b)
    m = json.loads((b / MANIFEST).read_text())
    if key == "adapter":
        m["runtime"]["adapter"] = value
    else:
        m["target"] = value
    (b / MANIFEST).write_text(json.dumps(m))
    assert_refused(edgekit(capsys, "inspect", str(b)), words)
    assert_refused(edgekit(capsys, "inspect", str(b), "--json"), words)


# ---- serve: TLS files and configuration files ----------------------------------------------------------------

@pytest.fixture(scope="module")
def pems(tmp_path_factory) -> dict[str, Path]:
    """Two self-signed certificate/key pairs, an encrypted key and a garbage PEM (openssl)."""
    if OPENSSL is None:
        pytest.skip("needs the openssl command (apt-get install openssl)")
    d = tmp_path_factory.mktemp("pems")
    for n in ("a", "b"):
        subprocess.run([OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d / f"{n}.key",
                        "-out", d / f"{n}.crt", "-days", "2", "-subj", f"/CN={n}"], check=True, capture_output=True)
    subprocess.run([OPENSSL, "rsa", "-in", d / "a.key", "-aes256", "-passout", "pass:x", "-out", d / "enc.key"],
                   check=True, capture_output=True)
    (d / "junk.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    os.mkfifo(d / "fifo.pem")
    return {p.name: p for p in d.iterdir()}


def _tls_config(tmp_path: Path, bundle: Path, **files: Path) -> Path:
    lines = ["[model]", f'path = "{bundle}"', "[camera]", 'uri = "synthetic:64x64"', "[http]", 'listen = ""',
             "[mqtt]", 'host = "127.0.0.1"', "port = 1", "tls = true"]
    lines += [f'{k} = "{v}"' for k, v in files.items()]
    path = tmp_path / "serve.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


TLS_CASES = {
    "garbage CA": ({"ca_file": "junk.pem"}, "[mqtt] ca_file: cannot load it for TLS"),
    "key of another certificate": ({"ca_file": "a.crt", "cert_file": "a.crt", "key_file": "b.key"},
                                   "key values mismatch"),
    "encrypted key": ({"cert_file": "a.crt", "key_file": "enc.key"}, "the key is encrypted"),
    "FIFO CA": ({"ca_file": "fifo.pem"}, "is a FIFO"),
    "FIFO key": ({"cert_file": "a.crt", "key_file": "fifo.pem"}, "is a FIFO"),
}


@pytest.mark.parametrize("case", TLS_CASES)
def test_print_config_loads_the_tls_files_as_the_start_does(capsys, tmp_path, small_bundle, pems, case):
    files, words = TLS_CASES[case]
    config = _tls_config(tmp_path, small_bundle, **{k: pems[v] for k, v in files.items()})
    assert_refused(within(20, edgekit, capsys, "serve", "--config", config, "--print-config"), words)
    before = snapshot(tmp_path)
    # the real start (in this thread: it sets signal handlers): the same line, before anything opens
    result = edgekit(capsys, "serve", "--config", config, "--duration", "1", "--output", str(tmp_path / "out.jsonl"))
    assert_refused(result, words)
    assert_nothing_left(before, tmp_path)


def test_good_tls_files_pass_print_config(capsys, tmp_path, small_bundle, pems):
    config = _tls_config(tmp_path, small_bundle, ca_file=pems["a.crt"], cert_file=pems["a.crt"], key_file=pems["a.key"])
    result = edgekit(capsys, "serve", "--config", config, "--print-config")
    assert result.code == 0, result.text
    assert json.loads(result.out)["mqtt"]["ca_file"] == str(pems["a.crt"])


def test_serve_with_a_fifo_ca_file_exits_at_once_in_a_real_process(tmp_path, small_bundle, pems):
    """Was: blocked at start for ever, ignoring --duration."""
    config = _tls_config(tmp_path, small_bundle, ca_file=pems["fifo.pem"])
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "serve", "--config", str(config), "--duration", "2"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "is a FIFO" in proc.stderr


def test_a_fifo_serve_config_is_one_line(capsys, tmp_path):
    os.mkfifo(tmp_path / "serve.toml")
    assert_refused(within(20, edgekit, capsys, "serve", "--config", tmp_path / "serve.toml", "--print-config"),
                   "config file", "FIFO")
