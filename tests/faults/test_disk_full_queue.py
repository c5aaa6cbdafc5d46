"""Fault catalogue 3, items 2 and 4: the MQTT queue file loses nothing it claims to keep.

Before, measured on the same cases (issue 38): a queue file deleted during an outage was
appended to as an unlinked inode, "60 messages kept for the next start" was logged and the
next start loaded 0; on a disk that filled during an outage "161 messages kept" was logged with
128 on disk, and the next start refused to run ("queue_file cannot be rewritten: No space left
on device", exit 2); a queue file from another node (a cloned SD card) was replayed as this one.

Each case asserts what the log line claims against what the file holds, and what the next
start loads. A full disk is a real tmpfs (skipped where mount is refused, as test_disk_full.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from edgekit.serve.mqtt import queue_file
from edgekit.serve.mqtt.queue import MessageQueue
from edgekit.serve.mqtt.queue_file import read_queue_file
from edgekit.serve.node import load_node
from tests.faults.test_disk_full import _fill, full_disk  # noqa: F401 - the tmpfs fixture

A, B = "cam-1@aaaaaaaaaaaa", "cam-1@bbbbbbbbbbbb"
RESULT = "edgekit/cam-1/result"


def item(i: int, pad: int = 400) -> tuple:
    return RESULT, json.dumps({"frame": i, "pad": "x" * pad}), 1, False


def on_disk(path: Path) -> list[int]:
    """The frames a next start would load (read as the daemon reads, node check off)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return [json.loads(payload)["frame"] for _, (topic, payload, _, _) in read_queue_file(fd, 10**6).items
                if topic == RESULT]  # a daemon queues its state messages beside the results
    finally:
        os.close(fd)


def lines(caplog, level=logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level and r.name == "edgekit.serve"]


def test_a_queue_file_deleted_during_an_outage_is_written_anew_with_everything(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    path = tmp_path / "q.jsonl"
    q = MessageQueue(1000, path=str(path), node=A)
    for i in range(10):
        q.append(item(i))
    path.unlink()  # a user, a cleanup script, a tmpfiles rule
    for i in range(10, 60):
        q.append(item(i))
    assert q.where() == (60, 0)
    q.close({RESULT})
    assert on_disk(path) == list(range(60))  # before: 0 (appended to the unlinked inode)
    assert f"MQTT queue {path}: 60 results kept on disk for the next start" in lines(caplog)
    assert len([m for m in lines(caplog, logging.WARNING) if "removed or replaced" in m]) == 1
    again = MessageQueue(1000, path=str(path), node=A)
    assert again.loaded == 60
    again.close()


def test_a_queue_file_replaced_during_an_outage_is_written_anew(tmp_path):
    path = tmp_path / "q.jsonl"
    q = MessageQueue(1000, path=str(path), node=A)
    for i in range(5):
        q.append(item(i))
    (tmp_path / "other").write_text("not a queue\n")
    os.replace(tmp_path / "other", path)  # e.g. a restore from a backup
    q.append(item(5))
    q.close()
    assert on_disk(path) == list(range(6))


def test_a_disk_that_fills_during_an_outage_keeps_what_it_can_and_says_exactly_what(full_disk, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    path = full_disk / "q.jsonl"
    q = MessageQueue(1000, path=str(path), node=A)
    for i in range(700):  # ~300 kB of records on a 256 KiB disk
        q.append(item(i))
    kept, memory = q.where({RESULT})
    assert kept and memory and kept + memory == 700 and q.write_errors
    q.close({RESULT})
    assert on_disk(path) == list(range(kept))  # the oldest, whole: what the line below says
    claim = [m for m in lines(caplog, logging.WARNING) if "lost with this stop" in m]
    assert claim == [f"MQTT queue {path}: {kept} results on disk for the next start, {memory} only in memory and "
                     f"lost with this stop (the file could not take them: {q.write_errors} write errors)"]
    # the next start on the still-full disk runs (before: exit 2), with what the file holds
    again = MessageQueue(1000, path=str(path), node=A)
    assert again.loaded == kept
    again.append(item(10_000))  # the disk is full: in memory, said by where()
    assert again.where() == (kept, 1)
    again.close()


def test_what_only_memory_held_is_written_once_the_disk_has_room(full_disk):  # noqa: F811
    path = full_disk / "q.jsonl"
    (full_disk / "ballast").write_bytes(b"\0" * (200 << 10))
    q = MessageQueue(1000, path=str(path), node=A)
    for i in range(200):
        q.append(item(i))
    kept, memory = q.where()
    assert memory, "the disk never filled"
    (full_disk / "ballast").unlink()  # someone makes room
    q.append(item(200))
    assert q.where() == (201, 0)
    q.close()
    assert on_disk(path) == list(range(201))


def test_the_daemon_starts_on_a_full_disk_with_its_queue_file(full_disk, caplog):  # noqa: F811
    """Startup on a full disk: the file written by the last run is loaded and kept as it is (it
    cannot be compacted), the daemon runs, one warning says so."""
    path = full_disk / "q.jsonl"
    q = MessageQueue(1000, path=str(path), node=A)
    for i in range(40):
        q.append(item(i))
    q.close()
    _fill(full_disk)
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    again = MessageQueue(1000, path=str(path), node=A)
    assert again.loaded == 40
    warnings = lines(caplog, logging.WARNING)
    assert warnings == [f"MQTT queue {path} cannot be rewritten (No space left on device): its messages stay in "
                        "it as they are and are sent first; the daemon runs on"]
    for mid in range(1, 41):  # replayed and acknowledged: the file is emptied, which needs no space
        again.sent(mid)
        again.acknowledged(mid)
    assert again.settled() and path.stat().st_size == 0
    again.close()


@pytest.fixture
def no_inodes(tmp_path):
    """A tmpfs whose inodes are all used: not even an empty file can be created."""
    mnt = tmp_path / "noinodes"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,nr_inodes=8", "tmpfs", str(mnt)],
                          capture_output=True, text=True, timeout=10, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        for i in range(100):
            try:
                (mnt / f"f{i}").touch()
            except OSError:
                break
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=10)


def test_a_queue_file_that_cannot_be_created_leaves_the_queue_in_memory(no_inodes, caplog):
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    path = no_inodes / "q.jsonl"
    q = MessageQueue(100, path=str(path), node=A)  # before: a UsageError (exit 2)
    q.append(item(1))
    assert q.where() == (0, 1) and len(q) == 1
    q.close()
    warnings = lines(caplog, logging.WARNING)
    assert len(warnings) == 2 and "cannot be opened (No space left on device): the queue is kept in memory" \
        in warnings[0] and "0 messages on disk for the next start, 1 only in memory" in warnings[1], warnings


def test_a_foreign_nodes_queue_is_set_aside_in_one_line_not_replayed(tmp_path, caplog):
    path = tmp_path / "q.jsonl"
    q = MessageQueue(1000, path=str(path), node=A)
    for i in range(51):
        q.append(item(i))
    q.close()
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    clone = MessageQueue(1000, path=str(path), node=B)  # the card, cloned into a second device
    assert clone.loaded == 0 and len(clone) == 0  # before: 51, replayed as the first device
    aside = Path(clone.set_aside)
    assert aside.name == f"q.jsonl.foreign-{A}" and on_disk(aside) == list(range(51))  # nothing lost
    warnings = lines(caplog, logging.WARNING)
    assert warnings == [f"MQTT queue {path}: 51 messages were written by another node ({A}; this is {B}: a cloned "
                        f"card?) and are not sent under its topics; kept in {aside} (to send them as this device: "
                        "[mqtt] foreign_queue = \"replay\" and move the file back)"]
    clone.append(item(100))  # this node's own queue goes on in a fresh file
    clone.close()
    assert on_disk(path) == [100]


def test_a_foreign_queue_is_replayed_only_on_request(tmp_path, caplog):
    path = tmp_path / "q.jsonl"
    q = MessageQueue(1000, path=str(path), node=A)
    for i in range(5):
        q.append(item(i))
    q.close()
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    taken = MessageQueue(1000, path=str(path), node=B, foreign="replay")
    assert taken.loaded == 5 and not taken.set_aside
    assert [m for m in lines(caplog, logging.WARNING)] == [
        f"MQTT queue {path}: 5 messages written by {A} are replayed as this node ({B}) ([mqtt] foreign_queue = "
        "\"replay\")"]
    taken.close()


def test_a_cloned_card_gets_its_own_node_id_so_its_queue_is_foreign(tmp_path, caplog):
    """End to end without a broker: the state directory (node file and queue file) copied to
    another machine: that machine's fingerprint differs, it takes a new install id, and the queue
    of the first is not replayed there."""
    state = tmp_path / "state"
    state.mkdir()
    first = load_node("cam-1", state, fingerprint="board-one")
    q = MessageQueue(100, path=str(state / "q.jsonl"), node=first.node_id)
    for i in range(3):
        q.append(item(i))
    q.close()
    first.close()
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    second = load_node("cam-1", state, fingerprint="board-two")  # the same card in another board
    assert second.install_id != first.install_id and second.client_id != first.client_id
    assert any("made on another machine (a cloned card or disk?)" in m for m in lines(caplog, logging.WARNING))
    clone = MessageQueue(100, path=str(state / "q.jsonl"), node=second.node_id)
    assert clone.loaded == 0 and clone.set_aside
    clone.close()
    second.close()
    again = load_node("cam-1", state, fingerprint="board-two")
    assert again.install_id == second.install_id  # stable from then on
    again.close()


def test_an_old_untagged_queue_file_is_still_this_nodes(tmp_path):
    """A file written before node ids (no "node" in its records) is replayed after an upgrade."""
    path = tmp_path / "q.jsonl"
    q = MessageQueue(100, path=str(path))  # node "" writes untagged records, as edgekit did
    for i in range(3):
        q.append(item(i))
    q.close()
    assert b'"node"' not in path.read_bytes()
    upgraded = MessageQueue(100, path=str(path), node=A)
    assert upgraded.loaded == 3
    upgraded.close()


def test_the_file_is_read_back_in_a_bounded_way(tmp_path, monkeypatch, caplog):
    """Only the newest MAX_READ_BYTES are read (before: a 180 MB file was read whole, RSS 290 MB);
    at most about twice queue_size records are held while reading."""
    monkeypatch.setattr(queue_file, "MAX_READ_BYTES", 64 << 10)
    path = tmp_path / "q.jsonl"
    with path.open("wb") as f:
        for i in range(1, 2001):  # ~900 kB of records, as a long outage with a large queue_size leaves
            f.write(queue_file.record_line(i, item(i - 1), A))
    fd = os.open(path, os.O_RDONLY)
    try:
        contents = read_queue_file(fd, 1000, A)
    finally:
        os.close(fd)
    assert contents.unread_bytes > 800 << 10 and 0 < len(contents.items) < 200
    assert [seq for seq, _ in contents.items] == list(range(2001 - len(contents.items), 2001))  # the newest
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    q = MessageQueue(1000, path=str(path), node=A)
    assert q.loaded == len(contents.items)
    assert any("larger than the 0.0625 MiB read back" in m for m in lines(caplog, logging.WARNING))
    q.close()


def test_serve_starts_on_a_full_disk_with_its_queue_and_runs(full_disk, tmp_path, caplog):  # noqa: F811
    """The daemon itself (before: exit 2, "queue_file cannot be rewritten: No space left on
    device", camera, model and results down): it starts, serves, queues what it can and says
    at the stop exactly what is on disk and what only in memory."""
    from tests.helpers.waiting import wait_until
    from tests.serve.test_daemon_services import free_port, make_config, new_daemon, running

    identity = load_node("cam-1", full_disk)  # the last run made it
    identity.close()
    path = full_disk / "q.jsonl"
    q = MessageQueue(1000, path=str(path), node=identity.node_id)
    for i in range(40):
        q.append(item(i))
    q.close()
    _fill(full_disk)
    caplog.set_level(logging.INFO, logger="edgekit.serve")
    config = make_config(tmp_path, free_port(), mqtt={"qos": 1, "queue_file": str(path)}, http={"listen": ""})
    daemon = new_daemon(config)  # the broker is down: results queue
    with running(daemon):
        wait_until(lambda: daemon.stats()["mqtt"]["queue_in_memory"] >= 5, 30, what="results queued in memory")
        mqtt = daemon.stats()["mqtt"]
        # the last run's 40, and a few new ones the file's last page still took
        assert mqtt["queue_on_disk"] >= 40 and mqtt["queue_write_errors"] >= 1
        assert daemon.health()[0]  # inference and the results file go on
    kept = on_disk(path)
    assert kept[:40] == list(range(40))
    [claim] = [m for m in lines(caplog, logging.WARNING) if "lost with this stop" in m]
    assert claim.startswith(f"MQTT queue {path}: {len(kept)} results on disk for the next start, ")  # exactly
