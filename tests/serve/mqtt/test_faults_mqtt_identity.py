"""Fault catalogue 3, items 3 and 4: no daemon of the same name evicts another, and a queue file
from another node is not replayed under this node's topics. Against a real mosquitto.

Before (issue 38): the client id was ``edgekit-<device>``; two daemons with one device name were
dropped by the broker 15 times in 15 s (each new connection takes over the client id), and the
log only said "disconnected: Unspecified error"; a cloned card replayed the first device's 51
queued results as the first device.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from edgekit.serve import node as node_module
from edgekit.serve.mqtt.presence import Presence
from edgekit.serve.mqtt.publisher import MqttOptions, MqttPublisher
from edgekit.serve.mqtt.queue import MessageQueue
from edgekit.serve.node import NODE_FILE, load_node
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon_services import (  # noqa: F401 - broker: the mosquitto fixture
    MOSQUITTO,
    Subscriber,
    broker,
    make_config,
    new_daemon,
    running,
)

needs_mosquitto = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (apt-get install mosquitto)")


def warnings(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and needle in r.getMessage()]


# ------------------------------------------------------------------------------ node ids, no broker
def test_the_client_id_is_stable_per_install_and_unique_per_process(tmp_path):
    first = load_node("cam-1", tmp_path, fingerprint="")
    assert first.client_id == f"edgekit-cam-1-{first.install_id[:8]}" and first.node_id == f"cam-1@{first.install_id}"
    second = load_node("cam-1", tmp_path, fingerprint="")  # a second daemon of this install, at the same time
    assert second.install_id == first.install_id and second.client_id.startswith(first.client_id + "-")
    first.close()
    second.close()
    again = load_node("cam-1", tmp_path, fingerprint="")  # the next start: the same id (a broker ACL can pin it)
    assert again.client_id == first.client_id
    again.close()
    other = load_node("cam-1", tmp_path / "elsewhere", fingerprint="")  # another install of the same name
    assert other.client_id != first.client_id
    other.close()


def test_a_node_file_that_is_garbage_or_cannot_be_written_still_gives_a_unique_id(tmp_path, caplog):
    (tmp_path / NODE_FILE).write_bytes(b"\xff not json")
    replaced = load_node("cam-1", tmp_path, fingerprint="")
    assert len(replaced.install_id) == 12 and json.loads((tmp_path / NODE_FILE).read_text())["install_id"] == \
        replaced.install_id
    assert warnings(caplog, "is not a node file; a new one replaces it")
    replaced.close()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    one, two = load_node("cam-1", blocked / "sub"), load_node("cam-1", blocked / "sub")  # no directory possible
    assert one.path == "" and one.client_id != two.client_id


def test_the_fingerprint_reads_the_first_hardware_source(tmp_path):
    serial = tmp_path / "serial-number"
    serial.write_bytes(b"10000000abcdef01\0")
    a = node_module.machine_fingerprint((str(tmp_path / "missing"), str(serial)))
    serial.write_bytes(b"10000000abcdef02\0")
    assert len(a) == 16 and a != node_module.machine_fingerprint((str(serial),))
    assert node_module.machine_fingerprint((str(tmp_path / "missing"),)) == ""


def test_presence_names_the_other_daemon_once_and_ignores_itself_and_garbage():
    mine = Presence("edgekit/cam-1", "cam-1", "edgekit-cam-1-aaaa", "cam-1@aaaa", "i1")
    other = Presence("edgekit/cam-1", "cam-1", "edgekit-cam-1-bbbb", "cam-1@bbbb", "i2")
    assert mine.heard(mine.message()[1].encode(), "mqtt://b") == ("", False)
    for junk in (b"", b"[]", b"{}", b'{"instance": 5}', b"x" * 5000):
        assert mine.heard(junk, "mqtt://b") == ("", False)
    line, answer = mine.heard(other.message()[1].encode(), "mqtt://b")
    assert answer and "another edgekit daemon publishes as device 'cam-1'" in line and "edgekit-cam-1-bbbb" in line
    assert "another install with the same device name" in line and "\n" not in line
    assert mine.heard(other.message()[1].encode(), "mqtt://b") == ("", False)  # once per other daemon
    forged = json.dumps({"instance": "i3", "host": "evil\nWARNING forged line", "node": "cam-1@aaaa"}).encode()
    line, _ = mine.heard(forged, "mqtt://b")
    assert "\n" not in line and "a copy of this install" in line and mine.stats()["other_instances"] == 2


def test_repeated_drops_soon_after_connecting_are_named_once():
    presence = Presence("edgekit/cam-1", "cam-1", "edgekit-cam-1-aaaa", "cam-1@aaaa", "i1")
    assert presence.dropped(1.0, now=0.0) == "" and presence.dropped(1.0, now=1.0) == ""
    hint = presence.dropped(1.0, now=2.0)
    assert "another client connects with this client id (edgekit-cam-1-aaaa" in hint
    assert presence.dropped(1.0, now=3.0) == ""  # one line per episode
    assert presence.dropped(600.0, now=4.0) == ""  # a connection that held: the episode is over


# ------------------------------------------------------------------------------ against mosquitto
def _daemon(tmp_path, port: int, name: str):
    """A daemon named cam-1 whose state (node file, queue file) lives in its own folder: an install."""
    state = tmp_path / name
    state.mkdir()
    config = make_config(state, port, mqtt={"qos": 1, "queue_file": str(state / "q.jsonl"),
                                            "reconnect_min_s": 1.0, "reconnect_max_s": 1.0},
                         http={"listen": ""})
    return new_daemon(config)


@needs_mosquitto
@pytest.mark.slow  # 15 s: the done-when of item 3
def test_two_daemons_with_one_device_name_run_15_s_without_evicting_each_other(tmp_path, broker, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    sub = Subscriber(broker.port, "edgekit/cam-1/result")
    a, b = _daemon(tmp_path, broker.port, "a"), _daemon(tmp_path, broker.port, "b")
    try:
        with running(a), running(b):
            wait_until(lambda: a.mqtt.connected.is_set() and b.mqtt.connected.is_set(), 20, what="both connected")
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                time.sleep(0.2)
            drops = a.mqtt.disconnects + b.mqtt.disconnects
            named = warnings(caplog, "another edgekit daemon publishes as device 'cam-1'")
        print(f"\ntwo daemons named cam-1 for 15 s: {drops} evictions, {len(sub.on('/result'))} results delivered, "
              f"client ids {a.mqtt.client_id} and {b.mqtt.client_id}")
        assert a.mqtt.client_id != b.mqtt.client_id
        assert drops <= 1  # before: 15
        assert len(named) == 2, named  # each daemon names the other, once, in one line
        assert {json.loads(p)["device"] for p, _ in sub.on("/result")} == {"cam-1"}
    finally:
        sub.close()


@needs_mosquitto
def test_a_second_daemon_of_the_same_name_is_named_in_one_line(tmp_path, broker, caplog):  # noqa: F811
    """The quick version of the test above: each names the other within seconds."""
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    a, b = _daemon(tmp_path, broker.port, "a"), _daemon(tmp_path, broker.port, "b")
    with running(a), running(b):
        wait_until(lambda: len(warnings(caplog, "another edgekit daemon publishes")) == 2, 20,
                   what="each daemon naming the other")
        assert a.stats()["mqtt"]["other_instances"] == 1 and b.stats()["mqtt"]["other_instances"] == 1
        assert a.mqtt.disconnects + b.mqtt.disconnects == 0


@needs_mosquitto
def test_a_shared_client_id_is_named_when_the_broker_keeps_dropping_it(broker, caplog):  # noqa: F811
    """Two clients forced onto one client id (what every edgekit did before): the drops are named."""
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    pubs = [MqttPublisher("127.0.0.1", broker.port, topic="edgekit/cam-1", client_id="edgekit-cam-1",
                          options=MqttOptions(qos=1, reconnect_min_s=1, reconnect_max_s=1)) for _ in range(2)]
    for pub in pubs:
        pub.start()
    try:
        wait_until(lambda: warnings(caplog, "another client connects with this client id (edgekit-cam-1"), 30,
                   what="the evictions named")
    finally:
        for pub in pubs:
            pub.close()


@needs_mosquitto
def test_a_cloned_cards_queue_is_not_replayed_under_this_nodes_topics(tmp_path, broker, caplog):  # noqa: F811
    """The state folder of device cam-1 (its node file and a queue of 51 results left by an
    outage) copied into a second board: that board starts, connects, publishes its own results,
    and none of the first board's."""
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    state = tmp_path / "clone"
    state.mkdir()
    (state / NODE_FILE).write_text(json.dumps({"install_id": "aaaaaaaaaaaa", "machine": "board-one"}))
    first = MessageQueue(1000, path=str(state / "q.jsonl"), node="cam-1@aaaaaaaaaaaa")
    for i in range(51):
        first.append(("edgekit/cam-1/result", json.dumps({"frame": i, "from": "the first board"}), 1, False))
    first.close()
    sub = Subscriber(broker.port, "edgekit/cam-1/result")
    real = node_module.machine_fingerprint
    node_module.machine_fingerprint = lambda sources=(): "board-two"
    try:
        config = make_config(state, broker.port, mqtt={"qos": 1, "queue_file": str(state / "q.jsonl")},
                             http={"listen": ""})
        daemon = new_daemon(config)
        with running(daemon):
            wait_until(lambda: len(sub.on("/result")) >= 10, 20, what="this board's own results")
        assert not [p for p, _ in sub.on("/result") if "the first board" in p]  # before: all 51 first
        assert daemon.mqtt.client_id != "edgekit-cam-1-aaaaaaaa"
        assert len(warnings(caplog, "were written by another node (cam-1@aaaaaaaaaaaa")) == 1
        assert (state / "q.jsonl.foreign-cam-1@aaaaaaaaaaaa").exists()
    finally:
        node_module.machine_fingerprint = real
        sub.close()


def test_the_node_file_goes_beside_the_queue_else_in_the_state_directory(tmp_path):
    from edgekit.serve.node import state_directory

    assert state_directory(str(tmp_path / "q.jsonl")) == tmp_path
    assert state_directory("", {"STATE_DIRECTORY": "/var/lib/edgekit:/var/lib/other"}) == Path("/var/lib/edgekit")
    assert state_directory("", {"XDG_STATE_HOME": "/home/u/.state"}) == Path("/home/u/.state/edgekit")
    nowhere = load_node("cam-1", None)  # no home at all: unique, just not stable
    assert nowhere.path == "" and nowhere.client_id.startswith("edgekit-cam-1-")
