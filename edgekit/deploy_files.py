"""The deployment files shipped inside the package (``edgekit/deploy/``), and writing them out.

An installed edgekit has no checkout to copy ``deploy/serve.example.toml`` from, so the
example configuration, the systemd unit and the Prometheus files travel as package data;
``edgekit deploy NAME --out DIR`` (and ``edgekit serve --write-example-config PATH``) write
them where they are needed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from edgekit.errors import UsageError


@dataclass(frozen=True)
class DeployFile:
    """One shipped file: its name in ``edgekit/deploy/``, what it is, where it usually goes."""

    file: str
    summary: str
    usual_place: str


DEPLOY_FILES: dict[str, DeployFile] = {
    "config": DeployFile("serve.example.toml", "edgekit serve configuration, every key documented",
                         "/etc/edgekit/serve.toml"),
    "systemd": DeployFile("edgekit.service", "systemd unit (Type=notify, watchdog, hardening)",
                          "/etc/systemd/system/edgekit.service"),
    "prometheus": DeployFile("prometheus.yml", "Prometheus scrape config for a fleet (loads alerts.yml)",
                             "/etc/prometheus/prometheus.yml"),
    "alerts": DeployFile("alerts.yml", "Prometheus alert rules (down, not ready, no frames, errors, MQTT)",
                         "/etc/prometheus/alerts.yml"),
}


def deploy_names(names: list[str]) -> list[str]:
    """Expand ``all`` and check every name (UsageError naming the choices for a wrong one)."""
    out: list[str] = []
    for name in names:
        if name == "all":
            out += [n for n in DEPLOY_FILES if n not in out]
        elif name in DEPLOY_FILES:
            if name not in out:
                out.append(name)
        else:
            raise UsageError(f"no deploy file called {name!r}", f"choose from: {', '.join(DEPLOY_FILES)}, all")
    return out


def read_deploy_file(name: str) -> str:
    """The text of the shipped file ``name`` (a key of :data:`DEPLOY_FILES`)."""
    entry = DEPLOY_FILES[deploy_names([name])[0]]
    return resources.files("edgekit").joinpath("deploy", entry.file).read_text(encoding="utf-8")


def write_text_atomic(path: Path, text: str, force: bool = False) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half-written).

    An existing file is kept unless ``force``: a configuration someone edited is not lost to
    a second run of the same command.
    """
    path = Path(path)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; not overwriting it", "give --force to replace it, or another path")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: {path.parent} is not a directory", "create the directory first")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise UsageError(f"cannot write to {path.parent}: {exc.strerror}", "choose a writable directory") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be read by services
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_deploy_file(name: str, dest: str | Path, force: bool = False) -> Path:
    """Write the shipped file ``name`` to ``dest``: a directory (keeps the file's own name) or a path."""
    dest = Path(dest)
    target = dest / DEPLOY_FILES[name].file if dest.is_dir() else dest
    return write_text_atomic(target, read_deploy_file(name), force)
