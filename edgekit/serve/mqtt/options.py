"""What the MQTT publisher of ``edgekit serve`` needs beyond the broker address: the ``[mqtt]``
settings (and a few from ``[events]`` and ``[model]``) as :class:`MqttOptions`, with their defaults,
and :func:`check_mqtt`, the checks of ``[mqtt]`` keys that depend on each other."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from edgekit.errors import UsageError

QUEUE_POLICIES = ("drop_oldest", "drop_newest")


@dataclass(frozen=True)
class MqttOptions:
    """What the publisher needs beyond the broker address (defaults as in ``[mqtt]``)."""

    qos: int = 0
    keepalive_s: int = 30
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 30.0
    username: str = ""
    tls: bool = False
    ca_file: str = ""  # "" = the system's CA certificates
    cert_file: str = ""  # client certificate (mutual TLS)
    key_file: str = ""
    queue_size: int = 1000
    queue_policy: str = "drop_oldest"
    queue_file: str = ""  # keep the queue in this file across restarts ("" = memory only)
    foreign_queue: str = "refuse"  # a queue file written by another node: "refuse" (set it aside) or "replay"
    discovery: bool = False
    discovery_prefix: str = "homeassistant"
    labels_of_interest: tuple[str, ...] = ()
    model: str = ""  # for the Home Assistant device card
    count_labels: tuple[str, ...] = ()  # a detector's labels with a count topic and sensor
    device_class: str = "occupancy"  # of the binary sensors ("" = none)
    sensor_interval_s: float = 10.0  # <topic>/sensors at least this often while results flow
    min_score: float = 0.5  # a box counts in the sensors' "count" from this score
    snapshots: bool = False  # a Home Assistant camera per counted label shows <topic>/snapshot/<slug>
    device: str = ""  # the device's name there ("" = the last level of the topic)
    cameras: tuple[str, ...] = ()  # named cameras: each has its topics under <topic>/<name> (mqtt_channel.py)


def check_mqtt(where: str, m: Any, events: Any) -> None:
    """``[mqtt]`` keys (``m``, a MqttConfig) that depend on each other, on ``[events]`` or on files
    (checked by --print-config too)."""
    for table, key, value in (("mqtt", "min_score", m.min_score), ("events", "min_score", events.min_score),
                              ("events", "iou", events.iou)):
        if value > 1:
            raise UsageError(f"{where}: [{table}] {key} is a score, 0..1", "e.g. 0.5")
    if (m.ca_file or m.cert_file or m.key_file) and not m.tls:
        raise UsageError(f"{where}: [mqtt] ca_file/cert_file/key_file are set but tls is false", "set tls = true")
    if m.key_file and not m.cert_file:
        raise UsageError(f"{where}: [mqtt] key_file without cert_file", "give the client certificate too")
    if m.queue_file and (m.queue_size == 0 or not os.path.isdir(os.path.dirname(os.path.abspath(m.queue_file)))):
        raise UsageError(f"{where}: [mqtt] queue_file {m.queue_file} needs queue_size > 0 and an existing directory",
                         "e.g. queue_file = \"/var/lib/edgekit/mqtt-queue.jsonl\" (the unit's StateDirectory)")
    for key in ("password_file", "ca_file", "cert_file", "key_file"):
        path = getattr(m, key)
        if path and not os.access(path, os.R_OK):
            raise UsageError(f"{where}: [mqtt] {key} {path} is missing or unreadable",
                             "fix the path or its permissions (the daemon's user must read it)")
