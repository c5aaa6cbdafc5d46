"""Every delivery promise docs/serve.md makes about MQTT, pinned against a real mosquitto.

docs/serve.md says: results go out at QoS ``[mqtt] qos`` and are not retained; while the
broker is unreachable, results of QoS >= 1 wait in memory (``queue_size``, ``queue_policy``)
and are sent in order on reconnect, a broker restart at QoS 1 losing none; at QoS 0 they are
dropped and counted, all but the newest, which is sent on reconnect with the current retained
state (and counted as published); ``state``, ``label/<label>`` and ``availability`` are
retained; ``events`` are QoS 1; the counters published / dropped / replayed / queued say what
happened, of results only.

Each test watches with :class:`QosAudit`, a subscriber at QoS 2 with a persistent session:
the broker delivers at the lower of the publisher's and the subscriber's QoS, so the QoS it
records is the one the publisher used. A replay at QoS 0 instead of the configured QoS, a
reordered replay, a retained result or a miscount fails a test here.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from edgekit.serve.mqtt.policy import PublishPolicy
from edgekit.serve.mqtt.publisher import MqttOptions, MqttPublisher
from tests.serve.mqtt.test_publisher import new_daemon
from tests.serve.test_daemon_services import MOSQUITTO, Broker, Subscriber, make_config, running, wait_until

paho = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt not installed (pip install 'edgekit-vision[serve]')")
pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (apt-get install mosquitto)")


class QosAudit(Subscriber):
    """A subscriber at QoS 2 with a persistent session (the broker keeps its subscription and its
    messages while it is away and across a broker restart with persistence): ``messages`` as
    :class:`Subscriber` has them, ``qos`` the QoS each one was delivered at."""

    def __init__(self, port: int, topic: str, client_id: str = "qos-audit"):
        self.messages: list[tuple[str, str, bool]] = []
        self.qos: list[int] = []
        self._subscribed = threading.Event()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        self.client.reconnect_delay_set(1, 1)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=2)
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self._subscribed.wait(5), "the audit subscriber could not subscribe"

    def _on_message(self, client, userdata, m) -> None:
        self.qos.append(m.qos)
        self.messages.append((m.topic, m.payload.decode(), bool(m.retain)))

    def delivered(self, suffix: str) -> list[tuple[dict | str, int, bool]]:
        """(payload, QoS, retained) of each message on a topic ending with ``suffix``, in arrival order."""
        out = []
        for (topic, payload, retained), qos in zip(list(self.messages), list(self.qos)):
            if topic.endswith(suffix):
                out.append((json.loads(payload) if payload.startswith("{") else payload, qos, retained))
        return out


def persistent_broker(tmp_path) -> Broker:
    """A mosquitto that keeps sessions on disk across a restart, with no limit on queued messages."""
    return Broker(tmp_path, settings=(f"allow_anonymous true\npersistence true\npersistence_location {tmp_path}/\n"
                                      "max_queued_messages 0\nqueue_qos0_messages true\nuser root\n"))


@pytest.fixture
def offline(tmp_path):
    """A broker that knows the audit subscriber (subscribed on ``edgekit/p/#``) and is then
    stopped: ``(broker, audit)``. Whatever is published after ``broker.start()`` reaches the
    audit's session even before the audit itself has reconnected."""
    broker = persistent_broker(tmp_path).start()
    audit = QosAudit(broker.port, "edgekit/p/#")
    broker.stop()
    yield broker, audit
    audit.close()
    broker.stop()


def publisher(port: int, qos: int, **options) -> MqttPublisher:
    return MqttPublisher("127.0.0.1", port, topic="edgekit/p", client_id="promises",
                         options=MqttOptions(qos=qos, reconnect_min_s=1, reconnect_max_s=1, **options),
                         policy=PublishPolicy(mode="every"))


def frames(delivered) -> list[int]:
    return [payload["frame"] for payload, _, _ in delivered]


@pytest.mark.parametrize("qos", [1, 2])
def test_results_made_while_the_broker_is_down_are_replayed_at_the_configured_qos_in_order(offline, qos):
    broker, audit = offline
    pub = publisher(broker.port, qos)
    try:
        pub.start()
        for i in range(20):  # the broker is down: every one waits in the queue
            assert pub.publish_result({"frame": i, "top": [{"index": 0, "label": "cat", "score": 0.9}]})
        assert pub.publish_event({"event": "test", "n": 1})  # events wait too, at QoS 1
        assert pub.published == 0 and pub.dropped == 0
        assert pub.queued == 20 and pub.stats()["queued"] == 20  # results only: not the event, nor state
        broker.start()
        wait_until(lambda: pub.connected.is_set() and pub.queued == 0, 15, what="connect and replay")
        for i in range(20, 25):  # live results come after the replay
            pub.publish_result({"frame": i, "top": [{"index": 0, "label": "cat", "score": 0.9}]})
        wait_until(lambda: len(audit.delivered("/result")) >= 25, what="every result at the subscriber")
    finally:
        pub.close()
    results = audit.delivered("/result")
    assert frames(results) == list(range(25))  # none lost, none twice, in the order they were made
    assert {q for _, q, _ in results} == {qos}, "replayed results must keep the configured QoS"
    assert not any(retained for _, _, retained in results)
    assert [(p["n"], q) for p, q, _ in audit.delivered("/events")] == [(1, 1)]
    assert (pub.published, pub.replayed, pub.dropped) == (25, 20, 0)


def test_at_qos_0_the_results_of_an_outage_are_dropped_and_counted_but_the_newest_is_sent(offline):
    broker, audit = offline
    pub = publisher(broker.port, 0)
    try:
        pub.start()
        for i in range(10):
            assert not pub.publish_result({"frame": i, "top": [{"index": 1, "label": "dog", "score": 0.8}]})
        broker.start()
        wait_until(lambda: audit.delivered("/result"), 15, what="the newest result")
        late = Subscriber(broker.port, "edgekit/p/state")
        state = wait_until(lambda: late.on("/state"), what="the retained state")
        late.close()
        time.sleep(0.3)  # nothing else comes
    finally:
        pub.close()
    assert [(p["frame"], q) for p, q, _ in audit.delivered("/result")] == [(9, 0)]
    assert (pub.dropped, pub.published, pub.replayed) == (9, 1, 0)  # all but the newest; it is sent
    assert state == [("dog", True)]  # the current state, retained


@pytest.mark.parametrize(("policy", "kept"), [("drop_oldest", range(7, 12)), ("drop_newest", range(5))])
def test_a_full_queue_drops_by_its_policy_and_counts(offline, policy, kept):
    broker, audit = offline
    pub = publisher(broker.port, 1, queue_size=5, queue_policy=policy)
    try:
        pub.start()
        for i in range(12):  # already-encoded lines: no state messages share the queue
            pub.publish_result(json.dumps({"frame": i}))
        assert pub.queued == 5 and pub.dropped == 7
        broker.start()
        wait_until(lambda: pub.connected.is_set() and pub.queued == 0, 15, what="connect and replay")
        wait_until(lambda: len(audit.delivered("/result")) >= 5, what="the queued results")
        time.sleep(0.3)
    finally:
        pub.close()
    results = audit.delivered("/result")
    assert frames(results) == list(kept)
    assert {q for _, q, _ in results} == {1}
    assert (pub.replayed, pub.dropped, pub.published) == (5, 7, 5)


def test_state_label_and_availability_are_retained_and_results_are_not(tmp_path):
    broker = Broker(tmp_path).start()
    pub = MqttPublisher("127.0.0.1", broker.port, topic="edgekit/r", options=MqttOptions(
        qos=1, labels_of_interest=("cat", "dog")), policy=PublishPolicy(mode="every", confirm_frames=1))
    audit = QosAudit(broker.port, "edgekit/r/#")
    try:
        pub.start()
        wait_until(pub.connected.is_set, 15, what="connected")
        for label in ("dog", "cat"):
            pub.publish_result({"frame": 1, "top": [{"index": 0, "label": label, "score": 0.9}]})
        # the results go out after their state and label messages: wait for both, or the second result can
        # reach the late subscriber live (retain False, but it is no retained message's fault)
        wait_until(lambda: ("ON", 1, False) in audit.delivered("label/cat") and len(audit.delivered("/result")) >= 2,
                   what="the broker has them all")
        late = Subscriber(broker.port, "edgekit/r/#")  # a dashboard that subscribes afterwards
        time.sleep(0.3)
        seen = {topic.removeprefix("edgekit/r/"): (payload, retained) for topic, payload, retained in late.messages}
        late.close()
    finally:
        audit.close()
        pub.close()
        broker.stop()
    documented = {topic: seen.get(topic) for topic in ("availability", "state", "label/cat", "label/dog", "result")}
    assert documented == {"availability": ("online", True), "state": ("cat", True), "label/cat": ("ON", True),
                          "label/dog": ("OFF", True), "result": None}  # a result is never retained
    assert [(p["frame"], q, r) for p, q, r in audit.delivered("/result")] == [(1, 1, False), (1, 1, False)]


@pytest.mark.slow  # seconds of broker outage
@pytest.mark.parametrize("qos", [1, 2])
def test_a_broker_restart_mid_stream_keeps_qos_order_and_counts(tmp_path, qos):
    """The real daemon at 50 fps, the broker stopped for 2 s and started again: every result
    reaches the subscriber at the configured QoS, in the order the frames were made, and the
    counters add up to what the JSON-lines file holds."""
    broker = persistent_broker(tmp_path).start()
    audit = QosAudit(broker.port, "edgekit/cam-1/result")
    daemon = new_daemon(make_config(tmp_path, broker.port, mqtt={"qos": qos}, http={"listen": ""}))
    try:
        with running(daemon):
            wait_until(lambda: len(audit.messages) >= 20, what="results before the outage")
            broker.stop()
            time.sleep(2.0)
            queued = daemon.mqtt.queued
            broker.start()
            wait_until(lambda: daemon.mqtt.connected.is_set() and daemon.mqtt.queued == 0, 15, what="replay")
            time.sleep(0.5)
        written = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
        wait_until(lambda: len({p["frame"] for p, _, _ in audit.delivered("/result")}) >= len(written), 10,
                   what="every result at the subscriber")
    finally:
        audit.close()
        broker.stop()
    results = audit.delivered("/result")
    got = [p["frame"] for p, _, _ in results]
    first_seen = list(dict.fromkeys(got))  # QoS 1 may deliver a result twice (a resend)
    assert {q for _, q, _ in results} == {qos}, "replayed results must keep the configured QoS"
    assert sorted(first_seen) == [r["frame"] for r in written]  # none lost
    assert qos == 1 or len(got) == len(first_seen)  # QoS 2: exactly once
    mqtt = daemon.stats()["mqtt"]
    assert queued > 0 and mqtt["replayed"] > 0 and mqtt["dropped"] == 0
    assert mqtt["published"] == len(written) and mqtt["queued"] == 0
    # The result paho had in flight when the broker went down comes before the queue's replay
    # (it once came after it: frames 20, 22 ... 40, 21 at QoS 2).
    assert first_seen == sorted(first_seen), f"results out of the order they were made: {first_seen[:60]}"
