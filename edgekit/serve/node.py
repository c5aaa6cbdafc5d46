"""Which daemon this is: a node id per install and an MQTT client id no other daemon shares.

A device name alone names no daemon: it defaults to the host name, and a cloned SD card, a
second container or a copied VM has the same one. With the client id ``edgekit-<device>`` two
such daemons knocked each other off the broker about once a second (a broker keeps one
connection per client id), and a queue file carried to another board was replayed there as
the first device's results. So each install gets a random id, kept in ``edgekit-node.json``
beside the queue file (else in the unit's ``$STATE_DIRECTORY``, else ``$XDG_STATE_HOME/edgekit``
or ``~/.local/state/edgekit``):

- the **node id** ``<device>@<install id>`` tags each record of the queue file (a file written
  by another node is not replayed as this one: :mod:`edgekit.serve.mqtt.queue`);
- the **client id** is ``edgekit-<device>-<first 8 of the install id>``: stable, so a broker's
  ACL or its dynamic-security plugin can pin it, and different on every install. A second
  daemon of the same install (the file's lock is held) adds a random part of its own, so it is
  unique per process;
- the file records a fingerprint of the machine (a hash of the board's serial number or the
  firmware's product UUID, where readable): a file copied to other hardware (a cloned card)
  no longer matches, and that machine makes an install id of its own, saying so in one line.

Without a fingerprint to read (a VM without root, some containers) a cloned file keeps its
id; the presence messages of :mod:`edgekit.serve.mqtt.presence` still tell the two apart.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("edgekit.serve")

NODE_FILE = "edgekit-node.json"
MAX_NODE_FILE = 4096  # the file is a few dozen bytes: anything larger is not ours
# where a board says who it is: a Pi's or Jetson's serial number, a PC's or VM's firmware UUID (root only)
MACHINE_SOURCES = ("/sys/firmware/devicetree/base/serial-number", "/sys/class/dmi/id/product_uuid")


@dataclass
class NodeIdentity:
    """This daemon's names: ``node_id`` (per install and device), ``client_id`` (per process where
    two share an install), ``instance`` (per process, random: what presence messages carry)."""

    device: str
    install_id: str
    client_id: str
    path: str = ""  # the node file ("" = none could be kept: the id is this process's own)
    instance: str = field(default_factory=lambda: secrets.token_hex(6))
    _lock_fd: int | None = None

    @property
    def node_id(self) -> str:
        """``<device>@<install id>``: what ties a queue record to the node that wrote it."""
        return f"{self.device}@{self.install_id}"

    def close(self) -> None:
        """Release the node file's lock (another daemon of this install may then take its id)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)


def state_directory(queue_file: str = "", environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the node file lives: beside ``queue_file``, else the unit's ``$STATE_DIRECTORY``,
    else ``$XDG_STATE_HOME/edgekit`` (``~/.local/state/edgekit``); None when there is no home
    to put it in (a user without one, in a container)."""
    if queue_file:
        return Path(os.path.abspath(queue_file)).parent
    env = os.environ if environ is None else environ
    state = env.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return Path(state)
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "edgekit"
    try:
        return Path.home() / ".local" / "state" / "edgekit"
    except RuntimeError:  # no HOME and no passwd entry: nowhere stable, an id of this process
        return None


def machine_fingerprint(sources: tuple[str, ...] = MACHINE_SOURCES) -> str:
    """A hash of the first readable hardware identity of ``sources``; "" when none is readable
    (then a copied node file cannot be told from the original by the machine)."""
    for source in sources:
        try:
            with open(source, "rb") as f:
                data = f.read(256).strip(b"\0 \n")
        except OSError:
            continue
        if data:
            return hashlib.sha256(source.encode() + b"\0" + data).hexdigest()[:16]
    return ""


def load_node(device: str, directory: str | Path | None, fingerprint: str | None = None) -> NodeIdentity:
    """This install's identity for ``device`` (the node file in ``directory`` read, made or
    remade); never raises: a directory that cannot keep the file (or None) gives an id for this
    process."""
    path = Path(directory or "/nonexistent") / NODE_FILE
    machine = machine_fingerprint() if fingerprint is None else fingerprint
    install_id = _read_or_make(path, machine) if directory else None
    if install_id is None:  # nowhere to keep it: unique, but not stable across restarts
        install_id = secrets.token_hex(6)
        log.info("node id: cannot keep %s; this run's MQTT client id is its own", path)
        return NodeIdentity(device, install_id, f"edgekit-{device}-{install_id[:8]}")
    identity = NodeIdentity(device, install_id, f"edgekit-{device}-{install_id[:8]}", str(path))
    identity._lock_fd = _lock(path)
    if identity._lock_fd is None:  # another daemon of this install runs: a client id of our own
        identity.client_id += f"-{identity.instance[:6]}"
        log.info("node id: another edgekit daemon of this install holds %s (or it cannot be locked); "
                 "MQTT client id %s", path, identity.client_id)
    return identity


def _read_or_make(path: Path, machine: str) -> str | None:
    """The install id in ``path``, a new one when the file is missing, unreadable or made on other
    hardware; None when it cannot be written."""
    stored = _read(path)
    if stored is not None:
        install_id, made_on = stored
        if not (machine and made_on and made_on != machine):
            return install_id
        log.warning("node id: %s was made on another machine (a cloned card or disk?): this one takes a new "
                    "install id, so its MQTT client id and queue records are its own", path)
    install_id = secrets.token_hex(6)
    try:
        _write(path, {"install_id": install_id, "machine": machine})
    except OSError as exc:
        log.debug("node id: cannot write %s: %s", path, exc)
        return None
    again = _read(path, quiet=True)  # two daemons starting at once: the file that stayed wins, for both
    return again[0] if again else install_id


def _read(path: Path, quiet: bool = False) -> tuple[str, str] | None:
    """``(install id, machine)`` from the node file; None when missing or not one of ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_NODE_FILE + 1)
    except OSError:
        data = b""
    finally:
        os.close(fd)
    try:
        record = json.loads(data) if len(data) <= MAX_NODE_FILE else None
    except (ValueError, UnicodeDecodeError):
        record = None
    ok = isinstance(record, dict) and isinstance(record.get("install_id"), str) and \
        len(record["install_id"]) == 12 and all(c in "0123456789abcdef" for c in record["install_id"]) and \
        isinstance(record.get("machine", ""), str)
    if not ok:
        if not quiet:
            log.warning("node id: %s is not a node file; a new one replaces it", path)
        return None
    return record["install_id"], record.get("machine", "")


def _write(path: Path, record: dict) -> None:
    """The node file, whole or not at all (a temporary file, fsync, rename); raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        data = json.dumps(record).encode() + b"\n"
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fsync(fd)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _lock(path: Path) -> int | None:
    """Hold an exclusive lock on the node file for this daemon's life; None when another holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
