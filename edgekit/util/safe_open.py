"""Opening a file someone else named, without hanging on it or following it out of bounds.

Every file edgekit reads for a user or from a bundle (model files, labels, anchors, TLS
certificates, configuration files) may be a FIFO, a device or a socket: ``open()`` on a FIFO
with no writer blocks for ever, ``/dev/zero`` never ends, and a symlink in a copied bundle may
point anywhere. :func:`open_regular` opens with ``O_NONBLOCK`` (opening a FIFO returns at once)
and, for bundle files, ``O_NOFOLLOW``, then checks with ``fstat`` on the descriptor it holds
that the file is a regular file, so nothing can be swapped in between the check and the read.

A refusal is a :class:`NotARegularFile`, an ``OSError``: callers that already turn an
unreadable file into their own one-line error (``except OSError``) say it the same way.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotARegularFile(OSError):
    """The path names a directory, FIFO, socket or device, or (``follow=False``) a symlink."""

    def __init__(self, path: str | Path, kind: str):
        super().__init__(errno.EINVAL, f"{path} is {kind}, not a regular file")
        self.kind = kind

    def __str__(self) -> str:
        return str(self.strerror)


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is in words ('a FIFO (named pipe)'), '' for a regular file."""
    if stat.S_ISREG(mode):
        return ""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | Path, follow: bool = True) -> BinaryIO:
    """Open ``path`` for reading in binary mode, refusing anything but a regular file.

    ``follow=False`` also refuses a symlink as the last component (``O_NOFOLLOW``): a bundle's
    files are resolved and checked to lie inside it first, and must not be swapped for a link
    after that. Never blocks on a FIFO. Raises :class:`NotARegularFile` or the ``OSError`` of
    the open (missing, no permission). The caller owns (and closes) the returned file.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:  # O_NOFOLLOW met a symlink
            raise NotARegularFile(path, "a symbolic link") from exc
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing only
            raise NotARegularFile(path, "a socket or device") from exc
        raise
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind:
            raise NotARegularFile(path, kind)
        # reads of a regular file never block; clear the flag so nothing downstream is surprised
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int, follow: bool = True) -> bytes:
    """Up to ``limit + 1`` bytes of the regular file ``path`` (one more than ``limit`` tells the
    caller it is too large without reading all of it). Raises as :func:`open_regular`."""
    with open_regular(path, follow) as f:
        return f.read(limit + 1)


def check_regular(path: str | Path, follow: bool = True) -> None:
    """Raise (as :func:`open_regular`) unless ``path`` opens as a regular file; reads nothing.

    For files a library opens by name later (an SSL context, a runtime): a FIFO would block it.
    """
    open_regular(path, follow).close()
