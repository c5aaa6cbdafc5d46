"""Ed25519 signing keys: generated and loaded on the host with ``cryptography``; public keys read
with the standard library, so a device needs no key-handling library to know whom it trusts.

Files are PEM, as OpenSSL writes them: ``NAME.key`` is the private key (PKCS#8, unencrypted,
mode 0600, written through a temporary file and a rename so it is never half there or briefly
world-readable) and ``NAME.pub`` its public key (SubjectPublicKeyInfo). A key's id is the first 16
hex digits of the sha256 of its 32 raw bytes: a signature names the key that made it, and logs
and ``edgekit versions`` name keys by it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import BackendUnavailable, OutputError, UsageError
from edgekit.util.safe_open import read_regular

MAX_KEY_FILE_BYTES = 64 << 10
# DER of an Ed25519 SubjectPublicKeyInfo up to the key itself (RFC 8410): SEQUENCE { SEQUENCE { OID
# 1.3.101.112 }, BIT STRING (33 bytes, no unused bits) }; only the 32 key bytes vary.
SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
HOST_EXTRA = "pip install 'edgekit-vision[fleet-host]'"


@dataclass(frozen=True)
class PublicKey:
    """A trusted public key: where it came from, its 32 raw bytes and its id."""

    path: str
    raw: bytes

    @property
    def key_id(self) -> str:
        return key_id(self.raw)


def key_id(raw: bytes) -> str:
    """The id of a raw Ed25519 public key (16 hex digits of its sha256)."""
    return hashlib.sha256(raw).hexdigest()[:16]


def _crypto() -> Any:
    """``cryptography``'s Ed25519 and serialization modules (host side: keygen and sign)."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise BackendUnavailable("making keys and signatures needs the cryptography package", HOST_EXTRA) from exc
    return ed25519, serialization


def generate(out_dir: str | Path, name: str = "edgekit", force: bool = False) -> tuple[Path, Path, str]:
    """Write ``out_dir/name.key`` (0600) and ``out_dir/name.pub``; returns both paths and the key id.

    An existing key is kept unless ``force``: overwriting a signing key by accident would strand
    every device that trusts only the old one.
    """
    if not name or "/" in name or name.startswith("."):
        raise UsageError(f"--name {name!r} is not a plain file name", "e.g. --name edgekit or --name release-2025")
    ed25519, serialization = _crypto()
    out = Path(out_dir)
    private_path, public_path = out / f"{name}.key", out / f"{name}.pub"
    for path in (private_path, public_path):
        if path.exists() and not force:
            raise UsageError(f"{path} exists; not overwriting a key", "give --force to replace it, or another --name")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {out}: {exc.strerror or exc}", "choose a writable folder") from exc
    private = ed25519.Ed25519PrivateKey.generate()
    secret = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    _write_atomic(private_path, secret, 0o600)
    _write_atomic(public_path, public, 0o644)
    return private_path, public_path, key_id(read_public_key(public_path).raw)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """``data`` to ``path`` via a temporary file in its folder (created 0600 by mkstemp, so a secret
    is never readable by others, not even for a moment) and a rename."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write to {path.parent}: {exc.strerror or exc}", "choose a writable folder") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}", "free some space, or choose another folder"
                              ) from exc
        raise


def load_private_key(path: str | Path) -> Any:
    """The Ed25519 private key in ``path`` (a ``cryptography`` key object)."""
    ed25519, serialization = _crypto()
    data = _read_key_file(path, "--key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--key {path}: not an unencrypted PEM private key ({exc})"[:300],
                         "give the .key file edgekit keygen wrote") from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"--key {path}: a {type(key).__name__}, not an Ed25519 key", "make one with edgekit keygen")
    return key


def public_of(private: Any) -> bytes:
    """The raw 32 public bytes of a ``cryptography`` Ed25519 private key."""
    _ed25519, serialization = _crypto()
    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def read_public_key(path: str | Path, what: str = "--trusted-key") -> PublicKey:
    """An Ed25519 public key from a PEM SubjectPublicKeyInfo file (stdlib only: the device side)."""
    text = _read_key_file(path, what).decode("ascii", "replace")
    begin, end = "-----BEGIN PUBLIC KEY-----", "-----END PUBLIC KEY-----"
    fix = "give the .pub file edgekit keygen wrote (the .key file stays on the signing machine)"
    if "PRIVATE KEY" in text:
        raise UsageError(f"{what} {path} is a private key", fix)
    if begin not in text or end not in text:
        raise UsageError(f"{what} {path} is not a PEM public key", fix)
    body = text.split(begin, 1)[1].split(end, 1)[0]
    try:
        der = base64.b64decode("".join(body.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UsageError(f"{what} {path}: its PEM body is not base64", fix) from exc
    if len(der) != len(SPKI_PREFIX) + 32 or not der.startswith(SPKI_PREFIX):
        raise UsageError(f"{what} {path} is not an Ed25519 public key", "make keys with edgekit keygen")
    return PublicKey(str(path), der[len(SPKI_PREFIX):])


def read_trusted(paths: list[str] | tuple[str, ...], what: str = "--trusted-key") -> list[PublicKey]:
    """Every trusted key (key rotation: the old and the new one side by side); duplicates dropped."""
    keys: dict[bytes, PublicKey] = {}
    for path in paths:
        key = read_public_key(path, what)
        keys.setdefault(key.raw, key)
    if not keys:
        raise UsageError("no trusted key given", f"give {what} PUB (the .pub file of the signing key)")
    return list(keys.values())


def _read_key_file(path: str | Path, what: str) -> bytes:
    try:
        data = read_regular(path, MAX_KEY_FILE_BYTES)
    except FileNotFoundError as exc:
        raise UsageError(f"{what} {path} does not exist", "make a key pair with: edgekit keygen --out DIR") from exc
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be read: {exc.strerror or exc}", "check the path and its permissions"
                         ) from exc
    if len(data) > MAX_KEY_FILE_BYTES:
        raise UsageError(f"{what} {path} is too large for a key file", "give the file edgekit keygen wrote")
    return data
