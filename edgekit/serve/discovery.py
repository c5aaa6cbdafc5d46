"""Home Assistant MQTT discovery for an edgekit device (``[mqtt] discovery = true``).

Home Assistant creates entities from retained JSON configs under
``<prefix>/<component>/<node_id>/<object_id>/config``
(https://www.home-assistant.io/integrations/mqtt/#mqtt-discovery). An edgekit device
announces:

- ``sensor`` *label*: the current state (``<topic>/state``, a plain label, retained);
- ``sensor`` *score*: the top score of the latest published result (``<topic>/result``);
- one ``binary_sensor`` per label of interest, on its own retained ``ON``/``OFF`` topic
  ``<topic>/label/<slug>``.

All share the device's availability topic (``online``/``offline``, the last will). Labels
come from a bundle, which is untrusted: they never enter a Home Assistant template (a label
with ``{{`` in it would be code there); each binary sensor has its own plain topic instead.
"""

from __future__ import annotations

import json
import re

# a classifier's result has ``top``, a detector's ``detections`` (best first); the template is ours, never a label
SCORE_TEMPLATE = ("{{ value_json.top[0].score if value_json.top else "
                  "(value_json.detections[0].score if value_json.detections else 0) }}")


def slug(text: str) -> str:
    """``[a-z0-9_]`` only, as Home Assistant wants in node and object ids ('' -> '_')."""
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_") or "_"


def label_topics(topic: str, labels: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``label -> <topic>/label/<slug>``; a slug two labels share gets a numeric suffix."""
    seen: dict[str, int] = {}
    out = {}
    for label in labels:
        s = slug(label)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out[label] = f"{topic}/label/{s}" + (f"_{n + 1}" if n else "")
    return out


def discovery_messages(topic: str, device: str, labels_of_interest: tuple[str, ...] | list[str],
                       prefix: str = "homeassistant", model: str = "", version: str = "") -> list[tuple[str, str]]:
    """``(config topic, retained JSON payload)`` for every entity of this device."""
    node = slug(device)
    base = {
        "availability_topic": f"{topic}/availability",
        "payload_available": "online",
        "payload_not_available": "offline",
        "device": {"identifiers": [f"edgekit_{node}"], "name": device, "manufacturer": "edgekit",
                   "model": model or "edgekit serve", "sw_version": version},
    }
    entities = [
        ("sensor", "label", {"name": "Label", "state_topic": f"{topic}/state", "icon": "mdi:eye"}),
        ("sensor", "score", {"name": "Score", "state_topic": f"{topic}/result", "value_template": SCORE_TEMPLATE,
                             "state_class": "measurement"}),
    ]
    for label, state_topic in label_topics(topic, labels_of_interest).items():
        object_id = state_topic.rsplit("/", 1)[1]
        entities.append(("binary_sensor", f"label_{object_id}",
                         {"name": label, "state_topic": state_topic, "payload_on": "ON", "payload_off": "OFF"}))
    messages = []
    for component, object_id, extra in entities:
        config = {**base, **extra, "unique_id": f"edgekit_{node}_{object_id}", "object_id": f"{node}_{object_id}"}
        messages.append((f"{prefix}/{component}/{node}/{object_id}/config", json.dumps(config)))
    return messages
