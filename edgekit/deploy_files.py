"""The deployment files shipped inside the package (``edgekit/deploy/``), and writing them out.

An installed edgekit has no checkout to copy ``deploy/serve.example.toml`` from, so the
example configuration, the systemd unit and the Prometheus files travel as package data;
``edgekit deploy NAME --out DIR`` (and ``edgekit serve --write-example-config PATH``) write
them where they are needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from edgekit.errors import UsageError
from edgekit.util.atomic import write_text_atomic

__all__ = ["DEPLOY_FILES", "DeployFile", "deploy_names", "read_deploy_file", "write_deploy_file", "write_text_atomic"]


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


def write_deploy_file(name: str, dest: str | Path, force: bool = False) -> Path:
    """Write the shipped file ``name`` to ``dest``: a directory (keeps the file's own name) or a path."""
    dest = Path(dest)
    target = dest / DEPLOY_FILES[name].file if dest.is_dir() else dest
    return write_text_atomic(target, read_deploy_file(name), force)
