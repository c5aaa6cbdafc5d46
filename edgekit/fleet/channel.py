"""The store's layout and the channel pointer.

::

    PREFIX/versions/<sha256 of edgekit.json>/edgekit.json, edgekit.sig, <every file it lists>
    PREFIX/channels/<channel>.json      {"version": "<sha256>", ...}: written last

A version is named by its manifest's sha256, and the manifest lists the sha256 of every file, so
a version's files never change under its name. A channel is one small object naming a version;
``edgekit push`` writes it after the version's files and ``edgekit promote`` rewrites it, so a
device that reads it never finds a half-uploaded version. The pointer is not signed: it only picks
*which* signed version runs (the store's write access decides that); what may run at all is
decided by the signature each device checks.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from edgekit.errors import UsageError

POINTER_FORMAT = 1
MAX_POINTER_BYTES = 64 << 10
_CHANNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_VERSION = re.compile(r"[0-9a-f]{64}\Z")


class PointerError(Exception):
    """A channel object that is not a pointer this edgekit reads."""


def check_channel(name: str, what: str = "--channel") -> str:
    """``name`` when it is a channel name (letters, digits, '.', '_', '-'; at most 64); else UsageError."""
    if not isinstance(name, str) or not _CHANNEL.match(name):
        raise UsageError(f"{what} {name!r} is not a channel name",
                         "use letters, digits, '.', '_' and '-' (e.g. stable, canary, site-7)")
    return name


def is_version(text: str) -> bool:
    """Whether ``text`` is a version name (64 lower-case hex digits)."""
    return isinstance(text, str) and bool(_VERSION.match(text))


def version_dir(version: str) -> str:
    """The folder of a version under the prefix."""
    return f"versions/{version}"


def channel_object(channel: str) -> str:
    """The pointer object of a channel under the prefix."""
    return f"channels/{check_channel(channel)}.json"


@dataclass(frozen=True)
class Pointer:
    """What a channel object says; ``digest`` is the sha256 of its bytes (a rewrite of the same
    version is a new digest: promoting a refused version again makes devices try it again)."""

    channel: str
    version: str
    digest: str
    bundle: str = ""
    target: str = ""
    key_id: str = ""
    pushed_at: str = ""


def make_pointer(channel: str, version: str, manifest: dict[str, Any], key_id: str) -> bytes:
    """The bytes of a channel object pointing at ``version`` (what the manifest says, for people)."""
    if not is_version(version):
        raise UsageError(f"{version!r} is not a version (the sha256 of a manifest)", "see: edgekit versions")
    doc = {"format": POINTER_FORMAT, "channel": check_channel(channel), "version": version,
           "bundle": str(manifest.get("name", ""))[:100], "target": str(manifest.get("target", ""))[:40],
           "task": str(manifest.get("task") or "classify")[:40], "key_id": key_id,
           "pushed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return (json.dumps(doc, indent=2) + "\n").encode()


def parse_pointer(data: bytes, channel: str) -> Pointer:
    """The :class:`Pointer` in a channel object's bytes; PointerError saying what is wrong."""
    if len(data) > MAX_POINTER_BYTES:
        raise PointerError(f"the pointer of channel {channel} is over {MAX_POINTER_BYTES >> 10} KiB")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise PointerError(f"the pointer of channel {channel} is not JSON") from exc
    if not isinstance(doc, dict) or doc.get("format") != POINTER_FORMAT:
        raise PointerError(f"the pointer of channel {channel} is not of format {POINTER_FORMAT} "
                           "(written by a newer edgekit?)")
    version = doc.get("version")
    if not is_version(version):
        raise PointerError(f"the pointer of channel {channel} names no version ({str(version)[:80]!r})")

    def text(key: str) -> str:
        value = doc.get(key)
        return value[:100] if isinstance(value, str) and value.isprintable() else ""

    return Pointer(channel, version, hashlib.sha256(data).hexdigest(), text("bundle"), text("target"),
                   text("key_id"), text("pushed_at"))
