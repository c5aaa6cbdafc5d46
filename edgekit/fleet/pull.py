"""One version from the store onto the device: checked before its files are fetched, downloaded
into a staging folder (resumable), verified whole, then moved in beside the others.

Order, cheapest refusal first: the manifest must hash to the version's name (the pointer named a
sha256, so a changed manifest is caught before anything is trusted); its signature must be by a
trusted key; its target must be the running bundle's; the files' sizes (HEAD) must fit the size cap
and leave :data:`MIN_FREE_BYTES` free on the disk. Only then are the files fetched, each checked
against its sha256, and the staged folder verified as ``edgekit verify`` does.

:class:`Refused` is the version's fault (untrusted, tampered, missing, too big, another target):
the follower counts it and leaves it until the channel moves. :class:`NoSpace` and
:class:`~edgekit.fleet.store.StoreError` are the moment's fault (a full disk, a store that is down
or slow): tried again later, and a partial download resumes where it stopped.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.bundle import MANIFEST, MAX_MANIFEST_BYTES, sha256_file
from edgekit.errors import BundleError
from edgekit.fleet.channel import version_dir
from edgekit.fleet.keys import PublicKey
from edgekit.fleet.local import VersionsDir
from edgekit.fleet.signature import MAX_SIGNATURE_BYTES, SIGNATURE, SignatureError, verify_bundle, verify_manifest
from edgekit.fleet.store import NotFound, Reader

MIN_FREE_BYTES = 64 << 20  # left free after a download: the device still writes its results and logs
MAX_FILES = 10_000
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")


class Refused(Exception):
    """The version cannot be used here; the message says why (one line)."""


class Missing(Refused):
    """The channel names a version the store does not hold: refused only once it stays missing (a
    mirror or a CDN may copy the channel's pointer before the version it names)."""


class NoSpace(Exception):
    """The disk cannot hold the version now."""


def disk_free(path: Path) -> int:
    """Bytes free for this user on ``path``'s file system."""
    return shutil.disk_usage(path).free


@dataclass
class Fetcher:
    """How versions are fetched: from where, trusting whom, within what size."""

    reader: Reader
    trusted: list[PublicKey]
    max_bytes: int
    free_bytes: Callable[[Path], int] | None = None  # None: disk_free (tests simulate a full disk there)
    stopping: Callable[[], bool] = lambda: False
    progress: Callable[[int], None] = lambda n: None
    last_key: dict[str, str] = field(default_factory=dict)  # version -> id of the key that signed it

    def key(self, version: str, name: str) -> str:
        return self.reader.location.key(version_dir(version), name)

    def fetch(self, vdir: VersionsDir, version: str, running_target: str = "") -> Path:
        """The verified folder of ``version`` under ``vdir`` (downloaded unless already there)."""
        manifest, signature, doc = self.check_remote(version, running_target)
        if vdir.has(version):  # pulled before (a channel moved back): checked again, not fetched again
            try:
                verify_bundle(vdir.path(version), self.trusted)
                return vdir.path(version)
            except BundleError:
                vdir.remove(version)  # damaged on this disk: fetched again below
        staging = vdir.staging_dir(version)
        try:
            self._download(staging, version, doc["files"])
            (staging / MANIFEST).write_bytes(manifest)
            (staging / SIGNATURE).write_bytes(signature)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                shutil.rmtree(staging, ignore_errors=True)  # a full disk hurts every other writer: give it back
                raise NoSpace(f"the disk filled up while downloading version {version[:12]}") from exc
            raise
        try:
            verify_bundle(staging, self.trusted)
        except BundleError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise Refused(exc.message) from exc
        return vdir.install(version)

    def check_remote(self, version: str, running_target: str) -> tuple[bytes, bytes, dict[str, Any]]:
        """The version's manifest and signature bytes and the parsed manifest, each checked."""
        try:
            manifest = self.reader.get(self.key(version, MANIFEST), MAX_MANIFEST_BYTES).body
        except NotFound as exc:
            raise Missing(f"version {version[:12]} is not in the store (the channel points at a missing version)"
                          ) from exc
        if hashlib.sha256(manifest).hexdigest() != version:
            raise Refused(f"its {MANIFEST} in the store does not hash to the version's name (tampered or corrupt)")
        try:
            signature = self.reader.get(self.key(version, SIGNATURE), MAX_SIGNATURE_BYTES).body
        except NotFound as exc:
            raise Refused(f"version {version[:12]} is not signed (no {SIGNATURE} in the store)") from exc
        try:
            self.last_key[version] = verify_manifest(manifest, signature, self.trusted, SIGNATURE).key_id
        except SignatureError as exc:
            raise Refused(exc.message) from exc
        doc = _manifest(manifest)
        target = doc.get("target")
        if running_target and target != running_target:
            raise Refused(f"it is built for target {str(target)[:40]!r}, this device runs {running_target!r}")
        return manifest, signature, doc

    def _download(self, staging: Path, version: str, files: dict[str, str]) -> None:
        sizes = {name: self.reader.head(self.key(version, name)) for name in files}
        total = sum(sizes.values())
        if total > self.max_bytes:
            raise Refused(f"it is {total / 1e6:.1f} MB, over the {self.max_bytes / 1e6:.0f} MB cap "
                          "([model] max_bundle_mb)")
        have = {name: _size(staging / name) or _size(staging / f"{name}.part") for name in files}
        need = sum(max(0, sizes[n] - min(have[n], sizes[n])) for n in files)
        free = (self.free_bytes or disk_free)(staging)
        if free - need < MIN_FREE_BYTES:
            raise NoSpace(f"version {version[:12]} needs {need / 1e6:.1f} MB more and {free / 1e6:.1f} MB are free "
                          f"(at least {MIN_FREE_BYTES >> 20} MiB stay free)")
        for name, digest in files.items():
            done, part = staging / name, staging / f"{name}.part"
            if done.is_file() and done.stat().st_size == sizes[name] and sha256_file(done) == digest:
                continue
            part.parent.mkdir(parents=True, exist_ok=True)
            self.reader.download(self.key(version, name), part, sizes[name], self.stopping, self.progress)
            if sha256_file(part) != digest:
                part.unlink()
                raise Refused(f"{name} in the store does not match its sha256 in {MANIFEST} (tampered or corrupt)")
            part.replace(done)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _manifest(data: bytes) -> dict[str, Any]:
    """The parsed manifest, its ``files`` checked as names a download may create (relative, inside,
    not the manifest or signature themselves); Refused otherwise."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise Refused(f"its {MANIFEST} is not JSON") from exc
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not 0 < len(files) <= MAX_FILES:
        raise Refused(f"its {MANIFEST} is not an edgekit manifest (no 'files')")
    for name, digest in files.items():
        if not safe_name(name) or not isinstance(digest, str) or not _DIGEST.match(digest):
            raise Refused(f"its {MANIFEST} lists a file this device will not write: {str(name)[:80]!r}")
    return doc


def safe_name(name: Any) -> bool:
    """A relative POSIX path of plain parts (no '', '.', '..', backslash, NUL or control character)."""
    if not isinstance(name, str) or not 0 < len(name) <= 1000 or name in (MANIFEST, SIGNATURE):
        return False
    if name.startswith("/") or "\\" in name or not name.isprintable() or name.endswith(".part"):
        return False
    return all(part not in ("", ".", "..") and len(part) <= 255 for part in name.split("/"))
