"""Opening the MQTT queue's file at start: its lock, what the last run left, another node's file
set aside, and a disk too full to rewrite or even create it (the half of
:class:`~edgekit.serve.mqtt.queue.MessageQueue` that runs once, before anything is queued).

Nothing here stops the daemon for want of space: a file that cannot be rewritten is kept as it
is (its own sequence numbers are kept in memory, so what is appended later stays consistent with
it), and one that cannot be opened at all leaves the queue in memory; each in one line. What
does stop it, in one line with a fix, is a path that is not a regular file or a file another
daemon holds (a configuration to fix).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections import Counter

from edgekit.errors import UsageError
from edgekit.serve.mqtt import queue_file
from edgekit.serve.mqtt.queue_file import QueueContents, open_file, read_queue_file, record_line
from edgekit.serve.sink import last_newline_end

log = logging.getLogger("edgekit.serve")

FOREIGN_POLICIES = ("refuse", "replay")  # [mqtt] foreign_queue


class QueueStart:
    """Opening and loading a queue file (a mixin of MessageQueue: it sets up the state that
    class writes to afterwards)."""

    def _open(self, path: str) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self._lock_fd = open_file(f"{path}.lock", flags, "[mqtt] queue_file lock")
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except UsageError:
            self.close()
            raise
        except BlockingIOError as exc:
            self.close()
            raise UsageError(f"[mqtt] queue_file {path} is in use by another process ({exc.strerror})",
                             "give each edgekit serve its own queue_file") from exc
        except OSError as exc:  # a full or read-only disk: no file this run, never a refusal to start
            self._start_in_memory(exc)
            return
        try:
            fd = open_file(path, flags, "[mqtt] queue_file")
            contents = read_queue_file(fd, self.size, self.node, self.foreign == "replay")
        except UsageError:
            self.close()
            raise
        except OSError as exc:
            self._start_in_memory(exc)
            return
        self._fd, st = fd, os.fstat(fd)
        self._identity, self._file_bytes = (st.st_dev, st.st_ino), st.st_size
        self._load(contents)
        self._compact_at_start()

    def _start_in_memory(self, exc: OSError) -> None:
        """The file cannot even be opened (a full or read-only disk): the queue works in memory."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        log.warning("MQTT queue %s cannot be opened (%s): the queue is kept in memory this run, so what it "
                    "holds at a stop is lost; free some space and restart to keep it on disk",
                    self.path, exc.strerror or exc)

    def _load(self, contents: QueueContents) -> None:
        """What the last run left, with its own sequence numbers (the file stays consistent with
        them should it not be rewritten now); each problem of the file in one line."""
        if contents.unread_bytes:
            log.warning("MQTT queue %s: the file is larger than the %g MiB read back; its oldest %.1f MiB are "
                        "not read", self.path, queue_file.MAX_READ_BYTES / (1 << 20),
                        contents.unread_bytes / (1 << 20))
        if contents.skipped:
            log.warning("MQTT queue %s: skipped %d unreadable records (a torn last line is what a power cut "
                        "leaves); the rest is kept", self.path, contents.skipped)
        if contents.dropped:
            log.warning("MQTT queue %s: %d messages on disk, queue_size is %d: the oldest %d are dropped",
                        self.path, contents.dropped + len(contents.items) + sum(contents.foreign.values()),
                        self.size, contents.dropped)
        self._seq, self._done = max(contents.last_seq, contents.done), contents.done
        for seq, item in contents.items:
            self._items.append((seq, item, len(record_line(seq, item, self.node))))  # in the file as it is
            self._topics[item[0]] += 1
        self.loaded = len(contents.items)
        if contents.foreign and self.foreign == "replay":
            log.warning("MQTT queue %s: %d messages written by %s are replayed as this node (%s) "
                        "([mqtt] foreign_queue = \"replay\")", self.path, sum(contents.foreign.values()),
                        _nodes(contents.foreign), self.node)
        elif contents.foreign:
            self._set_aside(contents.foreign)
        if self.loaded:
            log.info("MQTT queue %s: %d messages from the last run are sent first", self.path, self.loaded)

    def _set_aside(self, foreign: Counter[str]) -> None:
        """Another node's records: the file is renamed out of the way (nothing is lost, no space is
        needed), this node's own messages go to a new file."""
        first = next(iter(foreign))
        aside = f"{self.path}.foreign-{re.sub(r'[^A-Za-z0-9_.@-]', '_', first)[:80]}"
        n = 1
        while os.path.lexists(aside if n == 1 else f"{aside}.{n}"):
            n += 1
        aside = aside if n == 1 else f"{aside}.{n}"
        try:
            os.rename(self.path, aside)
        except OSError as exc:  # a read-only disk: leave the file as it is, never rewrite another node's records
            self._forget_file()
            os.close(self._lock_fd)
            self._lock_fd = None
            log.warning("MQTT queue %s: %d messages were written by another node (%s; this is %s) and the file "
                        "cannot be set aside (%s): it is left as it is, not replayed, and this run's queue is kept "
                        "in memory", self.path, sum(foreign.values()), _nodes(foreign), self.node,
                        exc.strerror or exc)
            return
        self.set_aside = aside
        self._forget_file()
        log.warning("MQTT queue %s: %d messages were written by another node (%s; this is %s: a cloned card?) "
                    "and are not sent under its topics; kept in %s (to send them as this device: [mqtt] "
                    "foreign_queue = \"replay\" and move the file back)", self.path, sum(foreign.values()),
                    _nodes(foreign), self.node, aside)

    def _compact_at_start(self) -> None:
        """A clean file (what was skipped or settled gone); on a full disk the file stays as it is,
        cut back to its last whole line (so the next record does not run into a torn one)."""
        if self._lock_fd is None:
            return
        try:
            self._rewrite()
        except OSError as exc:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    self._file_bytes = last_newline_end(self._fd, self._file_bytes)
                    os.ftruncate(self._fd, self._file_bytes)
            self._write_failed(exc, quiet=True)
            kept = "its messages stay in it as they are and are sent first" if self._fd is not None else \
                "this run's messages wait in memory until a write succeeds"
            log.warning("MQTT queue %s cannot be rewritten (%s): %s; the daemon runs on", self.path,
                        exc.strerror or exc, kept)


def _nodes(foreign: Counter[str]) -> str:
    """Other nodes in words: the most frequent first, at most three named."""
    named = [node for node, _ in foreign.most_common(3)]
    return ", ".join(named) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
