"""Detached bundle signatures: ``edgekit.sig`` beside ``edgekit.json``, over the manifest's bytes.

The manifest already lists the sha256 of every file, so one Ed25519 signature over it covers the
whole bundle; a bundle keeps its layout and any tool that copies a folder ships it unchanged. The
signature file is JSON: the key's id, the manifest's sha256 (for people; the signature covers the
manifest itself) and the base64 signature of ``DOMAIN + manifest bytes`` (the prefix keeps an
edgekit signature from ever verifying as anything else signed with the same key).

:func:`verify_bundle` is what a device and ``edgekit verify`` accept: a signature by one of the
trusted keys, every file matching its sha256 (:func:`edgekit.bundle.load_bundle`), and no file in
the folder that the manifest does not list besides the signature itself. Signatures verify with
``cryptography`` when it is installed, else with PyNaCl (the lean ``[fleet]`` extra of a device).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.bundle import MANIFEST, MAX_MANIFEST_BYTES, Bundle, load_bundle
from edgekit.errors import BackendUnavailable, BundleError, OutputError
from edgekit.fleet.keys import PublicKey, key_id, load_private_key, public_of
from edgekit.util.safe_open import read_regular

SIGNATURE = "edgekit.sig"
DOMAIN = b"edgekit bundle signature v1\n"
MAX_SIGNATURE_BYTES = 64 << 10
FORMAT = 1
_SIGN_FIX = "sign it with: edgekit sign BUNDLE --key KEY"


class SignatureError(BundleError):
    """A signature that is missing, malformed, by a key not trusted, or not over this manifest."""


@dataclass(frozen=True)
class Verified:
    """A bundle that passed :func:`verify_bundle`: its manifest's sha256 (the version) and the key."""

    bundle: Bundle
    sha256: str
    key_id: str
    key_path: str


def _verify_cryptography(public: bytes, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except InvalidSignature:
        return False
    return True


def _verify_nacl(public: bytes, signature: bytes, message: bytes) -> bool:
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    try:
        VerifyKey(public).verify(message, signature)
    except BadSignatureError:
        return False
    return True


VERIFIERS: dict[str, Callable[[bytes, bytes, bytes], bool]] = {
    "cryptography": _verify_cryptography, "nacl": _verify_nacl}
"""Ed25519 verifiers by the module they need, in order of preference."""


def verifier() -> Callable[[bytes, bytes, bytes], bool]:
    """The first verifier whose library imports."""
    import importlib.util

    for name, verify in VERIFIERS.items():
        if importlib.util.find_spec(name) is not None:
            return verify
    raise BackendUnavailable("verifying bundle signatures needs PyNaCl or cryptography",
                             "pip install 'edgekit-vision[fleet]'")


def sign_bundle(path: str | Path, key_path: str | Path) -> tuple[str, str]:
    """Write ``path/edgekit.sig`` for the manifest as it is now; returns (manifest sha256, key id).

    The bundle is loaded first (every sha256 checked, a bundle rejected at build time refused):
    a signature vouches for what the manifest lists, so it is made only over files that match.
    """
    path = Path(path)
    load_bundle(path)
    private = load_private_key(key_path)
    manifest = _read_limited(path / MANIFEST, MAX_MANIFEST_BYTES, "its manifest")
    kid = key_id(public_of(private))
    doc = signature_document(manifest, private.sign(DOMAIN + manifest), kid)
    tmp = path / f".{SIGNATURE}.tmp-{os.getpid()}"
    try:
        tmp.write_bytes(doc)
        os.replace(tmp, path / SIGNATURE)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path / SIGNATURE}: {exc.strerror or exc}", "check the folder's permissions"
                          ) from exc
    return hashlib.sha256(manifest).hexdigest(), kid


def signature_document(manifest: bytes, signature: bytes, kid: str) -> bytes:
    """The bytes of an ``edgekit.sig`` file."""
    doc = {"format": FORMAT, "algorithm": "ed25519", "key_id": kid,
           "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
           "signature": base64.b64encode(signature).decode("ascii")}
    return (json.dumps(doc, indent=2) + "\n").encode()


def parse_signature(data: bytes, origin: str) -> tuple[str, bytes]:
    """(key id, 64 signature bytes) of an ``edgekit.sig`` document; SignatureError when malformed."""
    fix = "sign the bundle again: edgekit sign BUNDLE --key KEY"
    if len(data) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"{origin} is over {MAX_SIGNATURE_BYTES >> 10} KiB, not an edgekit signature", fix)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise SignatureError(f"{origin} is not a signature file (not JSON)", fix) from exc
    if not isinstance(doc, dict) or doc.get("algorithm") != "ed25519" or doc.get("format") != FORMAT:
        raise SignatureError(f"{origin} is not an edgekit Ed25519 signature of format {FORMAT}", fix)
    kid, text = doc.get("key_id"), doc.get("signature")
    if not isinstance(kid, str) or not isinstance(text, str):
        raise SignatureError(f"{origin} lacks key_id or signature", fix)
    try:
        signature = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SignatureError(f"{origin}: its signature is not base64", fix) from exc
    if len(signature) != 64:
        raise SignatureError(f"{origin}: its signature is {len(signature)} bytes, not 64", fix)
    return kid[:40], signature


def verify_manifest(manifest: bytes, signature_file: bytes, trusted: list[PublicKey], origin: str) -> PublicKey:
    """The trusted key whose signature ``signature_file`` is over ``manifest``; SignatureError if none.

    Every trusted key is tried, not only the one the file names: the id is a hint, the signature
    the proof (a key's id could be given wrongly, never its signature)."""
    kid, signature = parse_signature(signature_file, origin)
    verify = verifier()
    for key in sorted(trusted, key=lambda k: k.key_id != kid):  # the named key first: usually the one
        if verify(key.raw, signature, DOMAIN + manifest):
            return key
    ids = ", ".join(k.key_id for k in trusted)
    if any(k.key_id == kid for k in trusted):
        raise SignatureError(f"{origin} does not match the manifest (the manifest or the signature was changed)",
                             "push or copy the bundle again, or sign it again")
    raise SignatureError(f"{origin} is by key {kid}, which is not trusted here (trusted: {ids})",
                         "sign with a trusted key, or add its .pub to the trusted keys (key rotation)")


def verify_bundle(path: str | Path, trusted: list[PublicKey], allow_rejected: bool = False) -> Verified:
    """Check a bundle folder as a device accepts it; raises BundleError (SignatureError) saying why not."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not path.is_dir():
        raise BundleError(f"bundle {path} does not exist", "give the bundle folder")
    manifest = _read_limited(manifest_path, MAX_MANIFEST_BYTES, "its manifest")
    try:
        signature = _read_limited(path / SIGNATURE, MAX_SIGNATURE_BYTES, "its signature")
    except BundleError as exc:
        if not os.path.lexists(path / SIGNATURE):
            raise SignatureError(f"bundle {path} is not signed (no {SIGNATURE})", _SIGN_FIX) from exc
        raise
    key = verify_manifest(manifest, signature, trusted, str(path / SIGNATURE))
    bundle = load_bundle(path, allow_rejected=allow_rejected)  # every listed file against its sha256
    sha = hashlib.sha256(manifest).hexdigest()
    if hashlib.sha256(_read_limited(manifest_path, MAX_MANIFEST_BYTES, "its manifest")).hexdigest() != sha:
        raise BundleError(f"{manifest_path} changed while it was being checked", "check it again")
    if extra := unlisted_files(path, bundle.manifest):
        raise BundleError(f"bundle {path} holds files its manifest does not list: {', '.join(extra[:5])}"[:300],
                          "remove them: a signed bundle carries only what it lists")
    return Verified(bundle, sha, key.key_id, key.path)


def unlisted_files(path: Path, manifest: dict[str, Any]) -> list[str]:
    """Entries under ``path`` that are neither listed in ``files`` nor the manifest or signature
    (a directory counts only through what it holds; anything but a regular file or folder counts)."""
    listed = set(manifest.get("files", {})) | {MANIFEST, SIGNATURE}
    extra = []
    for root, dirs, files in os.walk(path):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            rel = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
            if rel not in listed:
                extra.append(rel)
    return sorted(extra)


def _read_limited(path: Path, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of a regular file (never through a symlink); BundleError otherwise."""
    fix = _SIGN_FIX if path.name == SIGNATURE else "give a bundle folder edgekit build wrote"
    try:
        data = read_regular(path, limit, follow=False)
    except OSError as exc:
        raise BundleError(f"{path} ({what}) cannot be read: {exc.strerror or exc}", fix) from exc
    if len(data) > limit:
        raise BundleError(f"{path} ({what}) is over {limit >> 10} KiB", "rebuild the bundle")
    return data
