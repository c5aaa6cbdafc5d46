"""The JSON-lines sink on a full disk: a real 64 KiB tmpfs when this machine lets the test mount
one (root on Linux), and always a file descriptor whose writes stop part-way (the same thing
the kernel does when the disk fills in the middle of a line)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys

import pytest

from edgekit.errors import UsageError
from edgekit.serve import sink as sink_module
from edgekit.serve.sink import JsonLinesSink


def record(i: int) -> dict:
    return {"device": "cam-1", "frame": i, "top": [{"label": "dog", "score": 0.7}], "pad": "x" * 150}


def parse_all(path) -> list[dict]:
    """Every line must be a whole JSON object (a torn line raises here)."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"file ends in a partial line: {data[-80:]!r}"
    return [json.loads(line) for line in data.decode().splitlines()]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs, unmounted afterwards; skips where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_on_a_real_tmpfs_leaves_only_whole_lines_and_counts_the_lost(tiny_disk, caplog):
    target = tiny_disk / "results.jsonl"
    sink = JsonLinesSink(str(target), max_bytes=10_000_000, backups=0)
    total = 600  # ~200 bytes each: about 120 KB, twice what the disk holds
    with caplog.at_level(logging.WARNING, logger="edgekit.serve"):
        for i in range(total):
            sink.write(record(i))
    lines = parse_all(target)
    assert sink.lines == len(lines) and sink.failed == total - len(lines)
    assert 0 < len(lines) < total and sink.failed > 0
    assert [r["frame"] for r in lines] == list(range(len(lines)))  # in order, none glued together
    assert not sink.healthy and "No space left" in sink.last_error
    assert sink.state()["healthy"] == 0
    # One warning per episode, not one per lost result.
    assert sum("cannot write results" in r.getMessage() for r in caplog.records) == 1
    print(f"\ndisk full (64 KiB tmpfs): {total} results, {sink.lines} written, {sink.failed} counted as lost")

    # Space comes back (logrotate, an operator): writing resumes, the sink is healthy again.
    target.rename(tiny_disk / "old.jsonl")
    (tiny_disk / "old.jsonl").unlink()
    with caplog.at_level(logging.WARNING, logger="edgekit.serve"):
        assert sink.write(record(total))
    assert sink.healthy and sink.last_error == ""
    assert parse_all(target) == [record(total)]
    assert any("writable again" in r.getMessage() for r in caplog.records)
    sink.close()


class ShortWrites:
    """os.write that writes only ``room`` more bytes, then raises ENOSPC (a disk filling up)."""

    def __init__(self, room: int):
        self.room = room
        self.real = os.write

    def __call__(self, fd: int, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self.real(fd, bytes(data[: self.room]))
        self.room -= n
        return n


def test_a_write_that_stops_mid_line_is_cut_back_to_the_last_newline(tmp_path, monkeypatch):
    target = tmp_path / "r.jsonl"
    sink = JsonLinesSink(str(target))
    for i in range(3):
        assert sink.write(record(i))
    full = target.stat().st_size
    writes = ShortWrites(room=50)  # the next line gets 50 of its ~200 bytes, then the disk is full
    monkeypatch.setattr(sink_module.os, "write", writes)
    assert not sink.write(record(3))
    assert not sink.write(record(4))
    assert target.stat().st_size == full  # the 50 bytes were taken back
    monkeypatch.setattr(sink_module.os, "write", writes.real)
    assert sink.write(record(5))
    assert [r["frame"] for r in parse_all(target)] == [0, 1, 2, 5]
    assert (sink.lines, sink.failed, sink.healthy) == (4, 2, True)


def test_a_torn_last_line_from_a_crash_is_cut_when_the_file_is_opened(tmp_path, caplog):
    target = tmp_path / "r.jsonl"
    target.write_text('{"frame":0}\n{"frame":1}\n{"fra')
    with caplog.at_level(logging.WARNING, logger="edgekit.serve"):
        sink = JsonLinesSink(str(target))
    sink.write({"frame": 2})
    sink.close()
    assert parse_all(target) == [{"frame": 0}, {"frame": 1}, {"frame": 2}]
    assert any("partial line" in r.getMessage() for r in caplog.records)


def test_a_file_with_no_newline_at_all_is_emptied(tmp_path):
    target = tmp_path / "r.jsonl"
    target.write_text("x" * 10_000)  # longer than one tail chunk
    JsonLinesSink(str(target)).close()
    assert target.read_bytes() == b""


def test_results_path_under_a_file_is_one_usage_error(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(UsageError, match="cannot write results to") as info:  # a path to fix: exit 2
        JsonLinesSink(str(tmp_path / "afile" / "x.jsonl"))
    assert "writable folder" in info.value.hint and "afile is not a folder" in info.value.message


def test_stdout_and_off(capsys):
    JsonLinesSink("-").write({"a": 1})
    assert capsys.readouterr().out == '{"a":1}\n'
    off = JsonLinesSink("")
    assert off.write({"a": 1}) and off.lines == 0


def test_daemon_on_a_full_disk_reports_output_down_and_loses_only_what_it_counts(tiny_disk):
    from tests.helpers.waiting import wait_until
    from tests.serve.test_daemon_services import make_config, new_daemon, running

    target = tiny_disk / "results.jsonl"
    config = make_config(tiny_disk, None, output={"jsonl": str(target), "backups": 0},
                         camera={"uri": "synthetic:64x48@500"}, http={"listen": ""})
    daemon = new_daemon(config)
    with running(daemon):
        wait_until(lambda: daemon.sink.failed > 20, timeout=20, what="the disk to fill")
        ready, details = daemon.health()
        assert not ready and details["output"] == "down" and "No space left" in details["output_error"]
        assert daemon.stats()["output"]["healthy"] == 0
    stats = daemon.stats()
    lines = parse_all(target)
    assert len(lines) == stats["output"]["lines"]
    assert stats["output"]["lines"] + stats["output"]["failed"] == stats["frames"]["processed"]
