"""Ed25519 key pairs: files, modes, ids, and the public keys a device reads with the stdlib."""

from __future__ import annotations

import os
import stat

import pytest

from edgekit.errors import UsageError
from edgekit.fleet.keys import generate, key_id, load_private_key, public_of, read_public_key, read_trusted


def test_keygen_writes_a_secret_key_0600_and_a_public_key(tmp_path):
    private, public, kid = generate(tmp_path / "keys", "edgekit")
    assert (private.name, public.name) == ("edgekit.key", "edgekit.pub")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert sorted(os.listdir(tmp_path / "keys")) == ["edgekit.key", "edgekit.pub"]  # no temporary file left
    raw = read_public_key(public).raw
    assert len(raw) == 32 and public_of(load_private_key(private)) == raw and kid == key_id(raw) and len(kid) == 16


def test_an_existing_key_is_kept_unless_forced(tmp_path):
    private, _, kid = generate(tmp_path, "k")
    with pytest.raises(UsageError, match="not overwriting a key"):
        generate(tmp_path, "k")
    assert generate(tmp_path, "k", force=True)[2] != kid


def test_the_public_key_reads_as_openssl_would_write_it(tmp_path):
    from cryptography.hazmat.primitives import serialization

    _, public, _ = generate(tmp_path, "k")
    loaded = serialization.load_pem_public_key(public.read_bytes())
    raw = loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert raw == read_public_key(public).raw


@pytest.mark.parametrize("text, words", [
    ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "is a private key"),
    ("hello", "not a PEM public key"),
    ("-----BEGIN PUBLIC KEY-----\n!!!\n-----END PUBLIC KEY-----\n", "not base64"),
    ("-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\n", "not an Ed25519"),
])
def test_what_is_not_an_ed25519_public_key_is_refused_in_one_line(tmp_path, text, words):
    path = tmp_path / "bad.pub"
    path.write_text(text)
    with pytest.raises(UsageError, match=words):
        read_public_key(path)


def test_trusted_keys_must_exist_and_duplicates_count_once(tmp_path):
    _, public, _ = generate(tmp_path, "k")
    assert len(read_trusted([str(public), str(public)])) == 1
    with pytest.raises(UsageError, match="does not exist"):
        read_trusted([str(tmp_path / "missing.pub")])
    with pytest.raises(UsageError, match="no trusted key"):
        read_trusted([])
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="cannot be read"):  # never blocks on a FIFO
        read_trusted([str(fifo)])


def test_a_private_key_of_another_kind_is_refused(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "ec.key"
    path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(UsageError, match="not an Ed25519 key"):
        load_private_key(path)
