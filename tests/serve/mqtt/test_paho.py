"""Without a broker: what the MQTT publisher counts as a queued or dropped result (results only,
not the state, count and event messages queued beside them; the newest QoS 0 result is held for
the next connection, not dropped), and :class:`~edgekit.serve.mqtt.paho.InFlight`, which lets a
reconnect replay the queue only after paho's older messages are acknowledged."""

from __future__ import annotations

import json
import socket
import threading
from types import SimpleNamespace

import pytest

from edgekit.serve.mqtt.paho import InFlight
from edgekit.serve.mqtt.policy import PublishPolicy
from edgekit.serve.mqtt.publisher import MqttOptions, MqttPublisher  # paho is imported when a publisher is made

NO_CONN = 4


def closed_port() -> int:
    """A local port nothing listens on: the publisher is never connected (and never started)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publisher(qos: int, **options) -> MqttPublisher:
    return MqttPublisher("127.0.0.1", closed_port(), topic="edgekit/c", options=MqttOptions(qos=qos, **options),
                         policy=PublishPolicy(mode="every"))


@pytest.mark.parametrize(("policy", "queued", "dropped"), [("drop_oldest", 3, 1), ("drop_newest", 0, 4)])
def test_a_full_queue_counts_the_results_it_drops_not_the_events(policy, queued, dropped):
    pytest.importorskip("paho.mqtt.client", reason="paho-mqtt not installed (pip install 'edgekit-vision[serve]')")
    pub = publisher(1, queue_size=3, queue_policy=policy)
    try:
        for n in range(3):
            assert pub.publish_event({"event": "test", "n": n})
        assert (pub.queued, pub.dropped) == (0, 0)  # events wait too, but they are not results
        for i in range(4):
            pub.publish_result(json.dumps({"frame": i}))
        # drop_oldest: three events make way, then frame 0; drop_newest: the four results
        assert (pub.queued, pub.dropped) == (queued, dropped)
        assert pub.stats()["queued"] == pub.queued
    finally:
        pub.close(0.2)


def test_at_qos_0_the_newest_result_is_held_not_dropped():
    pytest.importorskip("paho.mqtt.client", reason="paho-mqtt not installed (pip install 'edgekit-vision[serve]')")
    pub = publisher(0)
    try:
        for i in range(5):
            assert not pub.publish_result(json.dumps({"frame": i}))
        assert (pub.dropped, pub.published, pub.queued) == (4, 0, 0)  # frame 4 waits for the connection
    finally:
        pub.close(0.2)
    assert pub.dropped == 5  # never connected: the held one is dropped too, each result counted once


def info(mid: int, rc: int = 0) -> SimpleNamespace:
    return SimpleNamespace(mid=mid, rc=rc)


def test_inflight_waits_for_the_older_messages_only():
    f = InFlight()
    f.track(info(1), 1, NO_CONN)
    f.track(info(2, NO_CONN), 2, NO_CONN)  # paho keeps it for the next connection
    f.track(info(3), 0, NO_CONN)  # QoS 0: paho does not keep it
    f.track(info(4, 9), 1, NO_CONN)  # refused (a full outgoing queue): nothing to wait for
    older = f.pending()
    assert older == {1, 2}
    f.track(info(5), 1, NO_CONN)  # newer than the connection: not waited for
    assert not f.wait(older, 0.05)
    threading.Timer(0.05, f.acknowledged, (1,)).start()
    threading.Timer(0.1, f.acknowledged, (2,)).start()
    assert f.wait(older, 5)
    assert f.pending() == {5}


def test_an_acknowledgement_that_overtakes_its_publish_is_not_waited_for():
    f = InFlight()
    f.acknowledged(7)  # paho's thread, before the publishing thread noted message 7
    f.track(info(7), 1, NO_CONN)
    assert f.pending() == frozenset()
