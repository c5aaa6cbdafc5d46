"""The MQTT queue on disk ([mqtt] queue_file) without a broker: what a restart reads back, a torn
or corrupt file, the bound, acknowledgements, compaction, and files that are refused; and the
strict parsing of MQTT commands (edgekit.serve.mqtt.control)."""

from __future__ import annotations

import json
import logging
import os

import pytest

from edgekit.errors import UsageError
from edgekit.serve.mqtt import queue as mqtt_queue
from edgekit.serve.mqtt.control import CommandRefused, Controls, parse_command
from edgekit.serve.mqtt.queue import MessageQueue


def item(i: int, topic: str = "edgekit/cam-1/result") -> tuple:
    return topic, json.dumps({"frame": i}), 1, False


def frames(queue: MessageQueue) -> list[int]:
    """Drain ``queue`` as a replay would (each message acknowledged), returning the frames in order."""
    got = []
    mid = 0
    while len(queue):
        topic, payload, _, _ = queue.peek()
        if topic.endswith("/result"):  # a daemon's queue holds its state messages too
            got.append(json.loads(payload)["frame"])
        mid += 1
        queue.sent(mid)
        queue.acknowledged(mid)
    return got


def test_a_restart_reads_back_what_was_queued_in_order(tmp_path):
    path = str(tmp_path / "q.jsonl")
    q = MessageQueue(100, path=path)
    for i in range(5):
        q.append(item(i))
    q.close()
    again = MessageQueue(100, path=path)
    assert again.loaded == 5 and frames(again) == [0, 1, 2, 3, 4]
    assert os.path.getsize(path) == 0  # everything acknowledged: the file is emptied
    again.close()
    assert MessageQueue(100, path=path).loaded == 0
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_a_torn_last_line_and_garbage_are_skipped_with_one_warning(tmp_path, caplog):
    path = tmp_path / "q.jsonl"
    q = MessageQueue(100, path=str(path))
    for i in range(3):
        q.append(item(i))
    q.close()
    lines = path.read_bytes().splitlines(keepends=True)
    garbage = [b"not json\n", b'{"seq": "1", "topic": "x", "qos": 1, "retain": false, "payload": ""}\n',
               b'{"seq": 7, "topic": "a/#", "qos": 1, "retain": false, "payload": "wildcard"}\n',
               b'{"seq": 8, "topic": "a", "qos": 0, "retain": false, "payload": "qos 0 is never queued"}\n',
               b"\xff\xfe\x00binary\n", b"[1, 2]\n", b"x" * (mqtt_queue.MAX_LINE + 10) + b"\n"]
    path.write_bytes(lines[0] + b"".join(garbage) + b"".join(lines[1:]) + lines[2][:25])  # a torn copy at the end
    with caplog.at_level(logging.WARNING, logger="edgekit.serve"):
        again = MessageQueue(100, path=str(path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"skipped {len(garbage) + 1} unreadable records" in warnings[0]
    assert frames(again) == [0, 1, 2]
    again.close()


def test_the_queue_is_bounded_on_disk_too(tmp_path):
    path = str(tmp_path / "q.jsonl")
    q = MessageQueue(3, "drop_oldest", path)
    assert [q.append(item(i)) for i in range(5)] == [0, 0, 0, 1, 1]  # two dropped (counted by the caller)
    q.close()
    again = MessageQueue(3, "drop_oldest", path)
    assert frames(again) == [2, 3, 4]
    again.close()
    newest = MessageQueue(3, "drop_newest", path)
    assert [newest.append(item(i)) for i in range(5)] == [0, 0, 0, 1, 1]
    newest.close()
    assert frames(MessageQueue(2, path=path)) == [1, 2]  # a smaller queue_size keeps the newest


def test_a_long_outage_keeps_the_file_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(mqtt_queue, "COMPACT_MIN_BYTES", 4096)
    path = str(tmp_path / "q.jsonl")
    q = MessageQueue(20, "drop_oldest", path)
    for i in range(5000):  # a long outage: every new message drops the oldest
        q.append(item(i))
        assert os.path.getsize(path) <= 2 * 20 * 80 + 4096 + 200
    q.close()
    assert frames(MessageQueue(20, path=path)) == list(range(4980, 5000))


def test_unacknowledged_messages_stay_for_the_next_start(tmp_path):
    """A message replayed but not acknowledged by the broker when the daemon stops is sent again."""
    path = str(tmp_path / "q.jsonl")
    q = MessageQueue(10, path=path)
    for i in range(4):
        q.append(item(i))
    for mid in (1, 2, 3):
        q.sent(mid)
    q.acknowledged(2)  # acknowledgements may come out of order: 1 and 3 are still in flight
    q.acknowledged(99)  # someone else's message
    assert len(q) == 1 and not q.settled()
    q.close()
    # the file records a settled prefix: 2 comes again with 1 (QoS 1 is at least once)
    assert frames(MessageQueue(10, path=path)) == [0, 1, 2, 3]


def test_files_that_are_not_a_queue_file_are_refused_in_one_line(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    (tmp_path / "dir").mkdir()
    for name, words in (("fifo", "FIFO"), ("link", "symbolic link"), ("dir", "directory")):
        with pytest.raises(UsageError, match=words):
            MessageQueue(10, path=str(tmp_path / name))
    first = MessageQueue(10, path=str(tmp_path / "q.jsonl"))
    with pytest.raises(UsageError, match="in use by another process"):
        MessageQueue(10, path=str(tmp_path / "q.jsonl"))
    first.close()
    MessageQueue(10, path=str(tmp_path / "q.jsonl")).close()  # free again once closed


@pytest.mark.parametrize("name, payload, value", [
    ("detect", b"ON", True), ("detect", b"OFF", False), ("reload", b"", None), ("reload", b"PRESS", None),
    ("threshold", b"0.65", 0.65), ("threshold", b"1", 1.0), ("threshold", b"0", 0.0), ("threshold", b"1.000", 1.0),
])
def test_commands_parse(name, payload, value):
    assert parse_command(name, payload) == value


@pytest.mark.parametrize("name, payload, why", [
    ("explode", b"", "unknown command"), ("detect", b"on", "ON or OFF"), ("detect", b"ON\n", "ON or OFF"),
    ("detect", b"ON", "retained"), ("reload", b"now", "empty payload or PRESS"),
    ("threshold", b"1.5", "above 1"), ("threshold", b"nan", "decimal number"), ("threshold", b"1e-1", "decimal"),
    ("threshold", b"-0.1", "decimal"), ("threshold", b" 0.5", "decimal"), ("threshold", b"0." + b"5" * 40, "bytes"),
    ("threshold", b"\xff", "ASCII"),
])
def test_bad_commands_are_refused_saying_why(name, payload, why):
    with pytest.raises(CommandRefused, match=why):
        parse_command(name, payload, retained=why == "retained")


def test_answers_carry_the_state_and_a_flood_gets_none(caplog, monkeypatch):
    # the records must reach caplog whatever an earlier in-process CLI run left on the edgekit logger
    # (-q sets it to ERROR with propagation off: a clean-clone CI run failed here on that alone)
    monkeypatch.setattr(logging.getLogger("edgekit"), "propagate", True)
    caplog.set_level(logging.DEBUG, logger="edgekit")
    now = [0.0]
    controls = Controls("edgekit/cam-1", 0.5, reload=None, clock=lambda: now[0])
    [(topic, body)] = controls.handle("edgekit/cam-1/set/threshold", b"2")
    answer = json.loads(body)
    assert topic == "edgekit/cam-1/set/threshold/state" and answer["ok"] is False and answer["state"] == "0.5"
    [(topic, body)] = controls.handle("edgekit/cam-1/set/x\ny", b"payload")
    assert topic == "edgekit/cam-1/set/unknown/state" and json.loads(body)["command"] == "unknown"
    assert "\n" not in caplog.records[-1].getMessage()  # an untrusted name cannot forge log lines
    [(_, body)] = controls.handle("edgekit/cam-1/set/reload", b"")
    assert json.loads(body)["ok"] is False and "not available" in json.loads(body)["error"]
    answers = [controls.handle("edgekit/cam-1/set/detect", b"OFF") for _ in range(20)]
    assert sum(1 for a in answers if a) == 7 and controls.counts["ignored"] == 13  # a burst of 10, 3 used above
    now[0] += 1.0
    assert controls.handle("edgekit/cam-1/set/detect", b"ON") and controls.detect


def test_queue_file_settings_are_checked(tmp_path):
    from edgekit.serve.config.load import from_dict

    with pytest.raises(UsageError, match="needs queue_size > 0"):
        from_dict({"mqtt": {"queue_file": str(tmp_path / "q.jsonl"), "queue_size": 0}})
    with pytest.raises(UsageError, match="an existing directory"):
        from_dict({"mqtt": {"queue_file": str(tmp_path / "missing" / "q.jsonl")}})
    with pytest.raises(UsageError, match=r"\[mqtt\] commands must be true/false"):
        from_dict({"mqtt": {"commands": "yes"}})
    config = from_dict({"mqtt": {"queue_file": "q.jsonl", "commands": True}}, base_dir=tmp_path)
    assert config.mqtt.queue_file == str(tmp_path / "q.jsonl") and config.mqtt.commands
    assert not from_dict({}).mqtt.commands and from_dict({}).mqtt.queue_file == ""  # both off by default


def test_a_killed_daemon_leaves_its_queue_whole_on_disk(tmp_path):
    """SIGKILL while the broker is unreachable: every record is in the file (written at once,
    whatever the fsync), and the next start reads them back in order."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    queue_file = tmp_path / "q.jsonl"
    script = (
        f"import sys; sys.path.insert(0, {str(root)!r})\n"
        "from pathlib import Path\n"
        "from tests.serve.test_daemon_services import make_config, new_daemon, free_port\n"
        f"config = make_config(Path({str(tmp_path)!r}), free_port(), http={{'listen': ''}},\n"
        f"                     mqtt={{'qos': 1, 'publish': 'every', 'queue_file': {str(queue_file)!r}}})\n"
        "new_daemon(config).run()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if queue_file.exists() and queue_file.read_bytes().count(b"/result") >= 20:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    written = [json.loads(line)["frame"] for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    queue = MessageQueue(1000, path=str(queue_file))
    replayed = frames(queue)
    print(f"\nSIGKILL during an outage: {len(replayed)} of {len(written)} results written were in the queue file")
    assert len(replayed) >= 20 and replayed == sorted(replayed) and set(replayed) <= set(written)
    assert replayed == written[-len(replayed):] or replayed == written[-len(replayed) - 1:-1]  # at most the last
    queue.close()


def test_discovery_offers_the_commands_to_home_assistant():
    from edgekit.serve.mqtt.discovery import discovery_messages

    plain = dict(discovery_messages("edgekit/gate", "gate", []))
    assert not [t for t in plain if "/switch/" in t or "/button/" in t or "/number/" in t]  # commands off
    messages = {t: json.loads(p) for t, p in discovery_messages("edgekit/gate", "gate", [], commands=True)}
    switch = messages["homeassistant/switch/gate/detect/config"]
    assert switch["command_topic"] == "edgekit/gate/set/detect"
    assert switch["state_topic"] == "edgekit/gate/set/detect/state" and "value_json.state" in switch["value_template"]
    assert (switch["payload_on"], switch["state_off"]) == ("ON", "OFF")
    button = messages["homeassistant/button/gate/reload/config"]
    assert button["command_topic"] == "edgekit/gate/set/reload" and button["payload_press"] == "PRESS"
    number = messages["homeassistant/number/gate/threshold/config"]
    assert (number["min"], number["max"], number["command_topic"]) == (0, 1, "edgekit/gate/set/threshold")
    assert parse_command("threshold", b"%.2f" % 0.15000000000000002) == 0.15  # what round(2) sends is accepted
    known = {"name", "command_topic", "state_topic", "value_template", "payload_on", "payload_off", "state_on",
             "state_off", "payload_press", "command_template", "min", "max", "step", "mode", "icon", "unique_id",
             "default_entity_id", "availability_topic", "payload_available", "payload_not_available", "device"}
    for entity in (switch, button, number):  # the field names of Home Assistant's MQTT switch, button, number
        assert set(entity) <= known, set(entity) - known
        assert entity["availability_topic"] == "edgekit/gate/availability"
