"""systemd integration without a systemd binding: ``sd_notify`` and the watchdog ping.

The unit (``deploy/edgekit.service``) is ``Type=notify`` with ``WatchdogSec``: the daemon says
``READY=1`` once it serves and pings ``WATCHDOG=1`` from the inference loop, so a hung
inference stops the pings and systemd restarts the service. The loop pings only while the
other parts it vouches for are alive too: an HTTP endpoint whose I/O thread died or hangs
(``/healthz`` unanswered while inference goes on) stops the pings the same way.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("edgekit.serve")


def sd_notify(message: str) -> bool:
    """Send a systemd notification (``READY=1``, ``WATCHDOG=1``...) when run by systemd.

    Speaks the documented datagram protocol on ``$NOTIFY_SOCKET`` directly, so the daemon
    needs no systemd Python binding. Returns False when not under systemd.
    """
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError as exc:
        log.debug("sd_notify(%s) failed: %s", message, exc)
        return False


class Watchdog:
    """Pings systemd's watchdog at half the interval the unit asked for (``$WATCHDOG_USEC``).

    A no-op when the variable is unset (not under systemd, or no ``WatchdogSec``). Call
    :meth:`tick` from the loop whose liveness it vouches for, with ``time.monotonic()``.
    """

    def __init__(self, environ: Mapping[str, str] = os.environ):
        # Half the interval: a ping that arrives a little late must still be in time.
        self.interval_s = int(environ.get("WATCHDOG_USEC", "0") or 0) / 2e6
        self._next = 0.0
        self.withheld = ""  # why pings stopped (logged once per episode)

    def tick(self, now: float, trouble: str = "") -> bool:
        """Ping when due, unless ``trouble`` says a part the caller vouches for is dead (one
        line says so, and systemd restarts the daemon once the interval passes); True when a
        ping was sent."""
        if not self.interval_s or now < self._next:
            return False
        if trouble:
            if not self.withheld:
                log.error("systemd watchdog: pings stopped (%s): systemd restarts the daemon", trouble)
            self.withheld = trouble
            return False
        self.withheld = ""
        self._next = now + self.interval_s
        return sd_notify("WATCHDOG=1")


def results_path(jsonl: str, environ: Mapping[str, str] | None = None) -> str:
    """Where ``[output] jsonl = "auto"`` writes: stdout when run by hand or in a container; under
    systemd (``$INVOCATION_ID`` set) ``results.jsonl`` in the unit's ``StateDirectory``
    (``$STATE_DIRECTORY``, rotated by ``max_bytes``/``backups``), or nothing when the unit has none:
    15-30 results a second do not belong in the journal. Any other value is returned as it is."""
    if jsonl != "auto":
        return jsonl
    env = os.environ if environ is None else environ
    if not env.get("INVOCATION_ID"):
        return "-"
    state = env.get("STATE_DIRECTORY", "").split(":")[0]  # several StateDirectory= are ':'-separated
    return os.path.join(state, "results.jsonl") if state else ""


def resolve_output(config):
    """``config`` with ``[output] jsonl = "auto"`` replaced by :func:`results_path` (logged)."""
    import dataclasses

    if config.output.jsonl != "auto":
        return config
    path = results_path("auto")
    log.info("results (JSON lines): %s ([output] jsonl = \"auto\")",
             {"-": "stdout", "": "off (under systemd without a StateDirectory)"}.get(path, path))
    return dataclasses.replace(config, output=dataclasses.replace(config.output, jsonl=path))
