"""The device's folder of pulled versions.

::

    ROOT/versions/<sha256>/   verified bundles, each as pushed (edgekit.json, edgekit.sig, files)
    ROOT/staging/<sha256>/    a download under way (``*.part`` files resume where they end)
    ROOT/current              symlink to versions/<sha256>: what ``[model] path`` serves
    ROOT/.lock                held by the one daemon using ROOT

``current`` is flipped with a new symlink renamed over the old one, so the hot-swap watcher and a
restart both see one whole version or the other. The folder defaults to the service's
StateDirectory (``$STATE_DIRECTORY``, e.g. /var/lib/edgekit), else ``$XDG_STATE_HOME`` or
~/.local/state/edgekit, then ``fleet/<source>-<channel>``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from edgekit.errors import OutputError, UsageError
from edgekit.fleet.channel import is_version


def default_root(source: str, channel: str, env: Mapping[str, str] | None = None) -> Path:
    """Where a daemon keeps the versions of ``source``'s ``channel`` when ``[model] versions_dir`` is ''."""
    env = os.environ if env is None else env
    state = (env.get("STATE_DIRECTORY") or "").split(":")[0]
    base = Path(state) if state else Path(env.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "edgekit"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{source}-{channel}").strip("_.")[:100]
    return base / "fleet" / slug


class VersionsDir:
    """One daemon's versions folder (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.versions, self.staging, self.current = self.root / "versions", self.root / "staging", self.root / "current"
        self._lock: IO[str] | None = None

    def lock(self) -> None:
        """Create the folder and hold its lock; UsageError when another daemon holds it (two daemons
        flipping one ``current`` would serve each other's versions)."""
        try:
            for folder in (self.versions, self.staging):
                folder.mkdir(parents=True, exist_ok=True)
            handle = open(self.root / ".lock", "a+")  # noqa: SIM115 - held open for the daemon's life
        except OSError as exc:
            raise OutputError(f"cannot use the versions folder {self.root}: {exc.strerror or exc}",
                              "set [model] versions_dir to a writable folder") from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.seek(0)
            owner = handle.read(20).strip() or "?"
            handle.close()
            raise UsageError(f"the versions folder {self.root} is in use by another edgekit serve (pid {owner})",
                             "give each daemon its own [model] versions_dir") from exc
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing releases the flock
            self._lock = None

    def path(self, version: str) -> Path:
        return self.versions / version

    def has(self, version: str) -> bool:
        return is_version(version) and self.path(version).is_dir()

    def current_version(self) -> str | None:
        """The version ``current`` points at (None: no link, or a link to something else)."""
        try:
            name = Path(os.readlink(self.current)).name
        except OSError:
            return None
        return name if self.has(name) else None

    def flip(self, version: str) -> None:
        """Point ``current`` at ``version`` (relative, so the folder may move) in one rename; the
        half-made links of daemons killed mid-flip (their PID in the name, no longer running) go first."""
        self._sweep_dead_links()
        tmp = self.root / f".current.tmp-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(Path("versions") / version)
        os.replace(tmp, self.current)

    def _sweep_dead_links(self) -> None:
        for link in self.root.glob(".current.tmp-*"):
            pid = link.name.rsplit("-", 1)[1]
            if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
                with contextlib.suppress(OSError):
                    link.unlink()

    def staging_dir(self, version: str) -> Path:
        folder = self.staging / version
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def install(self, version: str) -> Path:
        """Move a verified staging folder into ``versions/`` (a same-file-system rename)."""
        dest = self.path(version)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(self.staging / version, dest)
        now = time.time()
        os.utime(dest, (now, now))  # its install time: what pruning keeps the newest of
        return dest

    def remove(self, version: str) -> None:
        if is_version(version):
            shutil.rmtree(self.path(version), ignore_errors=True)

    def clean_staging(self, keep: str | None = None) -> None:
        """Drop partial downloads of versions the channel no longer names."""
        for entry in self.staging.iterdir() if self.staging.is_dir() else ():
            if entry.name != keep:
                shutil.rmtree(entry, ignore_errors=True)

    def prune(self, keep: int, protect: set[str]) -> list[str]:
        """Remove all but the ``keep`` newest versions, never one in ``protect``; returns what went."""
        entries = [p for p in self.versions.iterdir() if p.is_dir() and is_version(p.name)]
        entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        kept = [p.name for p in entries if p.name in protect]
        removed = []
        for entry in entries:
            if entry.name in protect:
                continue
            if len(kept) < keep:
                kept.append(entry.name)
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
        return removed


def _running(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts: it may still be flipping)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
