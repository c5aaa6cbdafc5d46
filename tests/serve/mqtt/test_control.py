"""MQTT commands and the queue on disk against a real mosquitto: each command sent on
``<topic>/set/<command>`` takes effect and is answered on its retained state topic, bad ones are
refused in one line and answered, commands are ignored unless ``[mqtt] commands = true``, and
results queued while the broker was down survive a daemon restart and arrive first, once, in
order, at QoS 1."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import pytest

from edgekit.camera import open_camera
from edgekit.serve.daemon import Daemon
from edgekit.serve.mqtt.queue_file import read_queue_file
from tests.helpers.detector_model import detector_bundle
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon_services import (  # noqa: F401
    MOSQUITTO,
    Broker,
    Subscriber,
    broker,
    make_config,
    new_daemon,
    running,
)

paho = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt not installed (pip install 'edgekit-vision[serve]')")
pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (apt-get install mosquitto)")
TOPIC = "edgekit/cam-1"


def send(port: int, command: str, payload: str | bytes, retain: bool = False) -> None:
    """Publish one command as a user would (mosquitto_pub -t edgekit/cam-1/set/detect -m OFF)."""
    client = paho.Client(paho.CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port)
    client.loop_start()
    client.publish(f"{TOPIC}/set/{command}", payload, qos=1, retain=retain).wait_for_publish(5)
    client.disconnect()
    client.loop_stop()


def answers(sub: Subscriber, command: str) -> list[dict]:
    return [json.loads(p) for p, _ in sub.on(f"/set/{command}/state") if p]


def command(sub: Subscriber, port: int, name: str, payload: str | bytes, retain: bool = False) -> dict:
    """Send a command and wait for its answer."""
    before = len(answers(sub, name if name in ("detect", "reload", "threshold") else "unknown"))
    send(port, name, payload, retain)
    key = name if name in ("detect", "reload", "threshold") else "unknown"
    wait_until(lambda: len(answers(sub, key)) > before, 10, what=f"the answer to {name} {payload!r}")
    return answers(sub, key)[-1]


def test_commands_round_trip_and_refusals(tmp_path, broker, caplog):  # noqa: F811
    sub = Subscriber(broker.port)
    config = make_config(tmp_path, broker.port, mqtt={"commands": True, "publish": "every", "confirm_frames": 1},
                         http={"listen": ""})
    daemon = new_daemon(config)  # a real ONNX model that sees "dog" (0.7-0.79) on every frame
    send(broker.port, "detect", "OFF", retain=True)  # left on the broker: handed over at every subscribe
    try:
        with caplog.at_level(logging.INFO, logger="edgekit.serve"), running(daemon):
            wait_until(lambda: len(answers(sub, "detect")) >= 2 and answers(sub, "threshold") and sub.on("/state"),
                       what="states on connect")
            assert [answers(sub, c)[0]["state"] for c in ("detect", "threshold", "reload")] == ["ON", "0.5", "idle"]
            retained = answers(sub, "detect")[1]
            assert retained["ok"] is False and "retained" in retained["error"] and retained["state"] == "ON"
            # clearing it (an empty retained message) reaches the daemon as an empty command: refused too
            assert "ON or OFF" in command(sub, broker.port, "detect", b"", retain=True)["error"]
            late = Subscriber(broker.port, f"{TOPIC}/set/+/state")  # retained: a later subscriber is told too
            wait_until(lambda: len(late.messages) == 3, what="3 retained states")
            late.close()
            assert all(retained for _, _, retained in late.messages)
            # detect OFF: no result after the answer, the state says none; ON: results again
            assert command(sub, broker.port, "detect", "OFF") == {**answers(sub, "detect")[-1], "ok": True,
                                                                   "state": "OFF", "requested": "OFF"}
            wait_until(lambda: sub.on(f"{TOPIC}/state")[-1][0] == "none", what="the state none once paused")
            # the loop has passed a frame over: the frame it was processing when paused was published before
            wait_until(lambda: daemon.stats()["control"]["paused_frames"] >= 1, what="a frame passed over")
            time.sleep(0.3)  # its result may still be on its way from the broker
            n = len(sub.on("/result"))
            time.sleep(1.0)
            assert len(sub.on("/result")) == n
            paused = daemon.stats()["control"]["paused_frames"]
            assert paused >= 10 and daemon.stats()["frames"]["captured"] > 0  # the camera is still read
            assert command(sub, broker.port, "detect", "ON")["state"] == "ON"
            wait_until(lambda: len(sub.on("/result")) > n + 5, what="results after detect ON")
            wait_until(lambda: sub.on(f"{TOPIC}/state")[-1][0] == "dog", what="the state back to dog")
            # threshold: above what the model scores, dog is no longer seen; back to 0.5, it is
            assert command(sub, broker.port, "threshold", "0.9")["state"] == "0.9"
            wait_until(lambda: sub.on(f"{TOPIC}/state")[-1][0] == "none", what="the state at threshold 0.9")
            refused = command(sub, broker.port, "threshold", "1.5")
            assert refused["ok"] is False and refused["state"] == "0.9" and "above 1" in refused["error"]
            assert command(sub, broker.port, "threshold", "0.5")["ok"]
            wait_until(lambda: sub.on(f"{TOPIC}/state")[-1][0] == "dog", what="the state at threshold 0.5")
            # refusals: unknown, a bad payload, a retained command, a reload the daemon cannot do
            unknown = command(sub, broker.port, "explode", "now")
            assert unknown["ok"] is False and unknown["command"] == "unknown" and "unknown command" in unknown["error"]
            assert command(sub, broker.port, "detect", "off")["error"] == "detect takes ON or OFF"
            assert "not available" in command(sub, broker.port, "reload", "")["error"]  # a model from a factory
        # the clean stop clears the retained state; the broker hands the clear on after the daemon has gone
        wait_until(lambda: sub.on("/set/detect/state")[-1][0] == "", what="the detect state cleared by the stop")
    finally:
        sub.close()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    print("\n" + "\n".join(refusals))
    assert len(refusals) == 6
    assert all(r.levelno == logging.WARNING for r in caplog.records if "refused" in r.getMessage())
    assert any("MQTT command detect OFF obeyed" in r.getMessage() for r in caplog.records)
    stats = daemon.stats()["control"]
    assert stats["accepted"] == 4 and stats["refused"] == 6
    assert sub.on("/set/detect/state")[-1][0] == ""  # cleared by the clean stop


def test_reload_swaps_in_the_new_bundle(tmp_path, broker):  # noqa: F811
    (tmp_path / "v1").mkdir()
    detector_bundle(tmp_path / "v1" / "twobox")
    detector_bundle(tmp_path / "v2", spare=1)  # same task and labels, another model: a swap is allowed
    os.symlink(tmp_path / "v1" / "twobox", tmp_path / "bundle")
    sub = Subscriber(broker.port)
    config = make_config(tmp_path, broker.port, model={"path": str(tmp_path / "bundle"), "warmup_frames": 2},
                         camera={"uri": "synthetic:320x240@15"}, http={"listen": ""}, mqtt={"commands": True})
    daemon = Daemon(config, camera_factory=lambda uri, options: open_camera(uri, **options))
    try:
        with running(daemon):
            wait_until(lambda: answers(sub, "reload"), what="the reload state on connect")
            sha = daemon.stats()["model"]["sha256"]
            os.unlink(tmp_path / "bundle")
            os.symlink(tmp_path / "v2", tmp_path / "bundle")
            answer = command(sub, broker.port, "reload", "PRESS")
            assert answer["ok"] and answer["state"] == "requested"
            wait_until(lambda: any(json.loads(p).get("type") == "model_swap" for p, _ in sub.on("/events")),
                       timeout=30, what="a model_swap event")
            swap = next(json.loads(p) for p, _ in sub.on("/events") if json.loads(p).get("type") == "model_swap")
            assert swap["result"] == "ok", swap
            assert daemon.stats()["model"]["sha256"] != sha
    finally:
        sub.close()


def test_commands_are_off_by_default(tmp_path, broker):  # noqa: F811
    sub = Subscriber(broker.port)
    daemon = new_daemon(make_config(tmp_path, broker.port, http={"listen": ""}))
    try:
        with running(daemon):
            wait_until(lambda: len(sub.on("/result")) >= 3, what="results")
            send(broker.port, "detect", "OFF")
            n = len(sub.on("/result"))
            wait_until(lambda: len(sub.on("/result")) > n + 10, what="results go on")  # still detecting
            assert "control" not in daemon.stats()
    finally:
        sub.close()
    assert not [t for t, _, _ in sub.messages if "/set/" in t and t.endswith("/state")]


class QosAudit(Subscriber):
    """A subscriber that records each message's QoS too."""

    def __init__(self, port: int, topic: str):
        self.messages = []
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.client.on_message = lambda c, u, m: self.messages.append((m.topic, m.payload.decode(), m.qos))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        wait_until(self.client.is_connected, what="audit connected")
        time.sleep(0.3)  # subscribed


@pytest.mark.slow
def test_queue_file_survives_a_daemon_restart_and_is_sent_first_once_in_order(tmp_path):
    broker = Broker(tmp_path).start()  # noqa: F811 - stopped and started again: not the fixture
    queue_file = tmp_path / "mqtt-queue.jsonl"

    def config(n: int):
        return make_config(tmp_path, broker.port, mqtt={"qos": 1, "publish": "every", "queue_file": str(queue_file)},
                           camera={"uri": "synthetic:64x48@15"}, http={"listen": ""},
                           output={"jsonl": str(tmp_path / f"results-{n}.jsonl")})

    first = QosAudit(broker.port, f"{TOPIC}/result")
    daemon = new_daemon(config(1))
    try:
        with running(daemon):
            wait_until(lambda: len(first.messages) >= 5, what="results before the outage")
            broker.stop()
            wait_until(lambda: not daemon.mqtt.connected.is_set(), what="the outage noticed")
            t_noticed = time.time()
            wait_until(lambda: daemon.mqtt.queued >= 20, what="results queued")
        first.close()
        fd = os.open(queue_file, os.O_RDONLY)
        queued = [payload for _, (topic, payload, qos, _) in read_queue_file(fd, 10**6).items
                  if topic.endswith("/result")]
        os.close(fd)
        made = [json.loads(line) for line in (tmp_path / "results-1.jsonl").read_text().splitlines()]
        after = [r for r in made if r["time"] > t_noticed + 0.2]  # made while the daemon knew the broker was down
        assert len(queued) >= 20 and {(r["frame"], r["time"]) for r in after} <= {
            (json.loads(p)["frame"], json.loads(p)["time"]) for p in queued}
        shutil.copy(queue_file, tmp_path / "queue-after-stop.jsonl")
        broker.start()
        audit = QosAudit(broker.port, f"{TOPIC}/result")
        restarted = new_daemon(config(2))
        with running(restarted):
            wait_until(lambda: restarted.mqtt.connected.is_set() and restarted.mqtt.queued == 0, what="replay")
            wait_until(lambda: len(audit.messages) >= len(queued) + 10, what="newer results after the replay")
        audit.close()
    finally:
        broker.stop()
    got = [p for _, p, _ in audit.messages]
    print(f"\n{len(queued)} results queued on disk across the restart; the new daemon sent them first, then "
          f"{len(got) - len(queued)} of its own; replayed {restarted.stats()['mqtt']['replayed']}")
    assert got[:len(queued)] == queued  # first, in order, each once
    assert not set(got[len(queued):]) & set(queued)
    assert {q for _, _, q in audit.messages} == {1}
    assert os.path.getsize(queue_file) == 0  # all acknowledged
