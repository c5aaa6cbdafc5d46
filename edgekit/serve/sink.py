"""The JSON-lines results file of ``edgekit serve``: whole lines only, even on a full disk.

Every record is one ``os.write`` of one encoded line to a file opened with ``O_APPEND``. A
write can still stop part-way (the disk fills in the middle of a line: ``write`` returns a
short count, the next one raises ``ENOSPC``); the file is then truncated back to where the
line began, so a JSON-lines reader never meets a torn line and the next record never gets
glued onto half of this one. Records that could not be written are counted (``failed``) and
the sink reports itself unhealthy (``healthy``, ``last_error``) until a write succeeds again,
which ``/healthz`` shows.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from edgekit.errors import OutputError, UsageError
from edgekit.util.finite_json import to_json

log = logging.getLogger("edgekit.serve")

_TAIL_CHUNK = 4096


def last_newline_end(fd: int, size: int) -> int:
    """Offset just after the last ``\\n`` in the first ``size`` bytes of ``fd`` (0 when none)."""
    end = size
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        chunk = os.pread(fd, end - start, start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


class JsonLinesSink:
    """Append JSON lines to stdout (``"-"``), nowhere (``""``) or a file rotated at ``max_bytes``.

    Rotation keeps ``backups`` older files (``file.1`` is the newest); with ``backups=0`` the
    file is truncated instead, so the disk use is bounded by ``max_bytes * (backups + 1)``.
    A file moved or removed under us is noticed (device/inode check) and recreated on the next
    write. A file that ends in a torn line when opened (power loss) is cut back to its last
    whole line.

    Counters: ``lines`` written, ``failed`` records that could not be written, ``errors``
    (kept as an alias of ``failed``). ``healthy`` is False from a failed write until the next
    successful one; ``last_error`` says why. Thread-safe; ``write`` never raises for I/O errors.

    Raises OutputError (exit 1) at construction when the file cannot be created (its folder is a file,
    no permission): a configuration problem, reported before the daemon starts.
    """

    def __init__(self, target: str = "-", max_bytes: int = 10_000_000, backups: int = 3):
        self.target = target
        self.max_bytes = max_bytes
        self.backups = backups
        self.lines = 0
        self.failed = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._identity = (0, 0)
        if target not in ("-", ""):
            try:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                self._open()
            except OSError as exc:
                # mkdir says "File exists" when a part of the folder path is a file: say which
                blocker = next((p for p in Path(target).parents if p.exists()), None)
                not_a_folder = blocker is not None and not blocker.is_dir()
                why = f"{blocker} is not a folder" if not_a_folder else exc.strerror or exc
                error = UsageError if not_a_folder else OutputError  # a path to fix (2), or a disk that refuses (1)
                raise error(f"cannot write results to {target}: {why}",
                                 "give [output] jsonl a file in a writable folder ('-' for stdout)") from exc

    @property
    def errors(self) -> int:
        """Records that could not be written (the name older stats used)."""
        return self.failed

    @property
    def healthy(self) -> bool:
        """False while results cannot be written (from a failed write to the next good one)."""
        return not self.last_error

    def state(self) -> dict[str, Any]:
        """The /stats ``output`` entry: target, counts, health and the last error."""
        return {"target": self.target, "lines": self.lines, "failed": self.failed,
                "healthy": int(self.healthy), "last_error": self.last_error}

    # ------------------------------------------------------------------ file handling
    def _open(self) -> None:
        fd = os.open(self.target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            st = os.fstat(fd)
            size = st.st_size
            if size:  # a torn last line left by a crash or power loss: drop it, keep whole lines
                good = _good_end(self.target, size)
                if good != size:
                    os.ftruncate(fd, good)
                    log.warning("results file %s ended in a partial line (%d bytes); cut back to the last "
                                "whole line", self.target, size - good)
                    size = good
        except OSError:
            os.close(fd)
            raise
        self._fd, self._size, self._identity = fd, size, (st.st_dev, st.st_ino)

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):  # closing after a failed write may fail again
                os.close(self._fd)
            self._fd = None

    def _still_ours(self) -> bool:
        """Whether the path still names the open file (logrotate or a user may have moved or
        removed it; writes would then vanish into an unlinked file without any error)."""
        try:
            st = os.stat(self.target)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def _rotate(self) -> None:
        self._close_fd()
        if self.backups == 0:
            os.truncate(self.target, 0)
        else:
            for i in range(self.backups - 1, 0, -1):
                older = Path(f"{self.target}.{i}")
                if older.exists():
                    os.replace(older, f"{self.target}.{i + 1}")
            if Path(self.target).exists():
                os.replace(self.target, f"{self.target}.1")
        self._open()

    def _write_whole(self, data: bytes) -> None:
        """Write all of ``data`` or none of it (the file is cut back to where it began)."""
        assert self._fd is not None
        start, done = self._size, 0
        try:
            while done < len(data):
                n = os.write(self._fd, data[done:])
                if n == 0:  # a zero-byte write would loop forever: treat it as a full disk
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += n
        except OSError:
            if done:
                try:
                    os.ftruncate(self._fd, start)
                except OSError as cut:
                    log.error("cannot cut %s back to its last whole line: %s", self.target, cut)
                    self._close_fd()  # reopening repairs the tail (see _open)
            raise
        self._size = start + done

    def _write_file(self, data: bytes) -> None:
        if self._fd is not None and not self._still_ours():
            log.warning("results file %s was moved or removed; reopening it", self.target)
            self._close_fd()
        if self._fd is None:
            self._open()
        if self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        self._write_whole(data)

    # ------------------------------------------------------------------ API
    def write(self, record: Any) -> bool:
        """Write one record as a whole line; False (counted in ``failed``) when it could not be.

        ``record``: a :class:`~edgekit.serve.record.ResultRecord` (its own ``to_json``, the one
        encoder of a result) or a dict (an object event, a Python caller's)."""
        if self.target == "":
            return True
        line = record.to_json() if hasattr(record, "to_json") else to_json(record)
        data = (line + "\n").encode("utf-8")
        with self._lock:
            try:
                if self.target == "-":
                    _write_stdout(data)
                else:
                    self._write_file(data)
            except (OSError, ValueError) as exc:  # ValueError: write to a closed stdout
                self._failed(exc)
                return False
            self.lines += 1
            if self.last_error:
                log.warning("results file %s is writable again (%d results could not be written)",
                            self.target, self.failed)
                self.last_error = ""
            return True

    def _failed(self, exc: Exception) -> None:
        self.failed += 1
        if not self.last_error:  # one line per episode, not one per frame
            log.warning("cannot write results to %s: %s (counting the results lost until it works again)",
                        self.target, getattr(exc, "strerror", None) or exc)
        self.last_error = str(getattr(exc, "strerror", None) or exc)

    def close(self) -> None:
        """Close the file (stdout is left open)."""
        with self._lock:
            self._close_fd()


def _good_end(path: str, size: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return last_newline_end(fd, size)
    finally:
        os.close(fd)


def _write_stdout(data: bytes) -> None:
    buffer = getattr(sys.stdout, "buffer", None)  # a replaced stdout (tests, notebooks) may be text only
    if buffer is not None:
        sys.stdout.flush()
        buffer.write(data)
        buffer.flush()
    else:
        sys.stdout.write(data.decode("utf-8"))
        sys.stdout.flush()
