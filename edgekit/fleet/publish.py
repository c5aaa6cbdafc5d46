"""HOST: pushing versions and moving channels in an S3-compatible store, with boto3.

The one module of :mod:`edgekit.fleet` that a device never imports (tests/house/test_boundaries.py
holds it to that): boto3 brings the whole credential chain (environment, profiles, SSO, instance
roles), ``AWS_ENDPOINT_URL`` for MinIO or SeaweedFS, retries and multipart uploads of large files.

``push`` uploads a version's files, then its manifest and signature, then (with a channel) the
channel's pointer, so a reader of the pointer finds the whole version. Files already there with
the same size and sha256 (object metadata) are not sent again. A version's name is its manifest's
sha256: pushing the same bundle twice lands in the same place; only its signature may be replaced
(a bundle signed again with another key).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.bundle import MANIFEST, MAX_MANIFEST_BYTES, load_bundle
from edgekit.errors import EXIT_RUNTIME, BackendUnavailable, EdgekitError, UsageError, first_line
from edgekit.fleet.channel import (
    MAX_POINTER_BYTES,
    PointerError,
    channel_object,
    is_version,
    make_pointer,
    parse_pointer,
    version_dir,
)
from edgekit.fleet.keys import PublicKey, load_private_key, public_of
from edgekit.fleet.signature import (
    MAX_SIGNATURE_BYTES,
    SIGNATURE,
    SignatureError,
    parse_signature,
    sign_bundle,
    verify_bundle,
    verify_manifest,
)
from edgekit.fleet.store import Location, parse_location

HOST_EXTRA = "pip install 'edgekit-vision[fleet-host]'"


class StoreFailed(EdgekitError):
    """The store refused or could not be reached (exit 1: the command was right, the store was not)."""

    exit_code = EXIT_RUNTIME


@dataclass
class Bucket:
    """boto3 on one ``s3://BUCKET/PREFIX``."""

    location: Location
    client: Any

    @classmethod
    def open(cls, dest: str, what: str = "DEST") -> Bucket:
        location = parse_location(dest, what)
        if location.scheme != "s3":
            raise UsageError(f"{what} {dest}: a web server is read-only for edgekit", "push to s3://BUCKET/PREFIX")
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise BackendUnavailable("pushing to an object store needs boto3", HOST_EXTRA) from exc
        client = boto3.client("s3")
        if "amazonaws.com" not in client.meta.endpoint_url:  # MinIO, SeaweedFS: path-style addressing
            client = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))
        return cls(location, client)

    def key(self, *parts: str) -> str:
        return self.location.key(*parts)

    def call(self, what: str, method: str, **kwargs: Any) -> Any:
        """``client.method(Bucket=..., **kwargs)`` with boto3's errors as one line."""
        try:
            return getattr(self.client, method)(Bucket=self.location.bucket, **kwargs)
        except Exception as exc:  # botocore's ClientError, EndpointConnectionError, NoCredentialsError, ...
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(what) from exc
            raise StoreFailed(f"{what} in s3://{self.location.bucket}: {first_line(exc)}",
                              "check AWS_ENDPOINT_URL, the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                              "AWS_PROFILE) and that the bucket exists") from exc

    def read(self, key: str, limit: int) -> bytes | None:
        """A small object's bytes (None when it does not exist)."""
        try:
            body = self.call(f"reading {key}", "get_object", Key=key)["Body"]
        except FileNotFoundError:
            return None
        return body.read(limit + 1)

    def write(self, key: str, data: bytes, content_type: str = "application/json") -> None:
        self.call(f"writing {key}", "put_object", Key=key, Body=data, ContentType=content_type,
                  Metadata={"sha256": hashlib.sha256(data).hexdigest()})

    def upload(self, key: str, path: Path, digest: str) -> bool:
        """Upload a file unless the same bytes are there already; True when sent."""
        try:
            head = self.call(f"looking at {key}", "head_object", Key=key)
            if head.get("ContentLength") == path.stat().st_size and head.get("Metadata", {}).get("sha256") == digest:
                return False
        except FileNotFoundError:
            pass
        try:
            extra = {"Metadata": {"sha256": digest}, "ContentType": "application/octet-stream"}
            self.client.upload_file(str(path), self.location.bucket, key, ExtraArgs=extra)
        except Exception as exc:
            raise StoreFailed(f"uploading {key}: {first_line(exc)}", "check the store and the credentials") from exc
        return True

    def names(self, folder: str) -> list[tuple[str, Any]]:
        """(key, object) of everything under ``folder/`` of the prefix."""
        out, token = [], None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self.call(f"listing {folder}", "list_objects_v2", Prefix=self.key(folder) + "/", **extra)
            out += [(o["Key"], o) for o in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return out


def push(bundle: str | Path, dest: str, channel: str | None, key_path: str) -> dict[str, Any]:
    """Sign (if needed), upload a version, then point ``channel`` at it; what was done, for printing."""
    path = Path(bundle)
    load_bundle(path)  # every sha256, a bundle rejected at build time refused: never uploaded
    if channel is not None:
        channel_object(channel)  # a bad name fails before anything is uploaded
    own = PublicKey(str(key_path), public_of(load_private_key(key_path)))
    resigned = ""
    try:
        verified = verify_bundle(path, [own])
    except SignatureError:
        resigned = _signed_before(path, own)
        sign_bundle(path, key_path)
        verified = verify_bundle(path, [own])
    store = Bucket.open(dest)
    version, files = verified.sha256, verified.bundle.manifest["files"]
    sent = sum(store.upload(store.key(version_dir(version), name), path / name, digest)
               for name, digest in sorted(files.items()))
    store.write(store.key(version_dir(version), MANIFEST), (path / MANIFEST).read_bytes())
    store.write(store.key(version_dir(version), SIGNATURE), (path / SIGNATURE).read_bytes())
    previous = ""
    if channel is not None:
        previous = _pointed(store, channel)
        store.write(store.key(channel_object(channel)), make_pointer(channel, version, verified.bundle.manifest,
                                                                     verified.key_id))
    size = sum((path / name).stat().st_size for name in files)
    return {"version": version, "bundle": verified.bundle.manifest.get("name", path.name), "files": len(files),
            "sent": sent, "bytes": size, "key_id": verified.key_id, "signed": bool(resigned) or None,
            "was": resigned, "channel": channel, "previous": previous, "dest": str(store.location)}


def _signed_before(path: Path, own: PublicKey) -> str:
    """How the bundle was signed before ``push`` signed it with ``own`` (for the note it prints)."""
    try:
        kid = parse_signature((path / SIGNATURE).read_bytes(), SIGNATURE)[0]
    except FileNotFoundError:
        return "it was not signed"
    except (OSError, SignatureError):
        return "its signature could not be read"
    return f"it was signed by key {kid}" if kid != own.key_id else "its signature did not match its manifest"


def _pointed(store: Bucket, channel: str) -> str:
    """The version ``channel`` names now ('' when it has no pointer or an unreadable one)."""
    data = store.read(store.key(channel_object(channel)), MAX_POINTER_BYTES)
    try:
        return parse_pointer(data, channel).version if data is not None else ""
    except PointerError:
        return ""


def versions(dest: str) -> dict[str, Any]:
    """Every version (name, target, task, key, size, push time) and what each channel points at."""
    store = Bucket.open(dest)
    found: dict[str, dict[str, Any]] = {}
    for key, obj in store.names("versions"):
        version, _, name = key[len(store.key("versions")) + 1:].partition("/")
        if not is_version(version):
            continue
        entry = found.setdefault(version, {"version": version, "bytes": 0, "pushed": ""})
        entry["bytes"] += obj.get("Size", 0)
        if name == MANIFEST:
            entry["pushed"] = obj["LastModified"].strftime("%Y-%m-%d %H:%M:%S")
    channels = {}
    for key, _obj in store.names("channels"):
        name = key.rsplit("/", 1)[-1].removesuffix(".json")
        channels[name] = _pointed(store, name)
    for version, entry in found.items():
        entry.update(_describe(store, version))
        entry["channels"] = sorted(c for c, v in channels.items() if v == version)
    ordered = sorted(found.values(), key=lambda e: e["pushed"], reverse=True)
    return {"dest": str(store.location), "versions": ordered, "channels": channels}


def _describe(store: Bucket, version: str) -> dict[str, Any]:
    manifest = store.read(store.key(version_dir(version), MANIFEST), MAX_MANIFEST_BYTES) or b""
    signature = store.read(store.key(version_dir(version), SIGNATURE), MAX_SIGNATURE_BYTES)
    try:
        doc = json.loads(manifest) if hashlib.sha256(manifest).hexdigest() == version else {}
    except ValueError:
        doc = {}
    try:
        kid = parse_signature(signature, SIGNATURE)[0] if signature is not None else ""
    except SignatureError:
        kid = "?"
    return {"name": str(doc.get("name", "?")), "target": str(doc.get("target", "?")),
            "task": str(doc.get("task") or "classify") if doc else "?", "key_id": kid, "complete": bool(doc) and
            signature is not None, "manifest": doc}


def promote(version: str, dest: str, channel: str, trusted: list[PublicKey] | None = None) -> dict[str, Any]:
    """Point ``channel`` at ``version`` (a full sha256 or a unique prefix of 6+ digits) after checking
    the version is whole in the store (and, with ``trusted``, signed by one of those keys)."""
    store = Bucket.open(dest)
    channel_object(channel)
    version = _resolve(store, version)
    manifest = store.read(store.key(version_dir(version), MANIFEST), MAX_MANIFEST_BYTES)
    signature = store.read(store.key(version_dir(version), SIGNATURE), MAX_SIGNATURE_BYTES)
    if manifest is None or hashlib.sha256(manifest).hexdigest() != version:
        raise UsageError(f"version {version[:12]} has no intact {MANIFEST} in {store.location}",
                         "push the bundle again: edgekit push BUNDLE ...")
    if signature is None:
        raise UsageError(f"version {version[:12]} is not signed in {store.location}", "push it with --key KEY")
    kid = parse_signature(signature, SIGNATURE)[0]
    if trusted:
        kid = verify_manifest(manifest, signature, trusted, f"{SIGNATURE} of version {version[:12]}").key_id

    previous = _pointed(store, channel)
    store.write(store.key(channel_object(channel)), make_pointer(channel, version, json.loads(manifest), kid))
    return {"channel": channel, "version": version, "previous": previous, "key_id": kid, "dest": str(store.location)}


def _resolve(store: Bucket, version: str) -> str:
    """A full version name from ``version`` or a unique prefix of it."""
    version = version.strip().lower()
    if is_version(version):
        return version
    if len(version) < 6 or any(c not in "0123456789abcdef" for c in version):
        raise UsageError(f"{version!r} is not a version",
                         "give its sha256 or its first 6+ hex digits (edgekit versions)")
    names = {k[len(store.key("versions")) + 1:].split("/", 1)[0] for k, _ in store.names("versions")}
    matches = sorted(n for n in names if n.startswith(version) and is_version(n))
    if len(matches) != 1:
        raise UsageError(f"{len(matches) or 'no'} versions in {store.location} start with {version}",
                         "give more digits (edgekit versions lists them)")
    return matches[0]
