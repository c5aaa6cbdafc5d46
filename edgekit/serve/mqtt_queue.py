"""The MQTT publisher's queue of unsent messages: bounded, in memory, and optionally on disk.

While the broker is unreachable, QoS >= 1 messages wait here (at most ``size``; a full queue
drops the oldest or the newest, as ``policy`` says) and are replayed oldest first on the next
connect, before anything newer. With a ``path`` (``[mqtt] queue_file``) the queue is also an
append-only JSON-lines file, so a daemon restart (an update, a crash, a power cut) does not lose
it: the next daemon loads it and sends it first.

The file, one record a line:

- ``{"seq": n, "topic": ..., "payload": ..., "qos": 1, "retain": false}``: a message queued;
- ``{"done": n}``: every message up to ``n`` is settled: the broker acknowledged it (PUBACK /
  PUBCOMP, paho's ``on_publish``), or a full queue dropped it.

A message handed to paho on replay stays in the file until the broker acknowledges it, so one
that was in flight when the daemon stopped is sent again by the next one (QoS 1 is at least
once; the file records the settled prefix, so a message acknowledged while an older one is
still in flight is sent again with it). When every message is settled the file is truncated
to nothing; when dropped and settled records make it more than twice the size of what is
still waiting (and over 1 MiB) it is rewritten (a temporary file, fsync, rename). Only an
outage writes to it: while the broker is reachable messages go straight out and the file
stays empty (an SD card is not worn by it).

fsync policy: every record is one ``write`` (O_APPEND) to the page cache at once, so a daemon
that is killed or restarted loses nothing; the file is fsync'ed at most once a second while
messages are queued (``FSYNC_INTERVAL_S``) and on close, so a power cut loses at most about the
last second of the queue. ``done`` records are never fsync'ed: losing one means a duplicate.

Reading it back trusts nothing: a torn last line (a power cut in the middle of a write), lines
that are not JSON or not a record of the shape above, lines over ``MAX_LINE`` bytes are skipped
and counted in one warning, never an error; records beyond ``size`` drop the oldest. A path
that is not a regular file (a FIFO, a directory, a symlink) or is used by another daemon (a
lock on ``<path>.lock``) is refused at start in one line.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections import Counter, OrderedDict, deque
from typing import Any

from edgekit.errors import UsageError
from edgekit.util.safe_open import file_kind

log = logging.getLogger("edgekit.serve")

Item = tuple[str, Any, int, bool]  # topic, payload (str or bytes), qos, retain
FSYNC_INTERVAL_S = 1.0
MAX_LINE = 4 << 20  # a record longer than this is not one of ours (a result is a few kB)
COMPACT_MIN_BYTES = 1 << 20
_RECORD_KEYS = {"seq", "topic", "qos", "retain"}


class MessageQueue:
    """Messages waiting for the broker, oldest first (thread-safe: paho's thread acknowledges).

    Args:
        size: the most messages kept (0: none).
        policy: ``drop_oldest`` or ``drop_newest`` when it is full.
        path: the file that keeps the queue across restarts ("" = memory only).
    """

    def __init__(self, size: int, policy: str = "drop_oldest", path: str = ""):
        self.size, self.policy, self.path = size, policy, path
        self._lock = threading.Lock()
        self._items: deque[tuple[int, Item, int]] = deque()  # (seq, item, bytes in the file)
        self._topics: Counter[str] = Counter()  # of what waits in _items
        self._unsettled: OrderedDict[int, tuple[Item, int]] = OrderedDict()  # replayed, not yet acknowledged
        self._mids: dict[int, int] = {}  # paho message id -> seq
        self._seq = self._done = 0
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._file_bytes = self._live_bytes = 0
        self._synced = 0.0
        self.write_errors = 0
        self.loaded = 0  # messages the previous daemon left, sent first
        if path:
            self._open(path)

    def __len__(self) -> int:
        return len(self._items)

    def count(self, topic: str) -> int:
        """How many waiting messages are for ``topic`` (results, say, beside state messages)."""
        with self._lock:
            return self._topics[topic]

    # ------------------------------------------------------------------ queue
    def peek(self) -> Item:
        """The oldest waiting message (the queue must not be empty)."""
        with self._lock:
            return self._items[0][1]

    def append(self, item: Item) -> int:
        """Queue a message; returns how many messages the bound dropped (0 or 1)."""
        with self._lock:
            if len(self._items) >= self.size:
                if self.policy == "drop_newest" or not self._items:
                    return 1
                seq, old, nbytes = self._items.popleft()
                self._topics[old[0]] -= 1
                self._live_bytes -= nbytes
                self._settle_front()
                dropped = 1
            else:
                dropped = 0
            self._seq += 1
            nbytes = self._write_record(self._seq, item)
            self._items.append((self._seq, item, nbytes))
            self._topics[item[0]] += 1
            self._live_bytes += nbytes
            return dropped

    def sent(self, mid: int) -> None:
        """The oldest message was handed to paho as message ``mid``: it leaves the queue, and
        the file keeps it until :meth:`acknowledged` (memory only: it is forgotten now)."""
        with self._lock:
            seq, item, nbytes = self._items.popleft()
            self._topics[item[0]] -= 1
            if self._fd is None:
                return
            self._unsettled[seq] = (item, nbytes)
            self._mids[mid] = seq

    def acknowledged(self, mid: int) -> None:
        """The broker acknowledged paho's message ``mid`` (any message: unknown ids are ignored)."""
        with self._lock:
            seq = self._mids.pop(mid, None)
            if seq is None:
                return
            _, nbytes = self._unsettled.pop(seq)
            self._live_bytes -= nbytes
            self._settle_front()

    def settled(self) -> bool:
        """Nothing waits and nothing replayed awaits its acknowledgement."""
        with self._lock:
            return not self._items and not self._unsettled

    # ------------------------------------------------------------------ the file
    def _open(self, path: str) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        self._lock_fd = _open_file(f"{path}.lock", flags, "[mqtt] queue_file lock")
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self.close()
            raise UsageError(f"[mqtt] queue_file {path} is in use by another process ({exc.strerror})",
                             "give each edgekit serve its own queue_file") from exc
        try:
            fd = _open_file(path, flags, "[mqtt] queue_file")
        except UsageError:
            self.close()
            raise
        try:
            items, skipped = read_queue_file(fd, self.size)
        finally:
            os.close(fd)
        if skipped:
            log.warning("MQTT queue %s: skipped %d unreadable records (a torn last line is what a power cut "
                        "leaves); the rest is kept", path, skipped)
        self.loaded = len(items)
        for item in items:
            self._seq += 1
            self._items.append((self._seq, item, 0))
            self._topics[item[0]] += 1
        try:
            self._rewrite()  # a clean file: what was skipped or settled is gone
        except OSError as exc:
            self.close()
            raise UsageError(f"[mqtt] queue_file {path} cannot be rewritten: {exc.strerror or exc}",
                             "check the directory's permissions and free space") from exc
        if items:
            log.info("MQTT queue %s: %d messages from the last run are sent first", path, len(items))

    def _write_record(self, seq: int, item: Item) -> int:
        """Append one record (called with the lock held); returns its size, 0 when not on disk."""
        if self._fd is None:
            return 0
        line = _record_line(seq, item)
        if not self._append(line):
            return 0
        now = time.monotonic()
        if now - self._synced >= FSYNC_INTERVAL_S:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                self._write_failed(exc)
            self._synced = now
        return len(line)

    def _append(self, line: bytes) -> bool:
        """One whole line at the end of the file, or none: a partial write (a full disk) is cut
        back, so the next record does not run into it."""
        try:
            _write_all(self._fd, line)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._file_bytes)
            self._write_failed(exc)
            return False
        self._file_bytes += len(line)
        return True

    def _settle_front(self) -> None:
        """Write the new ``done`` mark (called with the lock held): every seq below the oldest
        message still waiting or unacknowledged is settled; truncate or compact the file."""
        if self._fd is None:
            return
        low = next(iter(self._unsettled), None) or (self._items[0][0] if self._items else self._seq + 1)
        if low - 1 <= self._done:
            return
        self._done = low - 1
        try:
            if not self._items and not self._unsettled:
                os.ftruncate(self._fd, 0)
                self._file_bytes = self._live_bytes = 0
                return
        except OSError as exc:
            self._write_failed(exc)
            return
        if not self._append(json.dumps({"done": self._done}).encode() + b"\n"):
            return
        if self._file_bytes > max(COMPACT_MIN_BYTES, 2 * self._live_bytes):
            try:
                self._rewrite()
            except OSError as exc:  # the appended file is still whole: only larger than it needs to be
                self._write_failed(exc)

    def _rewrite(self) -> None:
        """Replace the file by the messages still live (temporary file, fsync, rename); raises OSError."""
        tmp = f"{self.path}.tmp"
        live = [(seq, item) for seq, (item, _) in self._unsettled.items()] + \
               [(seq, item) for seq, item, _ in self._items]
        lines = [_record_line(seq, item) for seq, item in live]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a leftover of a crash during the last rewrite
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, b"".join(lines))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        _fsync_directory(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._file_bytes = self._live_bytes = sum(len(line) for line in lines)
        sizes = dict(zip((seq for seq, _ in live), map(len, lines)))
        self._items = deque((seq, item, sizes[seq]) for seq, item, _ in self._items)
        self._unsettled = OrderedDict((seq, (item, sizes[seq])) for seq, (item, _) in self._unsettled.items())
        self._done = live[0][0] - 1 if live else self._seq

    def _write_failed(self, exc: Exception) -> None:
        self.write_errors += 1
        if self.write_errors == 1 or self.write_errors % 1000 == 0:  # a full disk must not flood the journal
            log.warning("MQTT queue %s: cannot write (%s; %d errors): the queue is kept in memory meanwhile",
                        self.path, getattr(exc, "strerror", None) or exc, self.write_errors)

    def close(self) -> None:
        """fsync and close the file (what is still queued stays in it for the next start)."""
        with self._lock:
            waiting = len(self._items) + len(self._unsettled)
            fd, self._fd = self._fd, None
            lock_fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            try:
                os.fsync(fd)
            except OSError as exc:
                log.warning("MQTT queue %s: fsync failed at close: %s", self.path, exc)
            os.close(fd)
            if waiting:
                log.info("MQTT queue %s: %d messages kept for the next start", self.path, waiting)
        if lock_fd is not None:
            os.close(lock_fd)  # releases the flock


def _record_line(seq: int, item: Item) -> bytes:
    topic, payload, qos, retain = item
    record: dict[str, Any] = {"seq": seq, "topic": topic, "qos": qos, "retain": retain}
    if isinstance(payload, (bytes, bytearray)):
        record["payload_b64"] = base64.b64encode(payload).decode("ascii")
    else:
        record["payload"] = payload
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def parse_record(line: bytes) -> tuple[int, Item] | int | None:
    """One line of a queue file: ``(seq, item)`` for a message, an int for a ``done`` mark,
    None for anything else (the file is untrusted: a torn line, garbage, a foreign record)."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    if record.keys() == {"done"}:
        done = record["done"]
        return done if type(done) is int and done >= 0 else None
    if record.keys() - {"payload", "payload_b64"} != _RECORD_KEYS or len(record) != len(_RECORD_KEYS) + 1:
        return None
    seq, topic, qos, retain = record["seq"], record["topic"], record["qos"], record["retain"]
    if not (type(seq) is int and seq > 0 and type(qos) is int and qos in (1, 2) and type(retain) is bool
            and isinstance(topic, str) and 0 < len(topic) <= 1024 and not any(c in topic for c in "+#\0")):
        return None
    payload = record.get("payload")
    if "payload_b64" in record:
        try:
            payload = base64.b64decode(record["payload_b64"], validate=True)
        except (ValueError, TypeError):
            return None
    if not isinstance(payload, (str, bytes)):
        return None
    return seq, (topic, payload, qos, retain)


def read_queue_file(fd: int, size: int) -> tuple[list[Item], int]:
    """The messages of a queue file not yet settled, oldest first, at most ``size`` (the newest
    ones), and how many records were skipped as unreadable."""
    records: dict[int, Item] = {}
    done = skipped = 0
    with os.fdopen(os.dup(fd), "rb") as f:
        f.seek(0)
        while True:
            line = f.readline(MAX_LINE + 1)
            if not line:
                break
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # skip the rest of an overlong line
                    line = f.readline(MAX_LINE)
                skipped += 1
                continue
            parsed = parse_record(line)
            if parsed is None:
                skipped += 1 if line.strip() else 0
            elif isinstance(parsed, int):
                done = max(done, parsed)
            else:
                records[parsed[0]] = parsed[1]
    items = [records[seq] for seq in sorted(records) if seq > done]
    if len(items) > size:
        log.warning("MQTT queue: %d messages on disk, queue_size is %d: the oldest %d are dropped",
                    len(items), size, len(items) - size)
        items = items[len(items) - size:] if size else []
    return items, skipped


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _open_file(path: str, flags: int, what: str) -> int:
    """Open ``path`` (created 0600), refusing anything but a regular file, in one line."""
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
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


def _fsync_directory(path: str) -> None:
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
