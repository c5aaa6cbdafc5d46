"""Home Assistant MQTT discovery for an edgekit device (``[mqtt] discovery = true``).

Home Assistant creates entities from retained JSON configs under
``<prefix>/<component>/<node_id>/<object_id>/config``
(https://www.home-assistant.io/integrations/mqtt/#mqtt-discovery). An edgekit device
announces:

- ``sensor`` *label*: the current state (``<topic>/state``, a plain label, retained), with the
  sensor JSON (score, counts) as its attributes;
- ``sensor`` *score*: the top score, from ``<topic>/sensors`` (:mod:`edgekit.serve.mqtt.sensors`),
  sent on every change and at least every ``sensor_interval_s``; ``expire_after`` makes it
  unknown when results stop coming (a camera that is down) instead of showing an old score;
- for a detector, ``sensor`` *count* (objects in view) and one ``sensor`` per counted
  label, from the same JSON: with the label sensor and the binary sensors, all read the tracked
  objects in view (docs/serve.md, "What in view means"), so they never disagree;
- with ``[events] snapshots``, one ``camera`` per counted label showing ``<topic>/snapshot/<slug>``
  (the best frame of the latest object of that label);
- one ``binary_sensor`` per label of interest, on its own retained ``ON``/``OFF`` topic
  ``<topic>/label/<slug>``, with a ``device_class`` (``occupancy`` by default);
- with ``[mqtt] commands`` (:mod:`edgekit.serve.mqtt.control`), a ``switch`` *detection* (``set/detect``),
  a ``button`` *reload* (``set/reload``) and a ``number`` *threshold* (``set/threshold``), each
  reading the state of its command's retained answer.

With several named cameras each camera is a Home Assistant device of its own (``<device> <camera>``,
ids ``edgekit_<device>_<camera>``) reading its camera's topics (``<topic>/<camera>/...``), and the
command entities go on a device of their own (``<device>``): commands act on every camera.

All share the device's availability topic (``online``/``offline``, the last will), so every
entity shows *unavailable* while the device is away. Labels come from a bundle, which is
untrusted: they never enter a Home Assistant template (a label with ``{{`` in it would be code
there); templates name slugs only (``[a-z0-9_]``). ``default_entity_id`` replaces ``object_id``,
which Home Assistant deprecated in 2025.10 (it stops working in 2026.4).
"""

from __future__ import annotations

import json
import re
from typing import Any

from edgekit._version import __version__

# Home Assistant's binary sensor device classes ("" = none): a typo would make discovery fail there, silently
BINARY_DEVICE_CLASSES = (
    "", "battery", "battery_charging", "carbon_monoxide", "cold", "connectivity", "door", "garage_door", "gas",
    "heat", "light", "lock", "moisture", "motion", "moving", "occupancy", "opening", "plug", "power", "presence",
    "problem", "running", "safety", "smoke", "sound", "tamper", "update", "vibration", "window",
)
# a payload that is not JSON (the retained message cleared on a clean stop) must not raise in the template
_JSON_GUARD = "{{% if value_json is defined %}}{{{{ value_json.{} }}}}{{% endif %}}"


def slug(text: str) -> str:
    """``[a-z0-9_]`` only, as Home Assistant wants in node and object ids ('' -> '_')."""
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_") or "_"


def label_topics(topic: str, labels: tuple[str, ...] | list[str], kind: str = "label") -> dict[str, str]:
    """``label -> <topic>/<kind>/<slug>``; a slug two labels share gets a numeric suffix."""
    seen: dict[str, int] = {}
    out = {}
    for label in labels:
        s = slug(label)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out[label] = f"{topic}/{kind}/{s}" + (f"_{n + 1}" if n else "")
    return out


def _sensor(name: str, key: str, topic: str, expire_after: int, **extra: object) -> dict[str, object]:
    """A numeric sensor reading ``key`` of the sensor JSON (``key`` is ours or a slug, never a label)."""
    return {"name": name, "state_topic": f"{topic}/sensors", "value_template": _JSON_GUARD.format(key),
            "state_class": "measurement", "expire_after": expire_after, **extra}


def announcements(topic: str, device: str, options: Any, cameras: list[tuple[str, str]],
                  commands: bool) -> list[tuple[str, str]]:
    """Every discovery message of a device: one device per camera (``cameras``: ``(name, its topic
    prefix)``; the one unnamed camera's prefix is ``topic``), the commands with the device's own
    topics. ``options``: an :class:`~edgekit.serve.mqtt.options.MqttOptions`."""
    o, messages, availability = options, [], f"{topic}/availability"
    for camera, camera_topic in cameras:
        messages += discovery_messages(camera_topic, device, o.labels_of_interest, o.discovery_prefix, o.model,
                                       o.count_labels, o.device_class, o.sensor_interval_s, o.snapshots,
                                       commands and not camera, camera=camera, availability_topic=availability)
    if commands and cameras and cameras[0][0]:  # named cameras: the commands are the device's, not a camera's
        messages += _configs(topic, device, o.discovery_prefix, o.model, _command_entities(topic))
    return messages


def discovery_messages(topic: str, device: str, labels_of_interest: tuple[str, ...] | list[str],
                       prefix: str = "homeassistant", model: str = "",
                       count_labels: tuple[str, ...] | list[str] = (), device_class: str = "occupancy",
                       sensor_interval_s: float = 10.0, snapshots: bool = False,
                       commands: bool = False, camera: str = "",
                       availability_topic: str = "") -> list[tuple[str, str]]:
    """``(config topic, retained JSON payload)`` for every entity of this device (of one named
    ``camera`` of it, whose topics are under ``topic``, when given; ``availability_topic``: the
    device's, default ``<topic>/availability``)."""
    # three missed refreshes: a score older than that is not what the camera sees now
    expire = int(3 * sensor_interval_s) + 1
    entities = [
        ("sensor", "label", {"name": "Label", "state_topic": f"{topic}/state", "icon": "mdi:eye",
                             "json_attributes_topic": f"{topic}/sensors"}),
        ("sensor", "score", _sensor("Score", "score", topic, expire, suggested_display_precision=2)),
    ]
    if count_labels:
        entities.append(("sensor", "count", _sensor("Objects", "count", topic, expire, icon="mdi:counter")))
    for label, count_topic in label_topics(topic, count_labels, kind="count").items():
        key = count_topic.rsplit("/", 1)[1]
        entities.append(("sensor", f"count_{key}", _sensor(f"{label} count", f"counts['{key}']", topic, expire,
                                                            icon="mdi:counter")))
    for label, image_topic in (label_topics(topic, count_labels, kind="snapshot") if snapshots else {}).items():
        entities.append(("camera", f"snapshot_{image_topic.rsplit('/', 1)[1]}",
                         {"name": f"{label} snapshot", "topic": image_topic}))
    for label, state_topic in label_topics(topic, labels_of_interest).items():
        object_id = state_topic.rsplit("/", 1)[1]
        extra = {"device_class": device_class} if device_class else {}
        entities.append(("binary_sensor", f"label_{object_id}",
                         {"name": label, "state_topic": state_topic, "payload_on": "ON", "payload_off": "OFF",
                          **extra}))
    if commands:
        entities += _command_entities(topic)
    return _configs(topic, f"{device} {camera}" if camera else device, prefix, model, entities, availability_topic)


def _configs(topic: str, device: str, prefix: str, model: str,
             entities: list[tuple[str, str, dict[str, object]]], availability_topic: str = "") -> list[tuple[str, str]]:
    """The retained config message of each ``(component, object id, config)`` entity of ``device``."""
    node = slug(device)
    base = {
        "availability_topic": availability_topic or f"{topic}/availability",
        "payload_available": "online",
        "payload_not_available": "offline",
        "device": {"identifiers": [f"edgekit_{node}"], "name": device, "manufacturer": "edgekit",
                   "model": model or "edgekit serve", "sw_version": __version__},
    }
    messages = []
    for component, object_id, extra in entities:
        config = {**base, **extra, "unique_id": f"edgekit_{node}_{object_id}",
                  "default_entity_id": f"{component}.{node}_{object_id}"}
        messages.append((f"{prefix}/{component}/{node}/{object_id}/config", json.dumps(config)))
    return messages


def _command_entities(topic: str) -> list[tuple[str, str, dict[str, object]]]:
    """A switch, a button and a number for the commands of :mod:`edgekit.serve.mqtt.control`."""
    state = _JSON_GUARD.format("state")
    return [
        ("switch", "detect", {"name": "Detection", "command_topic": f"{topic}/set/detect", "icon": "mdi:cctv",
                              "state_topic": f"{topic}/set/detect/state", "value_template": state,
                              "payload_on": "ON", "payload_off": "OFF", "state_on": "ON", "state_off": "OFF"}),
        ("button", "reload", {"name": "Reload model", "command_topic": f"{topic}/set/reload",
                              "payload_press": "PRESS", "icon": "mdi:reload"}),
        # the command template rounds: a slider's 0.1 + 0.05 must not arrive as 0.15000000000000002
        ("number", "threshold", {"name": "Score threshold", "command_topic": f"{topic}/set/threshold",
                                 "command_template": "{{ value | round(2) }}", "state_topic":
                                 f"{topic}/set/threshold/state", "value_template": state,
                                 "min": 0, "max": 1, "step": 0.05, "mode": "slider", "icon": "mdi:tune"}),
    ]
