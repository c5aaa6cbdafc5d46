"""The MQTT output against a real mosquitto: broker restarts at QoS 0 and 1 (counted end to end
by a subscriber with a persistent session), publish modes at 15 fps, Home Assistant discovery,
a broker that is not there, TLS with a client certificate, and a password that never leaks."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time

import numpy as np
import pytest

from edgekit.camera import Frame, open_camera
from edgekit.imaging.image import InputSpec
from edgekit.serve.daemon import Daemon
from edgekit.serve.mqtt.policy import PublishPolicy
from edgekit.serve.mqtt.publisher import MqttOptions, MqttPublisher
from tests.helpers.real_models import onnx_runtime
from tests.serve.test_daemon_services import MOSQUITTO, Broker, Subscriber, free_port, make_config, running, wait_until

paho = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt not installed (pip install 'edgekit-vision[serve]')")
pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (apt-get install mosquitto)")
LABELS = ["cat", "dog", "bird"]


SPEC = InputSpec(shape=(1, 16, 16, 3))
SCHEDULE = [(0, 45), (1, 30), (None, 15), (2, 30)]  # (class, frames) at 15 fps


def clip_frame(index: int) -> np.ndarray:
    """Frame ``index`` of a scripted clip at 15 fps: cat 3 s, dog 2 s, nothing sure 1 s, bird 2 s,
    repeated. Each frame is a flat colour whose R, G, B levels are the three classes' evidence,
    with noise on every one (what makes a naive "publish on change" flicker)."""
    rng = np.random.default_rng(index)
    i = index % sum(n for _, n in SCHEDULE)
    for label, n in SCHEDULE:
        if i < n:
            break
        i -= n
    s = rng.uniform(0.05, 0.3, 3)
    if label is not None:
        s[label] = rng.uniform(0.55, 0.9)
    rgb = np.broadcast_to(np.round(s * 255).astype(np.uint8), (48, 64, 3))
    return np.ascontiguousarray(rgb[..., ::-1])  # BGR, as cameras deliver


class ClipCamera:
    """The scripted clip played by the real synthetic camera: its pacing, indices and capture
    thread, with each frame's picture replaced by :func:`clip_frame` of its index."""

    def __init__(self, uri: str, options: dict):
        self.source = open_camera(uri, **options)

    def __iter__(self):
        for frame in self.source:
            yield Frame(clip_frame(frame.index), frame.t_capture_ns, frame.index)

    def stats(self) -> dict:
        return self.source.stats()

    def close(self) -> None:
        self.source.close()


def clip_runtime():
    """The real model watching the clip (ONNX Runtime): each class's score is its colour
    channel's share of the frame's brightness."""
    return onnx_runtime(SPEC, kind="channel_share")


def new_daemon(config, runtime=clip_runtime) -> Daemon:
    return Daemon(config, runtime_factory=runtime, labels=LABELS, camera_factory=ClipCamera)


class Audit(Subscriber):
    """A subscriber with a persistent session (client id + clean_session=False, QoS 1), so a
    broker with persistence keeps its messages across a restart: it counts what reached it."""

    def __init__(self, port: int, topic: str):
        self.messages = []
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="audit", clean_session=False)
        self.client.reconnect_delay_set(1, 1)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.client.on_message = lambda c, u, m: self.messages.append((m.topic, m.payload.decode(), bool(m.retain)))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        wait_until(lambda: self.client.is_connected(), what="audit subscriber connected")
        time.sleep(0.2)


def results_key(payload: str) -> tuple:
    r = json.loads(payload)
    return r["frame"], r["time"]


@pytest.mark.slow
@pytest.mark.parametrize("qos", [0, 1])
def test_broker_restart_of_5_s_loses_nothing_at_qos_1(tmp_path, qos, caplog):
    settings = (f"allow_anonymous true\npersistence true\npersistence_location {tmp_path}/\n"
                "max_queued_messages 0\nqueue_qos0_messages true\nuser root\n")
    broker = Broker(tmp_path, settings=settings).start()
    audit = Audit(broker.port, "edgekit/cam-1/result")
    config = make_config(tmp_path, broker.port, camera={"uri": "synthetic:64x48@15"},
                         mqtt={"qos": qos, "publish": "every"}, http={"listen": ""})
    daemon = new_daemon(config)
    try:
        with caplog.at_level(logging.INFO, logger="edgekit.serve"), running(daemon):
            wait_until(lambda: len(audit.messages) >= 15, what="results before the restart")
            broker.stop()
            t_down = time.monotonic()
            time.sleep(5.0)
            broker.start()
            outage = time.monotonic() - t_down
            wait_until(lambda: daemon.mqtt.connected.is_set() and daemon.mqtt.queued == 0, timeout=15,
                       what="reconnect and replay")
            assert daemon.stats()["mqtt"]["last_error"] == ""  # /stats forgets the outage once back
            time.sleep(1.0)
        written = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
        wait_until(lambda: len({results_key(p) for _, p, _ in audit.messages}) >= len(written) - (qos == 0) * 10**6,
                   timeout=10, what="every result at the subscriber")
    finally:
        audit.close()
        broker.stop()
    got = {results_key(p) for _, p, _ in audit.messages}
    lost = len({(r["frame"], r["time"]) for r in written} - got)
    mqtt = daemon.stats()["mqtt"]
    print(f"\nQoS {qos}: broker down {outage:.1f} s at 15 fps: {len(written)} results, {lost} lost at the "
          f"subscriber, daemon counted {mqtt['dropped']} dropped, {mqtt['replayed']} replayed")
    assert any("MQTT" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert mqtt["published"] + mqtt["dropped"] == len(written)  # each result counted once, either way
    if qos == 1:
        assert lost == 0 and mqtt["dropped"] == 0 and mqtt["replayed"] > 0
    else:
        # every result counted as dropped is lost; the newest of each outage is not dropped but sent
        # on (re)connect, counted as published. Lost beyond the dropped: ones handed to paho in the
        # moment before it learnt that the broker had gone (QoS 0 is at most once).
        assert mqtt["dropped"] <= lost and mqtt["dropped"] > 0 and mqtt["replayed"] == 0


@pytest.mark.slow
def test_publish_modes_at_15_fps(tmp_path):
    """Messages per second on <topic>/result for each mode over the same scripted clip."""
    broker = Broker(tmp_path).start()
    rates = {}
    try:
        for mode in ("every", "change", "interval"):
            sub = Subscriber(broker.port, f"edgekit/{mode}/#")
            config = make_config(tmp_path, broker.port, camera={"uri": "synthetic:64x48@15"},
                                 # QoS 1: a result made before the connection is up waits and is sent,
                                 # so the count does not depend on how fast the client connects
                                 mqtt={"publish": mode, "device": mode, "min_interval_s": 1.0, "qos": 1},
                                 http={"listen": ""})
            daemon = new_daemon(config)
            with running(daemon):
                time.sleep(8.0)  # one pass of the clip (cat, dog, nothing, bird)
            processed = daemon.stats()["frames"]["processed"]
            # QoS 1 is at-least-once: a message redelivered after a reconnect under load arrives
            # twice with the same payload, and the retained state is sent again on every connect;
            # count each result once and each state change once
            results = [json.loads(p) for p in dict.fromkeys(p for p, _ in sub.on("/result"))]
            sent = [p for p, _ in sub.on("/state") if p]  # "": the clean stop clears the retained state
            states = [p for i, p in enumerate(sent) if i == 0 or p != sent[i - 1]]
            sub.close()
            rates[mode] = (len(results), processed)
            if mode == "change":
                assert [r["state"] for r in results] == ["cat", "dog", "none", "bird"]
                assert states == ["cat", "dog", "none", "bird"]
    finally:
        broker.stop()
    for mode, (n, processed) in rates.items():
        print(f"\n{mode:8s}: {n} results published for {processed} frames in 8 s ({n / 8:.2f} msg/s)")
    every, change, interval = (rates[m][0] for m in ("every", "change", "interval"))
    assert every >= 100 and change == 4 and 7 <= interval <= 9
    assert every >= 10 * change


def test_home_assistant_discovery_and_label_topics(tmp_path):
    broker = Broker(tmp_path).start()
    sub = Subscriber(broker.port, "#")
    options = MqttOptions(qos=1, discovery=True, labels_of_interest=("cat", "Red Car"), model="demo-cpu",
                          device_class="motion")
    pub = MqttPublisher("127.0.0.1", broker.port, topic="edgekit/porch", options=options,
                        policy=PublishPolicy(mode="change", confirm_frames=1))
    try:
        pub.start()
        wait_until(pub.connected.is_set, what="connected")
        configs = wait_until(lambda: len(sub.on("/config")) >= 4 and sub.on("/config"), what="discovery configs")
        topics = {t for t, _, _ in sub.messages if t.endswith("/config")}
        assert topics == {"homeassistant/sensor/porch/label/config", "homeassistant/sensor/porch/score/config",
                          "homeassistant/binary_sensor/porch/label_cat/config",
                          "homeassistant/binary_sensor/porch/label_red_car/config"}
        for payload, _retained in configs:
            entity = json.loads(payload)
            assert entity["availability_topic"] == "edgekit/porch/availability"
            assert entity["device"]["identifiers"] == ["edgekit_porch"] and entity["unique_id"].startswith("edgekit_")
            assert "object_id" not in entity  # deprecated by Home Assistant 2025.10
        for label in ("cat", "Red Car", "cat"):
            pub.publish_result({"top": [{"label": label, "score": 0.9}]})
        wait_until(lambda: len(sub.on("/label/cat")) >= 3, what="label topics")
        # a dashboard that subscribes while the device is up gets the entities and the current state (retained)
        late = Subscriber(broker.port, "#")
        wait_until(lambda: len(late.on("/config")) == 4 and late.on("/state"), what="retained messages")
        assert late.on("edgekit/porch/state")[-1] == ("cat", True)
        assert json.loads(late.on("edgekit/porch/sensors")[-1][0])["state"] == "cat"
        late.close()
        pub.close()  # a clean stop clears the retained topics; the subscriber gets them a moment later
        wait_until(lambda: all(sub.on(t)[-1:] and sub.on(t)[-1][0] in ("", b"") for t in
                               ("/label/cat", "/label/red_car", "edgekit/porch/state")), what="cleared topics")
    finally:
        pub.close()
        sub.close()
    assert [p for p, _ in sub.on("/label/cat")] == ["ON", "OFF", "ON", ""]  # "": cleared by the clean stop
    assert [p for p, _ in sub.on("/label/red_car")] == ["OFF", "ON", "OFF", ""]
    assert [p for p, _ in sub.on("edgekit/porch/state")] == ["cat", "Red Car", "cat", ""]
    binary = json.loads(next(p for t, p, _ in sub.messages if t.endswith("label_cat/config")))
    assert binary["device_class"] == "motion" and binary["default_entity_id"] == "binary_sensor.porch_label_cat"
    # the score reads <topic>/sensors (sent on each change, and at least every sensor_interval_s)
    score = json.loads(next(p for t, p, _ in sub.messages if t.endswith("score/config")))
    assert score["state_topic"] == "edgekit/porch/sensors" and score["expire_after"] == 31
    assert [json.loads(p)["score"] for p, _ in sub.on("/sensors") if p] == [0.9, 0.9, 0.9]
    # after a clean stop, a dashboard learns the device is offline and no stale label
    late = Subscriber(broker.port, "#")
    try:
        wait_until(lambda: len(late.on("/config")) == 4 and late.on("/availability"), what="retained messages")
        assert late.on("/availability") == [("offline", True)]
        assert late.on("/state") == [] and late.on("/label/cat") == [] and late.on("/sensors") == []
    finally:
        late.close()
        broker.stop()


def test_unreachable_broker_warns_with_its_address_then_connects_and_clears_the_error(tmp_path, caplog):
    port = free_port()
    pub = MqttPublisher("127.0.0.1", port, topic="edgekit/x", options=MqttOptions(qos=1, queue_size=5))
    with caplog.at_level(logging.INFO, logger="edgekit.serve"):
        pub.start()
        wait_until(lambda: pub.failures >= 1, what="a failed attempt")
        for i in range(8):
            pub.publish_result(json.dumps({"i": i}))
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"mqtt://127.0.0.1:{port}" in w and "Connection refused" in w for w in warnings), warnings
        assert any(r.levelno == logging.INFO and f"connecting to mqtt://127.0.0.1:{port}" in r.getMessage()
                   for r in caplog.records)
        assert pub.stats()["last_error"].startswith("cannot reach the broker")
        assert (pub.queued, pub.dropped) == (5, 3)  # bounded queue, oldest dropped, counted
        broker = Broker(tmp_path, port=port).start()
        sub = Subscriber(port, "edgekit/#")
        try:
            wait_until(pub.connected.is_set, timeout=10, what="connected once the broker is up")
            assert pub.stats()["last_error"] == "" and pub.replayed == 5
            wait_until(lambda: len(sub.on("/result")) == 5, what="replayed results")
            assert [json.loads(p)["i"] for p, _ in sub.on("/result")] == [3, 4, 5, 6, 7]  # in order
        finally:
            sub.close()
            pub.close()
            broker.stop()


OPENSSL = shutil.which("openssl")


def make_certs(d) -> dict:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    def run(*args):
        subprocess.run([OPENSSL, *args], check=True, capture_output=True, cwd=d, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=edgekit test CA")
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(extra + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.crt", "-days", "2",
        "-subj", "/CN=some other CA")
    return {n: str(d / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key", "other.crt")}


@pytest.mark.skipif(OPENSSL is None or shutil.which("mosquitto_passwd") is None,
                    reason="needs openssl and mosquitto_passwd (apt-get install openssl mosquitto)")
def test_tls_with_client_certificate_and_a_password_that_never_leaks(tmp_path, caplog):
    certs = make_certs(tmp_path)
    secret = "s3cret-Pa55-do-not-log"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(tmp_path / "passwd"), "edge", secret], check=True,
                   capture_output=True)
    broker = Broker(tmp_path, settings=(
        f"cafile {certs['ca.crt']}\ncertfile {certs['server.crt']}\nkeyfile {certs['server.key']}\n"
        f"require_certificate true\nallow_anonymous false\npassword_file {tmp_path / 'passwd'}\n"
        "persistence false\nuser root\n")).start()  # root: keep reading the test's files
    (tmp_path / "mqtt.pass").write_text(secret + "\n")
    config = make_config(tmp_path, broker.port, mqtt={
        "tls": True, "ca_file": certs["ca.crt"], "cert_file": certs["client.crt"], "key_file": certs["client.key"],
        "username": "edge", "password_file": str(tmp_path / "mqtt.pass"), "qos": 1}, http={"listen": ""})
    daemon = new_daemon(config)
    try:
        with caplog.at_level(logging.DEBUG), running(daemon):
            wait_until(daemon.mqtt.connected.is_set, what="TLS connection")
            stats = json.dumps(daemon.stats())
            assert daemon.stats()["mqtt"]["broker"] == f"mqtts://127.0.0.1:{broker.port}"
        assert secret not in stats and secret not in caplog.text
        # A broker whose certificate the CA file does not vouch for: one clear warning, never silent.
        caplog.clear()
        wrong = MqttPublisher("127.0.0.1", broker.port, topic="edgekit/w", options=MqttOptions(
            tls=True, ca_file=certs["other.crt"], cert_file=certs["client.crt"], key_file=certs["client.key"]))
        with caplog.at_level(logging.WARNING, logger="edgekit.serve"):
            wrong.start()
            wait_until(lambda: wrong.failures >= 1, what="a failed TLS handshake")
            wrong.close()
        assert any("certificate verify failed" in r.getMessage() and f":{broker.port}" in r.getMessage()
                   for r in caplog.records)
    finally:
        broker.stop()


def test_mqtt_and_output_counters_on_metrics(tmp_path):
    """A daemon whose broker is not there: drops and failed attempts are Prometheus counters."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    config = make_config(tmp_path, free_port(), mqtt={"qos": 0, "publish": "every"})
    daemon = new_daemon(config)
    with running(daemon):
        wait_until(lambda: daemon.mqtt.failures >= 1 and daemon.mqtt.dropped >= 5, what="drops")
        host, port = daemon.http_address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values["edgekit_mqtt_dropped_total"] >= 5 and values["edgekit_mqtt_connect_failures_total"] >= 1
    assert values["edgekit_mqtt_connected"] == 0 and values["edgekit_mqtt_published_total"] == 0
    assert values["edgekit_results_written_total"] >= 5 and values["edgekit_output_up"] == 1


def test_a_state_change_made_while_disconnected_is_retained_once_connected(tmp_path):
    """QoS 0, no discovery: the change to "cat" made before the broker was up was dropped, so the
    retained state topic stayed stale (a dashboard saw the previous run's state). The publisher
    now sends the current state on every connect."""
    broker = Broker(tmp_path)  # not started yet
    pub = MqttPublisher("127.0.0.1", broker.port, topic="edgekit/door", options=MqttOptions(qos=0),
                        policy=PublishPolicy(mode="change", confirm_frames=1))
    try:
        pub.start()
        pub.publish_result({"top": [{"label": "cat", "score": 0.9}]})  # dropped: nobody to send it to
        broker.start()
        watch = Subscriber(broker.port, "edgekit/door/state")  # sees the state however it comes (live or retained)
        wait_until(pub.connected.is_set, 15, what="connected")
        wait_until(lambda: watch.on("/state"), 15, what="the state sent on connect")  # the broker has it now
        watch.close()
        late = Subscriber(broker.port, "edgekit/door/state")
        retained = wait_until(lambda: late.on("/state"), what="retained state")
        late.close()
    finally:
        pub.close()
        broker.stop()
    assert retained == [("cat", True)]


def test_the_newest_result_missed_while_disconnected_is_sent_on_connect(tmp_path):
    """QoS 0, "change" mode: the one change made before the broker was up was dropped, and with a
    steady scene the next result could be hours away; it is sent once the client connects."""
    broker = Broker(tmp_path).start()
    sub = Subscriber(broker.port, "edgekit/hall/result")
    pub = MqttPublisher("127.0.0.1", broker.port, topic="edgekit/hall", options=MqttOptions(qos=0),
                        policy=PublishPolicy(mode="change", confirm_frames=1))
    try:
        for label in ("dog", "cat"):  # not connected yet: "dog" is dropped, the newest is held and sent
            pub.publish_result({"top": [{"label": label, "score": 0.9}]})
        pub.start()
        wait_until(pub.connected.is_set, 15, what="connected")
        results = wait_until(lambda: sub.on("/result"), what="the missed result")
        time.sleep(0.3)
    finally:
        pub.close()
        sub.close()
        broker.stop()
    assert [json.loads(p)["state"] for p, _ in sub.on("/result")] == ["cat"] and results
    assert (pub.dropped, pub.published) == (1, 1)  # the newest counts as sent, not as dropped
