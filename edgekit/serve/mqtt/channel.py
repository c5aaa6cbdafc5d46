"""One camera's topics on the device's MQTT connection: result, state, label, sensors, count and snapshot.

The one unnamed camera's topics sit right under the device's ``<topic>`` as they always did; a
named camera's under ``<topic>/<name>`` (``edgekit/gate/door/result``, ``.../door/state``, ...),
each with its own publish policy (its own state, change detection and sensor refresh). What
belongs to the device stays under ``<topic>`` whatever the cameras: availability (one connection,
one last will), stats, events (an object event says ``"camera"``), and the commands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

from edgekit.serve.mqtt.discovery import label_topics
from edgekit.serve.mqtt.options import MqttOptions
from edgekit.serve.mqtt.policy import PublishPolicy, state_text
from edgekit.serve.mqtt.sensors import SensorFeed


class Channel:
    """The topics and publish state of one camera (not thread-safe: the publisher holds its lock).

    Args:
        topic: the device's topic prefix.
        camera: the camera's name ("" for the one unnamed camera: the device's own prefix).
        options: the publisher's options (labels of interest, counted labels, sensor interval).
        policy: this camera's publish policy (its own instance: it holds the camera's state).
    """

    def __init__(self, topic: str, camera: str, options: MqttOptions, policy: PublishPolicy):
        self.camera = camera
        self.topic = f"{topic}/{camera}" if camera else topic
        self.policy = policy
        self.result_topic = f"{self.topic}/result"
        self.label_topics = label_topics(self.topic, options.labels_of_interest)
        self.sensors = SensorFeed(self.topic, options.sensor_interval_s, tuple(options.count_labels), options.min_score)
        self.snapshot_topics = label_topics(self.topic, options.count_labels, kind="snapshot")  # as discovery does
        self.missed: str | None = None  # the newest unsent result, sent on connect: "change" mode may wait hours

    def state_messages(self, state: Any, previous: Any = None) -> list[tuple[str, str]]:
        """``<topic>/state`` and the ON/OFF topics of labels of interest that changed."""
        messages = [(f"{self.topic}/state", state_text(state))]
        now_on = set(state) if isinstance(state, frozenset) else {state}
        was_on = set(previous) if isinstance(previous, frozenset) else {previous}
        for label, label_topic in self.label_topics.items():
            if previous is None or (label in now_on) != (label in was_on):
                messages.append((label_topic, "ON" if label in now_on else "OFF"))
        return messages

    def current(self) -> list[tuple[str, str, int]]:
        """``(topic, payload, qos)`` of the retained state now: state and label topics, counts and the
        newest sensor message (sent again on each connect)."""
        out: list[tuple[str, str, int]] = []
        if self.policy.state is not None:
            out += [(topic, payload, 1) for topic, payload in self.state_messages(self.policy.state)]
        out += [(topic, payload, 1) for topic, payload in self.sensors.count_messages()]
        if self.sensors.payload is not None:
            out.append((self.sensors.topic, self.sensors.payload, 0))
        return out

    def retained_topics(self) -> list[str]:
        """The retained topics that describe what this camera sees (cleared on a clean stop)."""
        return [f"{self.topic}/state", self.sensors.topic, *self.label_topics.values(),
                *self.sensors.count_topics.values()]

    def idle_state(self) -> Hashable:
        """The state of seeing nothing: no labels for a detector, ``none`` for a classifier."""
        return frozenset() if isinstance(self.policy.state, frozenset) else ""


def channels(topic: str, cameras: tuple[str, ...], options: MqttOptions, policy: PublishPolicy) -> dict[str, Channel]:
    """A channel per camera (one unnamed one when ``cameras`` is empty); the first takes ``policy``
    itself, each other a fresh copy of its settings."""
    out: dict[str, Channel] = {}
    for n, camera in enumerate(cameras or ("",)):
        own = policy if n == 0 else PublishPolicy(**{f.name: getattr(policy, f.name) for f in _SETTINGS})
        out[camera] = Channel(topic, camera, options, own)
    return out


# a policy's settings (what a copy takes); the rest is state each camera keeps for itself
_SETTINGS = [f for f in dataclasses.fields(PublishPolicy)
             if f.name in ("mode", "min_interval_s", "min_score", "hysteresis", "confirm_frames", "clock")]
