"""One notion of "in view" for a detector's Home Assistant topics (issue 39 item 8).

Home Assistant once showed "Objects 3", "cat ON" and "cat count 0" together: ``state`` and
``label/*`` came from the raw boxes (after the publish policy's own confirmation), ``count``
from the last frame's boxes, ``counts``/``count/<label>`` from the tracked objects. Now a
tracked detector's objects (from their ``new`` event to their ``end``) make all of them; a
subscriber sees them change together, with the result that changed them (docs/serve.md).
"""

from __future__ import annotations

import json
import threading

import cv2
import paho.mqtt.client as paho
import pytest

from edgekit.camera import open_camera
from edgekit.serve.daemon import Daemon
from edgekit.serve.mqtt.policy import PublishPolicy
from edgekit.serve.mqtt.sensors import SensorFeed
from tests.helpers.detector_model import FRAME_W, detector_bundle, scene
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon_services import broker, make_config  # noqa: F401

EMPTY_BEFORE, CAT_FRAMES, EMPTY_AFTER, DOG_AT = 4, 12, 10, 5


def test_a_given_state_is_taken_at_once_and_count_follows_the_objects_not_the_boxes():
    policy = PublishPolicy(mode="change", confirm_frames=3)
    record = {"frame": 1, "time": 1.0, "detections": [{"label": "cat", "score": 0.9, "box": [0, 0, 1, 1]},
                                                      {"label": "dog", "score": 0.9, "box": [1, 1, 2, 2]}]}
    assert policy.decide(record, frozenset())[1] == frozenset()  # boxes, but no object in view yet
    assert policy.decide(record, frozenset({"cat"})) == (True, frozenset({"cat"}))  # no second confirmation
    feed = SensorFeed("t", 60.0, ("cat", "dog"), clock=lambda: 0.0)
    feed.set_counts({"cat": 1})
    body = json.loads(feed.offer(record, "cat", True, count=1))
    assert body["count"] == 1 and body["counts"] == {"cat": 1, "dog": 0}  # not the 2 boxes of the frame
    assert feed.offer(record, "cat", False, count=2) is not None  # a changed count is sent at once


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """Dark frames, a cat on the left for CAT_FRAMES frames (a dog flickers in one of them), dark again."""
    d = tmp_path_factory.mktemp("clip")
    for i in range(EMPTY_BEFORE + CAT_FRAMES + EMPTY_AFTER):
        k = i - EMPTY_BEFORE
        frame = scene(False, k == DOG_AT, seed=i)
        if 0 <= k < CAT_FRAMES:
            frame[:, : FRAME_W // 2] = 200
        cv2.imwrite(str(d / f"{i:03d}.png"), frame)
    return d


class InOrder:
    """A subscriber at QoS 0: the broker forwards the daemon's messages in the order it sent them."""

    def __init__(self, port: int, topic: str):
        self.messages: list[tuple[str, str]] = []
        ready = threading.Event()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=0)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = lambda c, u, m: self.messages.append((m.topic, m.payload.decode()))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert ready.wait(5), "subscriber could not subscribe"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _views_per_frame(messages: list[tuple[str, str]], topic: str) -> list[tuple[int, dict]]:
    """What a dashboard shows after each result: the newest state, label, count and sensor values
    sent before the result's own message (the daemon sends them first, in one burst per result)."""
    seen: dict[str, str] = {}
    views = []
    for t, payload in messages:
        if t == f"{topic}/result":
            sensors = json.loads(seen[f"{topic}/sensors"])
            views.append((json.loads(payload)["frame"], {
                "state": "cat" in seen[f"{topic}/state"].split(","), "label": seen[f"{topic}/label/cat"] == "ON",
                "count/cat": int(seen[f"{topic}/count/cat"]), "count/dog": int(seen[f"{topic}/count/dog"]),
                "sensors.state": "cat" in sensors["state"].split(","), "sensors.count": sensors["count"],
                "sensors.counts": sensors["counts"]}))
        elif payload:  # "" clears a retained topic on the clean stop
            seen[t] = payload
    return views


def test_state_label_and_counts_agree_on_every_frame(tmp_path, broker, clip):  # noqa: F811
    detector_bundle(tmp_path / "twobox")
    sub = InOrder(broker.port, "edgekit/#")
    config = make_config(tmp_path, broker.port, model={"path": str(tmp_path / "twobox")},
                         camera={"on_end": "stop"}, http={"listen": ""},
                         mqtt={"publish": "every", "labels_of_interest": ["cat"], "confirm_frames": 2},
                         events={"min_frames": 3, "max_missing": 3})
    # 10 fps: a busy machine skips fewer frames (each one the test reads is still checked, skipped or not)
    daemon = Daemon(config, camera_factory=lambda uri, options: open_camera(f"folder:{clip}", fps=10))
    try:
        daemon.start()
        wait_until(daemon.mqtt.connected.is_set, 10, what="connected")
        daemon.run()  # the clip plays once; run() returns after the clean stop cleared the retained topics
        wait_until(lambda: ("edgekit/cam-1/state", "") in sub.messages, 10, what="the clean stop's clear")
    finally:
        sub.close()
    views = _views_per_frame(sub.messages, "edgekit/cam-1")
    assert [f for f, _ in views] == sorted({f for f, _ in views})  # one view per result, in order
    for frame, v in views:
        in_view = v["count/cat"] > 0
        assert v["state"] == v["label"] == v["sensors.state"] == in_view, (frame, v)
        assert v["sensors.count"] == v["count/cat"] + v["count/dog"] == sum(v["sensors.counts"].values()), (frame, v)
        assert v["sensors.counts"] == {"cat": v["count/cat"], "dog": v["count/dog"]}, (frame, v)
        assert v["count/dog"] == 0, (frame, v)  # a one-frame dog is a flicker, never an object in view
    shown = [v["count/cat"] for _, v in views]
    assert 1 in shown and shown[0] == 0 and shown[-1] == 0  # the cat came into view and left it
