"""What every doctor check shares: the report line, where to look, and small safe probes.

The probes never raise: a missing file, package or program is an answer, not an error.
External programs are run with argument lists (no shell) and a timeout.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

OK, MISSING, WARN, INFO = "ok", "missing", "warn", "info"


@dataclass
class Check:
    """One line of the report: what was checked, its status, what was found, and the fix."""

    group: str
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Env:
    """Where to look: the filesystem root, the home directory and PATH (tests point these at fakes)."""

    root: Path = Path("/")
    home: Path | None = None
    path: str | None = None

    def p(self, *parts: str) -> Path:
        """A path under the root (``env.p("dev", "apex_0")``)."""
        return self.root.joinpath(*parts)

    @property
    def home_dir(self) -> Path:
        """The home directory to read configuration from."""
        return self.home if self.home is not None else Path.home()

    def which(self, name: str) -> str | None:
        """The full path of a program on this environment's PATH, or None."""
        return shutil.which(name, path=self.path if self.path is not None else os.environ.get("PATH"))


def dist_version(*dists: str) -> str | None:
    """The installed version of the first of these distributions that is installed."""
    for d in dists:
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            continue
    return None


def has_module(name: str) -> bool:
    """Whether ``name`` can be imported (found, not imported: a broken install must not crash doctor)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def run_program(argv: list[str], timeout: float = 10.0) -> tuple[int, str]:
    """Run a program (full path, argument list, no shell); return (exit code, stdout+stderr)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def read_text(path: Path) -> str | None:
    """A small text file (sysfs, /proc, /etc) stripped, or None if it cannot be read."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None
