"""What the MQTT publisher sends besides results: the idle state while detection is paused, the
score threshold, events, a detector's counts and snapshots, stats and presence (a mixin of
:class:`~edgekit.serve.mqtt.publisher.MqttPublisher`, which owns the connection, the queue and ``_publish``)."""

from __future__ import annotations

from typing import Any

from edgekit.serve.mqtt.discovery import slug
from edgekit.serve.mqtt.policy import state_text
from edgekit.util.finite_json import to_json


class MqttExtras:
    """``publish_idle``, ``set_min_score``, ``publish_event``, ``publish_counts``,
    ``publish_snapshot`` and ``publish_stats`` of the MQTT publisher."""

    def publish_idle(self) -> None:
        """Detection paused: every camera's state becomes ``none`` (label topics ``OFF``) and the
        sensors say so, until results flow again."""
        for channel in self._channels.values():
            previous = channel.policy.state
            idle = channel.idle_state()
            channel.policy.reset(idle)
            if previous is not None and idle != previous:
                for topic, payload in channel.state_messages(idle, previous):
                    self._publish(topic, payload, 1, retain=True)
            empty = {"detections": []} if isinstance(previous, frozenset) else {"top": []}
            with self._lock:
                sensors = channel.sensors.offer(empty, state_text(idle), True)
            self._publish(channel.sensors.topic, sensors, 0, retain=True, queue=False)

    def set_min_score(self, score: float) -> None:
        """The score from which a label counts as seen (state, binary sensors, ``count``), from
        the next result on, for every camera (the ``threshold`` command)."""
        with self._lock:
            for channel in self._channels.values():
                channel.policy.min_score = channel.sensors.min_score = score

    def publish_event(self, event: dict[str, Any]) -> bool:
        """Publish one event on ``<topic>/events`` (QoS 1, not retained, queued while disconnected
        like results); True when it was sent or queued."""
        return self._publish(f"{self.topic}/events", to_json(event), 1) != "dropped"

    def publish_counts(self, counts: dict[str, int], camera: str = "") -> None:
        """Objects in view per label (a detector's, from :mod:`edgekit.serve.objects`): each count
        that changed goes to its camera's retained ``<topic>/count/<slug>`` (QoS 1, queued)."""
        channel = self._channel(camera)
        with self._lock:
            changed = channel.sensors.set_counts(counts)
        for topic, payload in changed:
            self._publish(topic, payload, 1, retain=True)

    def publish_snapshot(self, label: str, jpeg: bytes, camera: str = "") -> bool:
        """An object's best frame (JPEG) on its camera's ``<topic>/snapshot/<slug>``, retained, QoS 0,
        not queued."""
        channel = self._channel(camera)
        topic = channel.snapshot_topics.get(label) or f"{channel.topic}/snapshot/{slug(label)}"
        return self._publish(topic, jpeg, 0, retain=True, queue=False) == "sent"

    def publish_stats(self, payload: str) -> bool:
        """Publish a stats JSON (QoS 0, never queued), and this daemon's presence; False while disconnected."""
        self._publish(*self.presence.message(), 0, queue=False)
        return self._publish(f"{self.topic}/stats", payload, 0, queue=False) == "sent"
