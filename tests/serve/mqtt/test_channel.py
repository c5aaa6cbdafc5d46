"""Each named camera's MQTT topics under ``<topic>/<camera>`` (its own state, sensors, counts and
missed result), the device's own topics beside them, and Home Assistant: one device per named
camera, the commands on the device's own. Against a real mosquitto where the test needs a broker."""

from __future__ import annotations

import json

import pytest

from edgekit.serve.daemon import Daemon
from edgekit.serve.mqtt.channel import channels
from edgekit.serve.mqtt.discovery import announcements, discovery_messages
from edgekit.serve.mqtt.options import MqttOptions
from edgekit.serve.mqtt.policy import PublishPolicy
from tests.helpers.waiting import wait_until
from tests.serve.test_cameras import named, opener
from tests.serve.test_daemon_services import MOSQUITTO, Broker, Subscriber, make_config, real_runtime, running

needs_mosquitto = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (apt-get install mosquitto)")
DEADLINE_S = 60.0


def changes(messages: list[tuple[str, bool]]) -> list[str]:
    """The payloads of retained messages, a repeat of the one before left out (a connect resends them)."""
    out: list[str] = []
    for payload, _ in messages:
        if not out or out[-1] != payload:
            out.append(payload)
    return out


def test_each_named_camera_has_its_topics_and_its_own_state():
    options = MqttOptions(labels_of_interest=("cat",), count_labels=("cat",))
    policy = PublishPolicy(mode="change", confirm_frames=1)
    chans = channels("edgekit/gate", ("door", "yard"), options, policy)
    door, yard = chans["door"], chans["yard"]
    assert door.result_topic == "edgekit/gate/door/result" and yard.sensors.topic == "edgekit/gate/yard/sensors"
    assert door.label_topics == {"cat": "edgekit/gate/door/label/cat"}
    assert yard.sensors.count_topics == {"cat": "edgekit/gate/yard/count/cat"}
    assert door.policy is policy and yard.policy is not policy and yard.policy.mode == "change"
    door.policy.decide({"top": [{"label": "cat", "score": 0.9}]})
    assert door.policy.state == "cat" and yard.policy.state is None  # what one camera sees is its own
    assert set(door.retained_topics()) == {"edgekit/gate/door/state", "edgekit/gate/door/sensors",
                                           "edgekit/gate/door/label/cat", "edgekit/gate/door/count/cat"}
    unnamed = channels("edgekit/gate", (), options, policy)[""]
    assert unnamed.result_topic == "edgekit/gate/result"  # one unnamed camera: the topics as ever


def test_home_assistant_gets_a_device_per_camera_and_the_commands_on_the_devices_own():
    options = MqttOptions(discovery=True, labels_of_interest=("person",), model="demo")
    cams = [("door", "edgekit/gate/door"), ("yard", "edgekit/gate/yard")]
    configs = {topic: json.loads(payload) for topic, payload in announcements("edgekit/gate", "gate", options,
                                                                                cams, commands=True)}
    door = configs["homeassistant/sensor/gate_door/label/config"]
    assert door["state_topic"] == "edgekit/gate/door/state" and door["device"]["name"] == "gate door"
    assert door["device"]["identifiers"] == ["edgekit_gate_door"] and door["unique_id"] == "edgekit_gate_door_label"
    assert door["availability_topic"] == "edgekit/gate/availability"  # one connection, one last will
    yard = configs["homeassistant/binary_sensor/gate_yard/label_person/config"]
    assert yard["state_topic"] == "edgekit/gate/yard/label/person"
    switch = configs["homeassistant/switch/gate/detect/config"]  # pausing detection pauses every camera
    assert switch["command_topic"] == "edgekit/gate/set/detect" and switch["device"]["identifiers"] == ["edgekit_gate"]
    assert not [t for t in configs if "/gate_door/detect" in t or "/gate_yard/reload" in t]
    # one unnamed camera: exactly the messages of before
    assert announcements("edgekit/gate", "gate", options, [("", "edgekit/gate")], commands=True) == \
        discovery_messages("edgekit/gate", "gate", ("person",), model="demo", commands=True)


@needs_mosquitto
def test_two_cameras_publish_under_their_own_topics(tmp_path):
    broker = Broker(tmp_path).start()
    sub = Subscriber(broker.port, "edgekit/#")
    config = named(make_config(tmp_path, broker.port, mqtt={"labels_of_interest": ("dog",)}),
                   door="synthetic:64x48@50", yard="synthetic:64x48@50")
    daemon = Daemon(config, runtime_factory=real_runtime, labels=["cat", "dog", "bird"], camera_factory=opener)
    try:
        with running(daemon):
            wait_until(lambda: len(sub.on("/door/result")) >= 5 and len(sub.on("/yard/result")) >= 5, DEADLINE_S,
                       what="results of both cameras")
            wait_until(lambda: sub.on("cam-1/stats"), DEADLINE_S, what="stats")
        wait_until(lambda: [p for p, _ in sub.on("/state")][-2:] == ["", ""], DEADLINE_S, what="states cleared")
    finally:
        sub.close()
        broker.stop()
    for camera in ("door", "yard"):
        results = [json.loads(p) for p, _ in sub.on(f"edgekit/cam-1/{camera}/result")]
        assert {r["camera"] for r in results} == {camera} and results[0]["state"] == "dog"
        # the retained state (sent again on connect when a result came first), then "": the clean stop
        assert changes(sub.on(f"edgekit/cam-1/{camera}/state")) == ["dog", ""]
        assert changes(sub.on(f"edgekit/cam-1/{camera}/label/dog")) == ["ON", ""]
        assert json.loads(sub.on(f"edgekit/cam-1/{camera}/sensors")[0][0])["state"] == "dog"
    topics = {t for t, _, _ in sub.messages}
    assert "edgekit/cam-1/result" not in topics and "edgekit/cam-1/state" not in topics  # no device-level results
    assert [p for p, _ in sub.on("edgekit/cam-1/availability")] == ["online", "offline"]  # the device's, once
    stats = json.loads(sub.on("edgekit/cam-1/stats")[-1][0])
    assert set(stats["cameras"]) == {"door", "yard"}


@needs_mosquitto
def test_pausing_detection_idles_every_camera_and_a_threshold_holds_for_all(tmp_path):
    from edgekit.serve.mqtt.publisher import MqttPublisher

    broker = Broker(tmp_path).start()
    sub = Subscriber(broker.port, "edgekit/#")
    pub = MqttPublisher("127.0.0.1", broker.port, topic="edgekit/g", policy=PublishPolicy(confirm_frames=1),
                        options=MqttOptions(qos=1, cameras=("door", "yard"), count_labels=("cat",)))
    try:
        pub.start()
        wait_until(pub.connected.is_set, DEADLINE_S, what="connected")
        for camera, label in (("door", "cat"), ("yard", "dog")):
            pub.publish_result({"camera": camera, "top": [{"label": label, "score": 0.9}]})
        pub.publish_counts({"cat": 2}, camera="yard")
        pub.set_min_score(0.95)  # the threshold command: 0.6 no longer keeps a label (0.5 - hysteresis did)
        pub.publish_result({"camera": "door", "top": [{"label": "cat", "score": 0.6}]})
        wait_until(lambda: len(sub.on("door/state")) >= 2, DEADLINE_S, what="door's new state")
        pub.publish_idle()  # detection paused: the camera still showing a label goes to none too
        wait_until(lambda: len(sub.on("yard/state")) >= 2, DEADLINE_S, what="yard idle")
    finally:
        pub.close()
        sub.close()
        broker.stop()
    assert changes(sub.on("edgekit/g/door/state"))[:2] == ["cat", "none"]
    assert changes(sub.on("edgekit/g/yard/state"))[:2] == ["dog", "none"]
    assert "2" in [p for p, _ in sub.on("edgekit/g/yard/count/cat")]  # the counts are the camera's own
    assert {p for p, _ in sub.on("edgekit/g/door/count/cat")} <= {"0", ""}
    assert pub.stats()["state_changes"] == 3 and pub.stats()["published"] == 3  # cat, dog, door's none
