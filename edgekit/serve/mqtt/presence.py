"""Telling a second daemon with this device's name apart, and saying so in one line.

Two daemons with one device name (a cloned SD card, two containers, a copy run by hand) publish
their results, state and availability on the same topics, and with one MQTT client id a broker
drops one connection for the other about once a second, while the log only said
"disconnected: Unspecified error". With a client id per install (:mod:`edgekit.serve.node`)
neither evicts the other, and this module names the cause:

- **presence**: on every connect and with every stats message, a daemon publishes
  ``<topic>/instance`` (QoS 0, not retained: only a live daemon is present) with its instance id
  (random per process), client id, node id, host and pid, and listens on that topic. A message
  from another instance is one WARNING line naming both daemons and the fix (once per other
  instance), answered once with its own presence so the other daemon learns of it at once;
- **evictions**: when the connection is lost again and again soon after connecting (a broker
  dropping it for another client with the same id, which presence cannot see: each connects
  only to be dropped), one WARNING line says what usually causes it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import deque
from typing import Any

MAX_PRESENCE_BYTES = 2048  # a presence message is ~200 bytes: a larger one is not a daemon's
REMEMBERED = 64  # other instances remembered (a flood of fake ones cannot grow memory)
EVICTION_WINDOW_S = 60.0  # this many drops ...
EVICTION_DROPS = 3  # ... within the window, each ...
EVICTION_SOON_S = 10.0  # ... this soon after its connect: someone else takes the connection


class Presence:
    """This daemon's presence on ``<topic>/instance`` and what it heard there (thread-safe enough:
    paho's one network thread calls :meth:`heard` and :meth:`dropped`)."""

    def __init__(self, topic: str, device: str, client_id: str, node_id: str, instance: str):
        self.topic = f"{topic}/instance"
        self.device, self.client_id, self.node_id, self.instance = device, client_id, node_id, instance
        self.others: dict[str, dict[str, Any]] = {}  # instance id -> what it said (the first time)
        self._drops: deque[float] = deque(maxlen=EVICTION_DROPS)
        self._warned_evictions = False
        self._payload = json.dumps({"instance": instance, "client_id": client_id, "node": node_id,
                                    "host": socket.gethostname(), "pid": os.getpid()}, separators=(",", ":"))

    def message(self) -> tuple[str, str]:
        """``(topic, payload)`` to publish at QoS 0, not retained."""
        return self.topic, self._payload

    def heard(self, payload: bytes, address: str) -> tuple[str, bool]:
        """A presence message: ``(warning line or "", whether to answer with our own presence)``;
        our own messages and garbage are ignored."""
        other = _parse(payload)
        if other is None or other["instance"] == self.instance or other["instance"] in self.others:
            return "", False
        if len(self.others) >= REMEMBERED:
            return "", False
        self.others[other["instance"]] = other
        same_install = bool(self.node_id) and other.get("node") == self.node_id
        cause = ("the same node id: a copy of this install (a cloned card or disk) or a second daemon of it"
                 if same_install else "another install with the same device name")
        line = (f"MQTT {address}: another edgekit daemon publishes as device {self.device!r} on this broker "
                f"(client id {other.get('client_id', '?')}, node {other.get('node', '?')}, host "
                f"{other.get('host', '?')}, pid {other.get('pid', '?')}; this one: client id {self.client_id}, "
                f"node {self.node_id}): {cause}; their results mix on {self.topic.rsplit('/', 1)[0]}/#; give each "
                "daemon its own [mqtt] device")
        return line, True

    def dropped(self, connected_for_s: float, now: float | None = None) -> str:
        """A lost connection that had lasted ``connected_for_s``: a warning line the first time drops
        soon after connecting keep coming, else ""."""
        now = time.monotonic() if now is None else now
        if connected_for_s > EVICTION_SOON_S:
            self._drops.clear()
            self._warned_evictions = False
            return ""
        self._drops.append(now)
        if self._warned_evictions or len(self._drops) < EVICTION_DROPS or now - self._drops[0] > EVICTION_WINDOW_S:
            return ""
        self._warned_evictions = True
        return (f"the broker dropped this connection {EVICTION_DROPS} times within {EVICTION_WINDOW_S:.0f} s, each "
                f"soon after it was made: most likely another client connects with this client id "
                f"({self.client_id}; a cloned card whose machine cannot be told apart: delete its "
                "edgekit-node.json) or, where the broker uses user names as client ids (use_username_as_clientid), "
                "with this user name (give each device its own user); or the broker's ACL or limits refuse it")

    def stats(self) -> dict[str, Any]:
        """The /stats ``mqtt`` keys of presence."""
        return {"client_id": self.client_id, "node": self.node_id, "other_instances": len(self.others)}


def _parse(payload: bytes) -> dict[str, Any] | None:
    """A presence message's fields (strings and an int pid only), None when it is not one."""
    if len(payload) > MAX_PRESENCE_BYTES:
        return None
    try:
        record = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("instance"), str) or not record["instance"]:
        return None
    # another client wrote it: printable characters only, so it cannot forge lines in our log
    return {k: "".join(c if c.isprintable() else "?" for c in v) if isinstance(v, str) else v
            for k, v in record.items() if k in ("instance", "client_id", "node", "host", "pid")
            and isinstance(v, (str, int)) and not isinstance(v, bool) and len(str(v)) <= 256}
