"""Daemon faults found in review: credentials, non-finite config, fatal camera options, moved result files."""

from __future__ import annotations

import json
import math

import pytest

from edgekit.errors import UsageError
from edgekit.serve.config.load import from_dict
from edgekit.serve.daemon import Daemon, open_source
from edgekit.serve.sink import JsonLinesSink
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon import http_get, make_config, real_runtime, running


def test_camera_credentials_never_leave_the_process(tmp_path):
    config = make_config(tmp_path, camera={"uri": "rtsp://admin:s3cret@127.0.0.1:1/stream"})
    daemon = Daemon(config, runtime_factory=real_runtime, labels=["a", "b", "c"])
    with running(daemon):
        wait_until(lambda: "camera_error" in json.loads(http_get(daemon, "/healthz")[1]), timeout=10)
        bodies = [http_get(daemon, p)[1].decode() for p in ("/healthz", "/stats", "/metrics")]
    for body in bodies:
        assert "s3cret" not in body
    assert any("***@127.0.0.1" in body for body in bodies)


@pytest.mark.parametrize("table,key", [("camera", "reconnect_min_s"), ("camera", "stall_timeout_s")])
def test_non_finite_numbers_are_refused(table, key):
    with pytest.raises(UsageError, match="not a finite number"):
        from_dict({"model": {"path": "m"}, table: {key: math.nan}}, where="serve.toml")
    with pytest.raises(UsageError, match="not a finite number"):
        from_dict({"model": {"path": "m"}, table: {key: math.inf}}, where="serve.toml")


def test_wrong_camera_option_is_fatal_not_retried_forever(tmp_path):
    config = make_config(tmp_path, camera={"options": {"bogus": 1}})
    daemon = Daemon(config, runtime_factory=real_runtime, labels=["a", "b", "c"])
    with pytest.raises(UsageError, match="bogus"):  # at start: checked against the scheme table
        daemon.start()
    daemon.close()
    # A camera factory of the caller's own is not checked at start: the capture thread gives up.
    daemon = Daemon(config, runtime_factory=real_runtime, labels=["a", "b", "c"], camera_factory=open_source)
    daemon.start()
    with pytest.raises(UsageError, match="bogus"):
        daemon.run(duration_s=10)


def test_relative_camera_path_is_relative_to_the_config_file(tmp_path):
    cfg = from_dict({"model": {"path": "m"}, "camera": {"uri": "file:clips/a.avi"}}, "serve.toml", tmp_path)
    assert cfg.camera.uri == f"file:{tmp_path / 'clips' / 'a.avi'}"
    cfg = from_dict({"model": {"path": "m"}, "camera": {"uri": "synthetic"}}, "serve.toml", tmp_path)
    assert cfg.camera.uri == "synthetic"


def test_results_file_removed_under_the_daemon_is_reopened(tmp_path):
    target = tmp_path / "results.jsonl"
    sink = JsonLinesSink(str(target), max_bytes=10_000_000, backups=2)
    for i in range(5):
        sink.write({"i": i})
    target.unlink()
    for i in range(5, 10):
        sink.write({"i": i})
    sink.close()
    assert [json.loads(line)["i"] for line in target.read_text().splitlines()] == [5, 6, 7, 8, 9]
    assert sink.errors == 0 and sink.lines == 10  # nothing lost, so nothing to count
