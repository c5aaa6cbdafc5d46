"""The MQTT queue's file (``[mqtt] queue_file``): its records, and reading one back without trust.

One record a line:

- ``{"seq": n, "node": "<device>@<install id>", "topic": ..., "payload": ..., "qos": 1,
  "retain": false}``: a message queued (``payload_b64`` for bytes) by the node named (see
  :mod:`edgekit.serve.node`; a record of an older edgekit has no ``node`` and counts as this one's);
- ``{"done": n}``: every message up to ``n`` is settled (acknowledged by the broker, or dropped).

Reading trusts nothing and is bounded: only the newest ``MAX_READ_BYTES`` of the file are read (a
queue of ``queue_size`` results is a few MB; a file of 180 MB is not one we wrote in one outage,
and was read whole before), a line over ``MAX_LINE`` bytes is skipped without being held, at
most about twice ``size`` records are held while reading; torn lines, lines that are not JSON or
not a record of the shapes above are skipped and counted. Skipping the head of the file is safe:
a ``done`` mark settles only records written before it.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import UsageError
from edgekit.util.safe_open import file_kind

Item = tuple[str, Any, int, bool]  # topic, payload (str or bytes), qos, retain
MAX_LINE = 4 << 20  # a record longer than this is not one of ours (a result is a few kB)
MAX_READ_BYTES = 64 << 20  # the newest this much of a file is read back
_RECORD_KEYS = {"seq", "topic", "qos", "retain"}


@dataclass
class QueueContents:
    """What a queue file holds that is not settled yet."""

    items: list[tuple[int, Item]] = field(default_factory=list)  # (seq, message) of this node, oldest first
    foreign: Counter[str] = field(default_factory=Counter)  # other nodes' messages not replayed, by node
    foreign_items: list[tuple[int, Item]] = field(default_factory=list)  # those messages (replayed on request)
    skipped: int = 0  # unreadable records
    dropped: int = 0  # beyond the queue's size: the oldest
    last_seq: int = 0  # the highest sequence number met: new records go above it
    done: int = 0  # the settled prefix
    unread_bytes: int = 0  # the head of a file over MAX_READ_BYTES, not read


def record_line(seq: int, item: Item, node: str = "") -> bytes:
    """One message as a line of the file (``node`` "" = an untagged record, as before node ids)."""
    topic, payload, qos, retain = item
    record: dict[str, Any] = {"seq": seq, **({"node": node} if node else {}), "topic": topic, "qos": qos,
                              "retain": retain}
    if isinstance(payload, (bytes, bytearray)):
        record["payload_b64"] = base64.b64encode(payload).decode("ascii")
    else:
        record["payload"] = payload
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def parse_record(line: bytes) -> tuple[int, Item, str] | int | None:
    """One line of a queue file: ``(seq, item, node)`` for a message (node "" when untagged), an
    int for a ``done`` mark, None for anything else (a torn line, garbage, a foreign shape)."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    if record.keys() == {"done"}:
        done = record["done"]
        return done if type(done) is int and done >= 0 else None
    node = record.pop("node", "")
    if record.keys() - {"payload", "payload_b64"} != _RECORD_KEYS or len(record) != len(_RECORD_KEYS) + 1:
        return None
    seq, topic, qos, retain = record["seq"], record["topic"], record["qos"], record["retain"]
    if not (type(seq) is int and seq > 0 and type(qos) is int and qos in (1, 2) and type(retain) is bool
            and isinstance(topic, str) and 0 < len(topic) <= 1024 and not any(c in topic for c in "+#\0")
            and isinstance(node, str) and len(node) <= 512):
        return None
    payload = record.get("payload")
    if "payload_b64" in record:
        try:
            payload = base64.b64decode(record["payload_b64"], validate=True)
        except (ValueError, TypeError):
            return None
    if not isinstance(payload, (str, bytes)):
        return None
    return seq, (topic, payload, qos, retain), node


def read_queue_file(fd: int, size: int, node: str = "", replay_foreign: bool = False) -> QueueContents:
    """The messages of a queue file not yet settled, oldest first, at most ``size`` (the newest).
    A record tagged with another node than ``node`` is counted in ``foreign`` and not returned in
    ``items`` unless ``replay_foreign``; untagged records, and all of them when ``node`` is "", are
    this node's."""
    out = QueueContents()
    records: dict[int, tuple[Item, str]] = {}
    with os.fdopen(os.dup(fd), "rb") as f:
        total = f.seek(0, os.SEEK_END)
        out.unread_bytes = max(0, total - MAX_READ_BYTES)
        f.seek(out.unread_bytes)
        if out.unread_bytes:
            f.readline(MAX_LINE + 1)  # the rest of a line the cut went through
        for line in _lines(f, out):
            parsed = parse_record(line)
            if parsed is None:
                out.skipped += 1 if line.strip() else 0
            elif isinstance(parsed, int):
                out.done = max(out.done, parsed)
            else:
                seq, item, writer = parsed
                out.last_seq = max(out.last_seq, seq)
                records[seq] = (item, writer)
                if len(records) > 2 * max(size, 1):  # bounded while reading: keep the newest
                    for old in sorted(records)[:len(records) - size]:
                        del records[old]
    live = [(seq, *records[seq]) for seq in sorted(records) if seq > out.done]
    out.dropped = max(0, len(live) - size)
    for seq, item, writer in live[out.dropped:]:
        if not node or not writer or writer == node:
            out.items.append((seq, item))
        else:
            out.foreign[writer] += 1
            if replay_foreign:
                out.foreign_items.append((seq, item))
    if replay_foreign:  # in sequence order with this node's own
        out.items = sorted(out.items + out.foreign_items)
    return out


def _lines(f: Any, out: QueueContents):
    """The file's lines, each at most MAX_LINE bytes; a longer one is skipped (and counted) unread."""
    while True:
        line = f.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # skip the rest of an overlong line
                line = f.readline(MAX_LINE)
            out.skipped += 1
            continue
        yield line


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` (a zero-byte write, which would loop for ever, is a full disk)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}  # the disk, not the configuration


def open_file(path: str, flags: int, what: str) -> int:
    """Open ``path`` (created 0600), refusing anything but a regular file, in one line; a full or
    read-only disk raises the OSError itself (the caller goes on in memory)."""
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno in FULL:
            raise
        kind = "a symbolic link" if exc.errno == errno.ELOOP else "a FIFO or socket" if exc.errno == errno.ENXIO else ""
        reason = f"is {kind}, not a regular file" if kind else f"cannot be opened: {exc.strerror}"
        raise UsageError(f"{what} {path} {reason}", "give a file path in a directory the daemon's user may write "
                         "(e.g. /var/lib/edgekit/mqtt-queue.jsonl under the shipped unit)") from exc
    kind = file_kind(os.fstat(fd).st_mode)
    if kind:
        os.close(fd)
        raise UsageError(f"{what} {path} is {kind}, not a regular file", "give a file path")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def fsync_directory(path: str) -> None:
    """Make a rename durable (the directory entry), where the platform allows it."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
