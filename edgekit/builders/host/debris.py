"""What killed builds leave behind, and its removal by the next build.

A build cleans up after itself on every exit Python sees (an error, Ctrl-C, SIGTERM), but
SIGKILL, the OOM killer or a power cut end it between two instructions: its work directory
``edgekit-build-*`` stays in the system temp dir and a half-written bundle ``.NAME.tmp-*`` (or
a bundle moved aside, ``.NAME.old-PID``) in ``--out``. On a device that loses power they pile
up, and a work directory holds converted models of hundreds of megabytes.

Each carries the PID of the build that made it: a work directory in an owner file inside
(:func:`work_dir`), a bundle's temporary directory in its name (``.NAME.tmp-PID-xxxx``, see
:class:`edgekit.bundle.BundleWriter`). The next build (:func:`sweep`) removes those whose
process is gone and that are older than itself, and says so in one line. A live PID (a build
running now, or a PID reused since) or an entry without a PID (another user's, an older
edgekit's) is never touched: leaving debris is better than removing a running build's files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

WORK_PREFIX = "edgekit-build-"
OWNER = ".edgekit-owner"  # inside a work directory: the PID of the build using it
# .NAME.tmp-PID-random (BundleWriter's mkdtemp) and .NAME.old-PID (a bundle moved aside while replaced)
_BUNDLE_DEBRIS = re.compile(r"^\..+\.(?:tmp-(\d+)-[^/]+|old-(\d+))$")


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (one of another user counts as alive)."""
    if pid <= 0:
        return True  # not a PID we can judge: keep what it owns
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


@contextlib.contextmanager
def work_dir() -> Iterator[str]:
    """A build's temporary work directory (removed at exit), with this process's PID inside so
    that the next build can tell it from a running one's if this one is killed."""
    with tempfile.TemporaryDirectory(prefix=WORK_PREFIX) as work:
        Path(work, OWNER).write_text(f"{os.getpid()}\n")
        yield work


def _owner(path: Path) -> int | None:
    """The PID recorded in a work directory, None when there is none (or it cannot be read)."""
    try:
        return int(Path(path, OWNER).read_text().strip())
    except (OSError, ValueError):
        return None


def _dead_entries(folder: Path, started: float) -> list[Path]:
    """Entries of ``folder`` left by killed builds: a dead PID and older than ``started``."""
    found = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for entry in entries:
        if entry.name.startswith(WORK_PREFIX):
            pid = _owner(entry)
        elif match := _BUNDLE_DEBRIS.match(entry.name):
            pid = int(match.group(1) or match.group(2))
        else:
            continue
        try:
            st = entry.lstat()
        except OSError:
            continue
        if pid is None or pid == os.getpid() or st.st_uid != os.getuid() or st.st_mtime >= started:
            continue
        if not pid_alive(pid):
            found.append(entry)
    return found


def sweep(out: Path | None, log: Any, started: float | None = None) -> list[Path]:
    """Remove what killed builds left in ``out`` and in the system temp dir; one log line
    names it. ``started``: the running build's start (wall clock), nothing newer is touched."""
    started = time.time() if started is None else started
    folders = [Path(tempfile.gettempdir())] + ([Path(out)] if out is not None else [])
    removed = []
    for folder in folders:
        for entry in _dead_entries(folder, started):
            try:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            except OSError:
                continue  # what cannot be removed now stays for the next build
            removed.append(entry)
    if removed:
        names = ", ".join(str(p) for p in removed[:4]) + (f" and {len(removed) - 4} more" if len(removed) > 4 else "")
        log.info(f"removed {len(removed)} leftover(s) of killed builds (their process is gone): {names}")
    return removed
