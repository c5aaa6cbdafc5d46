"""Bundle signatures: a flipped byte in any file, the manifest or the signature is refused; so is a
key not trusted, an unlisted file and a link; key rotation is several trusted keys; both verifiers
(cryptography, PyNaCl) agree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgekit.bundle import MANIFEST
from edgekit.errors import BundleError
from edgekit.fleet import signature
from edgekit.fleet.keys import read_trusted
from edgekit.fleet.signature import SIGNATURE, SignatureError, sign_bundle, verify_bundle


@pytest.fixture
def signed(tmp_path, bundles, keys) -> Path:
    copy = shutil.copytree(bundles["v1"], tmp_path / "b")
    sign_bundle(copy, keys["trusted"][0])
    return copy


def trusted(keys, *names: str):
    return read_trusted([str(keys[n][1]) for n in names or ("trusted",)])


def flip_byte(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_signed_bundle_verifies_and_names_its_key(signed, keys):
    verified = verify_bundle(signed, trusted(keys))
    assert verified.key_path == str(keys["trusted"][1]) and len(verified.sha256) == 64
    doc = json.loads((signed / SIGNATURE).read_text())
    assert doc["key_id"] == verified.key_id and doc["manifest_sha256"] == verified.sha256


def test_a_flipped_byte_in_any_listed_file_is_refused(signed, keys):
    names = list(json.loads((signed / MANIFEST).read_text())["files"])
    assert len(names) >= 2
    for name in names:
        original = (signed / name).read_bytes()
        flip_byte(signed / name)
        with pytest.raises(BundleError, match="does not match its sha256"):
            verify_bundle(signed, trusted(keys))
        (signed / name).write_bytes(original)
    verify_bundle(signed, trusted(keys))


@pytest.mark.parametrize("at", [0.0, 0.5, 0.99])
def test_a_flipped_byte_in_the_manifest_is_refused(signed, keys, at):
    flip_byte(signed / MANIFEST, at)
    with pytest.raises(BundleError):  # the signature no longer matches (or the JSON no longer parses)
        verify_bundle(signed, trusted(keys))


def test_a_flipped_bit_in_the_signature_itself_is_refused(signed, keys):
    import base64

    doc = json.loads((signed / SIGNATURE).read_text())
    for i in (0, 31, 63):
        raw = bytearray(base64.b64decode(doc["signature"]))
        raw[i] ^= 0x01
        (signed / SIGNATURE).write_text(json.dumps({**doc, "signature": base64.b64encode(bytes(raw)).decode()}))
        with pytest.raises(SignatureError, match="does not match the manifest"):
            verify_bundle(signed, trusted(keys))


def test_a_flipped_byte_anywhere_in_the_signature_file_is_refused(signed, keys):
    data = (signed / SIGNATURE).read_bytes()
    accepted = 0
    for i in range(len(data)):
        mutated = bytearray(data)
        mutated[i] ^= 0x01
        (signed / SIGNATURE).write_bytes(bytes(mutated))
        try:
            verify_bundle(signed, trusted(keys))
            accepted += 1
        except BundleError:
            pass
    # only bytes outside the signature that JSON ignores may change (a space, the informational sha256 or key id)
    doc = json.loads(data)
    assert accepted <= len(data) - len(doc["signature"])


def test_a_bundle_signed_by_a_key_not_trusted_is_refused_and_says_which(tmp_path, bundles, keys):
    copy = shutil.copytree(bundles["v1"], tmp_path / "b")
    sign_bundle(copy, keys["stranger"][0])
    with pytest.raises(SignatureError, match="which is not trusted here"):
        verify_bundle(copy, trusted(keys))


def test_key_rotation_is_several_trusted_keys(tmp_path, bundles, keys):
    old = shutil.copytree(bundles["v1"], tmp_path / "old")
    new = shutil.copytree(bundles["v2"], tmp_path / "new")
    sign_bundle(old, keys["trusted"][0])
    sign_bundle(new, keys["rotated"][0])
    both = trusted(keys, "trusted", "rotated")
    assert verify_bundle(old, both).key_path == str(keys["trusted"][1])
    assert verify_bundle(new, both).key_path == str(keys["rotated"][1])
    with pytest.raises(SignatureError):  # the old key retired: what it signed is no longer accepted
        verify_bundle(old, trusted(keys, "rotated"))


def test_an_unsigned_bundle_an_unlisted_file_and_a_link_are_refused(signed, keys, tmp_path):
    (signed / "extra.bin").write_bytes(b"x")
    with pytest.raises(BundleError, match="does not list: extra.bin"):
        verify_bundle(signed, trusted(keys))
    (signed / "extra.bin").unlink()
    (signed / "sub").mkdir()
    (signed / "sub" / "x").write_bytes(b"y")
    with pytest.raises(BundleError, match="sub/x"):
        verify_bundle(signed, trusted(keys))
    shutil.rmtree(signed / "sub")
    (signed / "outside").symlink_to(tmp_path)
    with pytest.raises(BundleError, match="outside"):
        verify_bundle(signed, trusted(keys))
    (signed / "outside").unlink()
    (signed / SIGNATURE).unlink()
    with pytest.raises(SignatureError, match="is not signed"):
        verify_bundle(signed, trusted(keys))


def test_a_signature_file_that_is_a_link_or_not_json_is_refused(signed, keys, tmp_path):
    real = tmp_path / "sig"
    shutil.move(signed / SIGNATURE, real)
    (signed / SIGNATURE).symlink_to(real)
    with pytest.raises(BundleError, match="cannot be read"):
        verify_bundle(signed, trusted(keys))
    (signed / SIGNATURE).unlink()
    (signed / SIGNATURE).write_text("[" * 100000)
    with pytest.raises(BundleError, match="over 64 KiB"):
        verify_bundle(signed, trusted(keys))
    (signed / SIGNATURE).write_text("[" * 1000)
    with pytest.raises(SignatureError, match="not JSON"):
        verify_bundle(signed, trusted(keys))


def test_signing_refuses_a_bundle_whose_files_do_not_match(tmp_path, bundles, keys):
    copy = shutil.copytree(bundles["v1"], tmp_path / "b")
    flip_byte(next(copy.glob("*.tflite")))
    with pytest.raises(BundleError, match="does not match its sha256"):
        sign_bundle(copy, keys["trusted"][0])
    assert not (copy / SIGNATURE).exists()


@pytest.mark.parametrize("name", list(signature.VERIFIERS))
def test_each_verifier_accepts_the_signature_and_refuses_a_changed_one(signed, keys, monkeypatch, name):
    pytest.importorskip(name)
    monkeypatch.setattr(signature, "VERIFIERS", {name: signature.VERIFIERS[name]})
    verify_bundle(signed, trusted(keys))
    flip_byte(signed / MANIFEST, 0.3)
    with pytest.raises(BundleError):
        verify_bundle(signed, trusted(keys))


def test_without_a_verifier_the_install_line_is_named(signed, keys, monkeypatch):
    from edgekit.errors import BackendUnavailable

    monkeypatch.setattr(signature, "VERIFIERS", {"no_such_module_here": signature.VERIFIERS["nacl"]})
    with pytest.raises(BackendUnavailable, match="PyNaCl or cryptography") as info:
        verify_bundle(signed, trusted(keys))
    assert "edgekit-vision[fleet]" in info.value.hint
