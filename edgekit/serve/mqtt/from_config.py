"""The MQTT publisher a serve configuration asks for: its options, publish policy, password and node.

Both outputs of ``edgekit serve`` are best-effort by design: a full disk or a broker that is down is
counted and logged, never allowed to stop inference. JSON lines (:mod:`edgekit.serve.sink`) are the
record of truth (every result is written there even while MQTT is down); MQTT is the live feed, by
default only on changes (:mod:`edgekit.serve.mqtt.policy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.serve.mqtt.policy import PublishPolicy
from edgekit.serve.mqtt.publisher import MqttOptions, MqttPublisher
from edgekit.serve.node import load_node, state_directory


def read_password(path: str) -> str:
    """The MQTT password from its own file (first line, stripped); UsageError when unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read [mqtt] password_file {path}: {getattr(exc, 'strerror', None) or exc}",
                         "fix the path or its permissions (the daemon's user must read it)") from exc


def mqtt_from_config(config: Any, model: str = "", count_labels: tuple[str, ...] = ()) -> MqttPublisher:
    """An (unstarted) :class:`MqttPublisher` for a :class:`~edgekit.serve.config.load.ServeConfig`;
    ``count_labels``: a detector's labels that get a count topic (see :func:`count_labels`)."""
    m = config.mqtt
    options = MqttOptions(
        qos=m.qos, keepalive_s=m.keepalive_s, reconnect_min_s=m.reconnect_min_s, reconnect_max_s=m.reconnect_max_s,
        username=m.username, tls=m.tls, ca_file=m.ca_file, cert_file=m.cert_file, key_file=m.key_file,
        queue_size=m.queue_size, queue_policy=m.queue_policy, queue_file=m.queue_file,
        foreign_queue=m.foreign_queue, discovery=m.discovery,
        discovery_prefix=m.discovery_prefix, labels_of_interest=tuple(m.labels_of_interest), model=model,
        device=config.device, count_labels=tuple(count_labels), device_class=m.device_class,
        sensor_interval_s=m.sensor_interval_s, min_score=m.min_score, snapshots=config.events.snapshots,
        cameras=tuple(c.name for c in config.cameras),
    )
    policy = PublishPolicy(mode=m.publish, min_interval_s=m.min_interval_s, min_score=m.min_score,
                           hysteresis=m.hysteresis, confirm_frames=m.confirm_frames)
    password = read_password(m.password_file) if m.password_file else None
    # a client id per install (edgekit-<device> alone let two daemons of one name evict each other)
    node = load_node(config.device, state_directory(m.queue_file))
    try:
        return MqttPublisher(m.host, m.port, topic=config.topic, password=password, options=options, policy=policy,
                             node=node)
    except BaseException:
        node.close()
        raise


MAX_COUNT_LABELS = 100  # a retained topic and a Home Assistant sensor each: beyond this, name them in [events] labels


def count_labels(config: Any, labels: list[str], detector: bool) -> tuple[str, ...]:
    """The labels that get ``<topic>/count/<label>`` and a count sensor: a detector's ``[events]
    labels``, or all its labels when none are named (at most MAX_COUNT_LABELS); none for a
    classifier or with ``[events] counts = false``."""
    e = config.events
    if not (detector and e.enabled and e.counts):
        return ()
    chosen = tuple(e.labels) if e.labels else tuple(dict.fromkeys(labels))
    return chosen if len(chosen) <= MAX_COUNT_LABELS else ()
