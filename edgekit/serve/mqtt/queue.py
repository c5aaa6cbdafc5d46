"""The MQTT publisher's queue of unsent messages: bounded, in memory, and optionally on disk.

While the broker is unreachable, QoS >= 1 messages wait here (at most ``size``; a full queue
drops the oldest or the newest, as ``policy`` says) and are replayed oldest first on the next
connect, before anything newer. With a ``path`` (``[mqtt] queue_file``) the queue is also an
append-only JSON-lines file (:mod:`edgekit.serve.mqtt.queue_file`), so a daemon restart (an
update, a crash, a power cut) does not lose it: the next daemon loads it and sends it first.

A message handed to paho on replay stays in the file until the broker acknowledges it, so one
that was in flight when the daemon stopped is sent again by the next one (QoS 1 is at least
once; the file records the settled prefix). When every message is settled the file is truncated
to nothing; when dropped and settled records make it more than twice the size of what is still
waiting (and over 1 MiB) it is rewritten (a temporary file, fsync, rename). Only an outage writes
to it: while the broker is reachable messages go straight out (an SD card is not worn by it).

What it claims, it keeps. Each message knows whether it is in the file: a record that could not
be written (a full disk) waits in memory and is written as soon as the disk takes it again, and
the count at a stop says exactly how many are on disk and how many only in memory. Before each
write the path is checked to still be the file it opened (device and inode, as the results file
does): a file deleted or replaced during an outage is written anew with everything waiting,
instead of appending to an unlinked inode nobody will read. A full disk never stops the daemon
from starting: a file that cannot be compacted is kept as it is (its messages are sent first),
and one that cannot be created leaves the queue in memory, each said in one line.

Each record carries the node id of the daemon that wrote it (:mod:`edgekit.serve.node`): the
messages of another node (an SD card cloned into a second device) are not replayed under its
topics; the file is set aside as ``<path>.foreign-<node>`` in one line, unless ``foreign`` is
``"replay"`` (``[mqtt] foreign_queue``).

fsync policy: every record is one ``write`` (O_APPEND) to the page cache at once, so a daemon
that is killed or restarted loses nothing; the file is fsync'ed at most once a second while
messages are queued (``FSYNC_INTERVAL_S``) and on close, so a power cut loses at most about the
last second of the queue. ``done`` records are never fsync'ed: losing one means a duplicate.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import Counter, OrderedDict, deque

from edgekit.serve.mqtt.queue_file import MAX_LINE, Item, fsync_directory, record_line, write_all
from edgekit.serve.mqtt.queue_start import FOREIGN_POLICIES, QueueStart

log = logging.getLogger("edgekit.serve")

FSYNC_INTERVAL_S = 1.0
RETRY_S = 1.0  # a full disk or a lost file is tried again at most this often
COMPACT_MIN_BYTES = 1 << 20
__all__ = ["MessageQueue", "FOREIGN_POLICIES", "MAX_LINE", "Item"]


class MessageQueue(QueueStart):
    """Messages waiting for the broker, oldest first (thread-safe: paho's thread acknowledges).

    Args:
        size: the most messages kept (0: none).
        policy: ``drop_oldest`` or ``drop_newest`` when it is full.
        path: the file that keeps the queue across restarts ("" = memory only).
        node: this daemon's node id, written into each record ("" = untagged, no foreign check).
        foreign: ``refuse`` (set another node's file aside) or ``replay`` it as this node's.
    """

    def __init__(self, size: int, policy: str = "drop_oldest", path: str = "", node: str = "",
                 foreign: str = "refuse"):
        self.size, self.policy, self.path, self.node, self.foreign = size, policy, path, node, foreign
        self._lock = threading.Lock()
        self._items: deque[tuple[int, Item, int]] = deque()  # (seq, item, bytes in the file; 0 = memory only)
        self._topics: Counter[str] = Counter()  # of what waits in _items
        self._unsettled: OrderedDict[int, tuple[Item, int]] = OrderedDict()  # replayed, not yet acknowledged
        self._mids: dict[int, int] = {}  # paho message id -> seq
        self._seq = self._done = 0
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._identity = (0, 0)  # (st_dev, st_ino) of the file written
        self._file_bytes = self._live_bytes = 0
        self._synced = self._retry_at = 0.0
        self._behind = False  # some live message is not in the file (a failed write)
        self.write_errors = 0
        self.loaded = 0  # messages the previous daemon left, sent first
        self.set_aside = ""  # where another node's file was put
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
            dropped = 0
            if len(self._items) >= self.size:
                if self.policy == "drop_newest" or not self._items:
                    return 1
                seq, old, nbytes = self._items.popleft()
                self._topics[old[0]] -= 1
                self._live_bytes -= nbytes
                self._settle_front()
                dropped = 1
            self._seq += 1
            nbytes = self._write_record(self._seq, item)
            self._items.append((self._seq, item, nbytes))
            self._topics[item[0]] += 1
            self._live_bytes += nbytes
            if nbytes and self._behind:  # the disk takes records again: write what only memory held
                self._spill()
            return dropped

    def sent(self, mid: int) -> None:
        """The oldest message was handed to paho as message ``mid``: it leaves the queue, and
        the file keeps it until :meth:`acknowledged` (memory only: it is forgotten now)."""
        with self._lock:
            seq, item, nbytes = self._items.popleft()
            self._topics[item[0]] -= 1
            if not self.path or self._lock_fd is None:
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

    def where(self, topics: set[str] | None = None) -> tuple[int, int]:
        """``(on disk, only in memory)`` of the live messages (of ``topics`` only, when given)."""
        with self._lock:
            return self._where(topics)

    def _where(self, topics: set[str] | None) -> tuple[int, int]:
        live = [(item, nbytes) for _, item, nbytes in self._items] + list(self._unsettled.values())
        chosen = [nbytes for item, nbytes in live if topics is None or item[0] in topics]
        on_disk = sum(1 for nbytes in chosen if nbytes)
        return on_disk, len(chosen) - on_disk

    # ------------------------------------------------------------------ writing
    def _write_record(self, seq: int, item: Item) -> int:
        """Append one record (called with the lock held); returns its size, 0 when not on disk."""
        if not self._writable():
            return 0
        line = record_line(seq, item, self.node)
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

    def _writable(self, force: bool = False) -> bool:
        """Whether the file at ``path`` is the one open for writing, making it so when it is not: a
        file deleted or replaced under us is written anew with every live message (at most once
        every ``RETRY_S`` while that fails, e.g. on a full disk)."""
        if not self.path or self._lock_fd is None:
            return False
        if self._fd is not None and self._still_ours():
            return True
        if self._fd is not None:
            log.warning("MQTT queue %s was removed or replaced; its %d waiting messages go to a new file",
                        self.path, len(self._items) + len(self._unsettled))
            self._forget_file()
        now = time.monotonic()
        if now < self._retry_at and not force:
            return False
        self._retry_at = now + RETRY_S
        try:
            self._rewrite()
        except OSError as exc:
            self._write_failed(exc)
            return False
        return True

    def _still_ours(self) -> bool:
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def _forget_file(self) -> None:
        """The open file no longer counts: every live message is in memory only until written again."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._file_bytes, self._live_bytes, self._behind = None, 0, 0, True
        self._items = deque((seq, item, 0) for seq, item, _ in self._items)
        self._unsettled = OrderedDict((seq, (item, 0)) for seq, (item, _) in self._unsettled.items())

    def _append(self, line: bytes) -> bool:
        """One whole line at the end of the file, or none: a partial write (a full disk) is cut
        back, so the next record does not run into it."""
        try:
            write_all(self._fd, line)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._file_bytes)
            self._write_failed(exc)
            return False
        self._file_bytes += len(line)
        return True

    def _spill(self) -> None:
        """Write the live messages only memory holds (oldest first: the reader sorts by sequence
        anyway), stopping at the first failure (called with the lock held)."""
        ok = True

        def written(seq: int, item: Item, nbytes: int) -> int:
            nonlocal ok
            if nbytes or not ok:
                return nbytes
            line = record_line(seq, item, self.node)
            ok = self._append(line)
            self._live_bytes += len(line) if ok else 0
            return len(line) if ok else 0

        unsettled = self._unsettled.items()
        self._unsettled = OrderedDict((seq, (item, written(seq, item, n))) for seq, (item, n) in unsettled)
        self._items = deque((seq, item, written(seq, item, n)) for seq, item, n in self._items)
        self._behind = not ok

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
                self._behind = False
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
        lines = [record_line(seq, item, self.node) for seq, item in live]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a leftover of a crash during the last rewrite
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, b"".join(lines))
            os.fsync(fd)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a full disk: leave no half copy behind
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        fsync_directory(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        if self._fd is not None:
            os.close(self._fd)
        st = os.fstat(fd)
        self._fd, self._identity = fd, (st.st_dev, st.st_ino)
        self._file_bytes = self._live_bytes = sum(len(line) for line in lines)
        sizes = dict(zip((seq for seq, _ in live), map(len, lines)))
        self._items = deque((seq, item, sizes[seq]) for seq, item, _ in self._items)
        self._unsettled = OrderedDict((seq, (item, sizes[seq])) for seq, (item, _) in self._unsettled.items())
        self._done = live[0][0] - 1 if live else self._seq
        self._behind = False

    def _write_failed(self, exc: Exception, quiet: bool = False) -> None:
        self._behind = True
        self.write_errors += 1
        if quiet:
            return
        if self.write_errors == 1 or self.write_errors % 1000 == 0:  # a full disk must not flood the journal
            log.warning("MQTT queue %s: cannot write (%s; %d errors): what cannot be written waits in memory "
                        "and is written once the disk takes it", self.path,
                        getattr(exc, "strerror", None) or exc, self.write_errors)

    # ------------------------------------------------------------------ closing
    def close(self, results: set[str] | None = None) -> None:
        """Write what only memory holds if the disk now takes it, fsync and close the file; say
        exactly what waits on disk for the next start and what is lost (of ``results``, the
        result topics, when given: the count the user cares about)."""
        with self._lock:
            if self._lock_fd is not None and (self._items or self._unsettled) and self._writable(force=True):
                self._spill()
            on_disk, in_memory = self._where(results)
            fd, self._fd = self._fd, None
            lock_fd, self._lock_fd = self._lock_fd, None
        synced = ""
        if fd is not None:
            try:
                os.fsync(fd)
            except OSError as exc:
                synced = f" (fsync failed: {exc.strerror or exc}: a power cut now may lose them)"
            os.close(fd)
        what = "results" if results is not None else "messages"
        if in_memory:
            log.warning("MQTT queue %s: %d %s on disk for the next start%s, %d only in memory and lost with this "
                        "stop (the file could not take them: %d write errors)", self.path, on_disk, what, synced,
                        in_memory, self.write_errors)
        elif on_disk:
            log.info("MQTT queue %s: %d %s kept on disk for the next start%s", self.path, on_disk, what, synced)
        if lock_fd is not None:
            os.close(lock_fd)  # releases the flock
