"""What the MQTT publisher of ``edgekit serve`` needs beyond the broker address: the ``[mqtt]``
settings (and a few from ``[events]`` and ``[model]``) as :class:`MqttOptions`, with their defaults."""

from __future__ import annotations

from dataclasses import dataclass

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
