"""Where toolchains live and what their record says.

A toolchain is a folder ``$XDG_CACHE_HOME/edgekit/toolchains/<name>/`` (``~/.cache/...``
without the variable; ``$EDGEKIT_TOOLCHAINS`` replaces the whole path) holding ``venv/`` and
``toolchain.json``: the versions installed, the interpreter, the install's size and time. The
record is written last, so a folder without one is an install that did not finish, never a
toolchain a build would use.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import TargetError

RECORD = "toolchain.json"
ROOT_ENV = "EDGEKIT_TOOLCHAINS"


def toolchains_root(env: dict[str, str] | None = None) -> Path:
    """The folder every toolchain lives under (not created here)."""
    env = os.environ if env is None else env
    if env.get(ROOT_ENV):
        return Path(env[ROOT_ENV])
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edgekit" / "toolchains"


@dataclass(frozen=True)
class Installed:
    """One installed toolchain, as its ``toolchain.json`` records it."""

    name: str
    path: Path
    python: str
    versions: dict[str, str]
    size_mb: float = 0.0
    install_s: float = 0.0
    installed_at: str = ""
    java: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def interpreter(self) -> Path:
        """The toolchain's Python (the venv's), which runs every vendor step."""
        return self.path / "venv" / "bin" / "python"

    def program(self, name: str) -> Path:
        """A console script of the toolchain's venv (``imxconv-tf``)."""
        return self.path / "venv" / "bin" / name

    def to_json(self) -> dict[str, Any]:
        """The record as ``toolchain.json`` and ``toolchain list --json`` hold it."""
        data = asdict(self)
        data["path"] = str(self.path)
        return data


def read_record(folder: Path) -> Installed | None:
    """The toolchain in ``folder``, or None when it has no readable record (an unfinished install)."""
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("versions"), dict):
        return None
    known = {k: data[k] for k in ("python", "size_mb", "install_s", "installed_at", "java") if k in data}
    return Installed(name=str(data.get("name", folder.name)), path=folder, versions=dict(data["versions"]),
                     extra=dict(data.get("extra") or {}), **known)


def write_record(installed: Installed) -> Path:
    """Write ``toolchain.json`` whole (a temporary file, then a rename)."""
    path = installed.path / RECORD
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(installed.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def installed_toolchains(root: Path | None = None) -> list[Installed]:
    """Every finished toolchain under ``root``, by name."""
    root = toolchains_root() if root is None else root
    if not root.is_dir():
        return []
    found = (read_record(p) for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith("."))
    return [t for t in found if t is not None]


def find_toolchain(name: str, root: Path | None = None) -> Installed:
    """The installed toolchain ``name`` whose interpreter exists; TargetError with the fix otherwise."""
    root = toolchains_root() if root is None else root
    found = read_record(root / name)
    if found is None:
        raise TargetError(f"the {name} toolchain is not installed (looked in {root})",
                          f"edgekit toolchain install {name}")
    if not found.interpreter.is_file():
        raise TargetError(f"the {name} toolchain at {found.path} has no interpreter (its venv was removed)",
                          f"edgekit toolchain install {name} --force")
    return found


def has_toolchain(name: str, root: Path | None = None) -> tuple[bool, str]:
    """Whether ``name`` is installed here, and why not (for ``edgekit targets`` and doctor)."""
    try:
        found = find_toolchain(name, root)
    except TargetError as exc:
        return False, str(exc)
    return True, f"{found.path} ({', '.join(f'{k} {v}' for k, v in list(found.versions.items())[:2])})"
