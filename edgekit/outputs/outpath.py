"""Output files a user names (``--json-file``, ``bench --csv``/``--plot``): checked before the
work starts and opened as regular files only.

A mistyped output path used to surface only when the result was written, after a benchmark of
minutes (``NotADirectoryError`` for ``report.txt/out.csv``), and ``open(path, "w")`` on a FIFO
with no reader blocks for ever. :func:`check_output_file` says either in one line up front;
:func:`open_output` opens with ``O_NONBLOCK`` (a FIFO without a reader fails at once instead of
waiting) and checks the descriptor it holds before truncating anything.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import TextIO

from edgekit.errors import OutputError, UsageError
from edgekit.util.safe_open import file_kind

_FIX_FOLDER = "give a path in an existing, writable folder"


def check_output_file(path: str | Path, flag: str) -> None:
    """Raise a one-line error unless ``path`` can be written as a regular file.

    A directory, FIFO, socket or device at ``path``, a path that runs through a file, or a
    folder that does not exist is the user's to fix (exit 2); a folder that refuses writing is
    the world's (exit 1).
    """
    p = Path(path)
    try:
        kind = file_kind(p.stat().st_mode)
    except FileNotFoundError:
        kind = ""
    except NotADirectoryError:
        kind = ""  # a component is a file: said below, naming it
    if kind:
        raise UsageError(f"{flag} {p} is {kind}, not a regular file", "name a regular file (or a new one)")
    for folder in (p.parent, *p.parent.parents):  # the nearest ancestor that exists
        if folder.exists():
            break
    else:
        folder = Path(".")
    if not folder.is_dir():
        raise UsageError(f"{flag} {p}: {folder} is a file, not a folder", _FIX_FOLDER)
    if folder != p.parent:
        raise UsageError(f"{flag} {p}: the folder {p.parent} does not exist", _FIX_FOLDER)
    if not os.access(folder, os.W_OK):
        raise OutputError(f"{flag} {p}: cannot write to {folder}", _FIX_FOLDER)


def open_output(path: str | Path, flag: str) -> TextIO:
    """``path`` opened for writing text (created or truncated), refusing anything but a regular
    file without ever blocking on one. The caller closes it."""
    check_output_file(path, flag)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO made since the check, with no reader
            raise UsageError(f"{flag} {path} is a FIFO (named pipe), not a regular file",
                             "name a regular file (or a new one)") from exc
        raise OutputError(f"{flag} {path}: cannot write it: {exc.strerror or exc}", _FIX_FOLDER) from exc
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind:  # swapped in since the check, or a FIFO with a reader: never written into
            raise UsageError(f"{flag} {path} is {kind}, not a regular file", "name a regular file (or a new one)")
        os.ftruncate(fd, 0)  # only now: truncating is for regular files
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
