"""The daemon's parts on their own: systemd watchdog, counters, camera health, model
supervision with backoff, and the capture thread (real threads, a real ONNX model, real sockets)."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from edgekit.camera import Frame
from edgekit.camera.mailbox import FrameMailbox
from edgekit.errors import CameraError, UsageError
from edgekit.metrics import PipelineMetrics
from edgekit.serve.capture import Capture
from edgekit.serve.config.load import override
from edgekit.serve.stats import Counters, camera_health, percentiles, stats_line
from edgekit.serve.supervisor import ModelSupervisor
from edgekit.serve.systemd import Watchdog
from tests.helpers.real_models import Hooked
from tests.serve.test_daemon import make_config, real_runtime


def test_watchdog_pings_at_half_the_interval_systemd_asked_for(tmp_path, monkeypatch):
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(address)
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        dog = Watchdog({"WATCHDOG_USEC": "2000000"})  # WatchdogSec=2 -> a ping every second
        assert dog.interval_s == 1.0
        assert [dog.tick(t) for t in (10.0, 10.5, 10.99, 11.0)] == [True, False, False, True]
        assert server.recv(64) == b"WATCHDOG=1" and server.recv(64) == b"WATCHDOG=1"
        assert not Watchdog({}).tick(10.0)  # no WatchdogSec: nothing to do


def test_counters_add_together_and_snapshot_is_a_copy():
    c = Counters()
    c.add("frames", captured=3, skipped=2)
    snap = c.snapshot()
    c.add("errors", camera=1)
    assert snap["frames"] == {"captured": 3, "processed": 0, "skipped": 2, "bad": 0}
    assert snap["errors"]["camera"] == 0 and c.get("errors", "camera") == 1
    with pytest.raises(KeyError):
        c.add("frames", typo=1)


def test_camera_health_says_why_not():
    assert camera_health(True, "", 0, 100, 1.0) == (True, None)
    assert camera_health(False, "cannot open camera v4l2:0: busy", None, 0, 1.0) == (
        False, "cannot open camera v4l2:0: busy")
    assert camera_health(True, "", None, 0, 1.0) == (False, "no frame yet")
    assert camera_health(True, "", 0, 2_500_000_000, 1.0) == (False, "no frame for 2.5 s")


def test_percentiles_and_stats_line():
    assert percentiles([]) == {"count": 0}
    p = percentiles([1_000_000, 2_000_000, 3_000_000])
    assert p["count"] == 3 and p["p50"] == 2.0 and p["max"] == 3.0
    stats = {"frames": {"processed": 5, "skipped": 1, "bad": 0}, "fps": {"camera": 30.0, "process": 29.5},
             "latency_ms": {"inference": p, "end_to_end": {"count": 0}}, "health": {"ready": 1}}
    assert stats_line(stats).startswith("frames 5 processed, 1 skipped, 0 bad; fps camera 30.0 process 29.5")


def test_supervisor_reopens_a_failing_model_with_backoff(tmp_path):
    config = make_config(tmp_path, model={"reopen_after_errors": 2},
                         camera={"reconnect_min_s": 1.0, "reconnect_max_s": 4.0})
    opens = []

    def factory():
        opens.append(1)
        if 2 <= len(opens) <= 4:
            raise CameraError("Edge TPU not found")  # still unplugged
        return Hooked(real_runtime())  # the factory fails on cue, then opens a real model (closed is recorded)

    counters, sink = Counters(), PipelineMetrics(warmup=0, window=10)
    model = ModelSupervisor(config, factory, ["cat", "dog", "bird"], sink, counters, clock=lambda: 0)
    model.open()
    first = model.pipeline
    assert model.ok and first.metrics is sink
    model.failed(RuntimeError("USB transfer error"))
    assert not model.ok and model.pipeline is first and model.error == "RuntimeError: USB transfer error"
    model.failed(RuntimeError("USB transfer error"))
    assert model.pipeline is None and first.runtime.closed
    # reopen attempts: fail at t=0 (retry in 1 s), t=1 (2 s), t=3 (4 s), then succeed at t=7
    assert model.retry(0.0) and model.retry(0.5) is False and model.retry(1.0)
    assert model.retry(2.9) is False and model.retry(3.0) and model.retry(6.9) is False
    assert "cannot reopen the model: Edge TPU not found" in model.error
    assert model.retry(7.0) and model.ok and model.pipeline.metrics is sink
    snap = counters.snapshot()
    assert snap["errors"]["inference"] == 2 and snap["reconnects"]["model"] == 1 and len(opens) == 5


def test_supervisor_opens_the_configured_model_and_takes_its_labels(tmp_path):
    from tests.helpers import tflite_models

    config = override(make_config(tmp_path), "model", path=str(tflite_models.model_path("small_int8")))
    model = ModelSupervisor(config, None, None, PipelineMetrics(warmup=0), Counters(), clock=lambda: 0)
    with pytest.raises(UsageError, match="no model to serve"):
        ModelSupervisor(override(config, "model", path=""), None, None, PipelineMetrics(), Counters(),
                        clock=lambda: 0).open()
    model.open()
    assert model.runtime_info["backend"] and model.labels is not None
    model.close()
    assert model.pipeline is None


class Frames:
    def __init__(self, n, fail=False):
        self.n, self.fail, self.closed = n, fail, False

    def __iter__(self):
        for i in range(self.n):
            yield Frame(np.zeros((4, 4, 3), np.uint8), i, i * 2)  # every other frame dropped at the source
        if self.fail:
            raise CameraError("unplugged")

    def close(self):
        self.closed = True


def test_capture_counts_source_gaps_and_stops_at_the_end_of_a_clip(tmp_path):
    config = make_config(tmp_path, camera={"on_end": "stop"}).camera
    counters, stop, slot = Counters(), threading.Event(), FrameMailbox()
    source = Frames(5)
    capture = Capture(config, lambda uri, options: source, slot, counters, stop, clock=lambda: 1)
    capture.start()
    assert capture.ended.wait(5)
    capture.join()
    frames = counters.snapshot()["frames"]
    assert frames["captured"] == 9 and frames["skipped"] == 4 + 4  # 4 gaps + 4 overwritten in the mailbox
    assert slot.take(0.1).index == 8 and source.closed and not capture.is_open


def test_capture_gives_up_on_a_wrong_option_and_stops_the_daemon(tmp_path):
    config = make_config(tmp_path).camera
    stop = threading.Event()

    def factory(uri, options):
        raise UsageError("camera synthetic has no option 'bogus'")

    capture = Capture(config, factory, FrameMailbox(), Counters(), stop, clock=lambda: 1)
    capture.start()
    assert stop.wait(5)
    capture.join()
    assert isinstance(capture.fatal, UsageError) and "bogus" in capture.error


def test_capture_reconnects_after_a_lost_camera(tmp_path):
    config = make_config(tmp_path, camera={"reconnect_min_s": 0.01, "reconnect_max_s": 0.02}).camera
    counters, stop = Counters(), threading.Event()
    sessions = []

    def factory(uri, options):
        sessions.append(Frames(2, fail=True))
        if len(sessions) == 3:
            stop.set()
        return sessions[-1]

    capture = Capture(config, factory, FrameMailbox(), counters, stop, clock=lambda: 1)
    capture.start()
    assert stop.wait(5)
    capture.join()
    snap = counters.snapshot()
    assert snap["reconnects"]["camera"] >= 2 and snap["errors"]["camera"] >= 2 and "unplugged" in capture.error
    assert all(s.closed for s in sessions)


def test_supervisor_streak_resets_on_success_and_backoff_restarts_after_a_good_reopen(tmp_path, caplog):
    config = make_config(tmp_path, model={"reopen_after_errors": 2},
                         camera={"reconnect_min_s": 0.5, "reconnect_max_s": 8.0})
    plan = iter([None, "unplugged", "unplugged", None, "unplugged", None])  # what each open does

    def factory():  # fault injection: the factory fails on cue, else opens a real model
        if next(plan):
            raise CameraError("Edge TPU not found")
        return real_runtime()

    counters = Counters()
    model = ModelSupervisor(config, factory, ["cat", "dog", "bird"], PipelineMetrics(warmup=0), counters,
                            clock=lambda: 0)
    caplog.set_level("INFO", logger="edgekit.serve")
    model.open()
    model.failed(RuntimeError("USB transfer error"))
    model.succeeded()  # one good inference ends the streak: the next failure is the first again
    assert model.ok and model.error == ""
    model.failed(RuntimeError("USB transfer error"))
    assert model.pipeline is not None and not model.ok  # 1 in a row, not 2
    model.failed(RuntimeError("USB transfer error"))
    assert model.pipeline is None
    assert model.retry(0.0) and model.retry(0.5) and model.retry(1.5) and model.ok  # waits 0.5 s, then 1 s
    assert model.error == ""  # the reopen's success clears the last failure from /healthz
    frame = Frame(np.zeros((16, 16, 3), np.uint8), 0, 0)
    assert model.pipeline.step(frame).classification.top.label == "dog"  # the labels survive a reopen
    model.failed(RuntimeError("again"))
    model.failed(RuntimeError("again"))
    # after a good reopen the backoff starts again at reconnect_min_s, not where it left off
    assert model.retry(10.0) and model.retry(10.4) is False and model.retry(10.5) and model.ok
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "inference failed (2 in a row): RuntimeError: USB transfer error" in warnings
    assert "reopening the model after 2 failures" in warnings
    assert "cannot reopen the model: Edge TPU not found; retrying in 0.5 s" in warnings
    assert "cannot reopen the model: Edge TPU not found; retrying in 1.0 s" in warnings
    assert [r.getMessage() for r in caplog.records if r.levelname == "INFO"].count("model reopened") == 2
    assert counters.snapshot()["reconnects"]["model"] == 2


class _CloseFails:
    """A runtime whose close() raises (a wedged driver): fault injection the real adapters cannot do on cue."""

    def __init__(self):
        self.model = real_runtime()
        self.input_spec = self.model.input_spec

    def infer(self, tensor):
        return self.model.infer(tensor)

    def describe(self):
        return {"backend": "wedged"}

    def close(self):
        raise OSError("device busy")


def test_supervisor_close_logs_a_failing_close_and_goes_on(tmp_path, caplog):
    model = ModelSupervisor(make_config(tmp_path), _CloseFails, [], PipelineMetrics(warmup=0), Counters(),
                            clock=lambda: 0)
    model.open()
    caplog.set_level("WARNING", logger="edgekit.serve")
    model.close()
    assert model.pipeline is None
    assert [r.getMessage() for r in caplog.records] == ["closing the runtime failed: device busy"]
