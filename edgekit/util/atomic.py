"""Writing a file whole or not at all: a temporary file beside it, then a rename."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from edgekit.errors import OutputError, UsageError


def write_text_atomic(path: str | Path, text: str, force: bool = False) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half-written).

    An existing file is kept unless ``force``: a configuration someone edited is not lost to
    a second run of the same command. The file is made readable by all (0644), as
    ``open()`` would with the usual umask; ``mkstemp`` alone makes it 0600.
    """
    path = Path(path)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; not overwriting it", "give --force to replace it, or another path")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: {path.parent} is not a directory", "create the directory first")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write to {path.parent}: {exc.strerror}", "choose a writable directory") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # a full disk, a quota, a read-only remount: nothing was written
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}", "free some space, or choose another path"
                              ) from exc
        raise
    return path
