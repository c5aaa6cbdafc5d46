"""The serve daemon through its Python API: newest-frame pipeline, skips, faults, health, outputs.

Real parts: edgekit's camera sources (synthetic pattern), the real HTTP endpoint, real
prometheus_client exposition, real files, and a real ONNX model (ONNX Runtime) wherever the
test only needs a model; a FakeRuntime where the test sets the inference time or makes it fail.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgekit.camera import Frame, open_camera
from edgekit.camera.mailbox import FrameMailbox
from edgekit.errors import CameraError
from edgekit.imaging.image import InputSpec
from edgekit.runtime.fake import FakeRuntime
from edgekit.serve.config.load import ServeConfig, override
from edgekit.serve.daemon import Daemon, RateMeter, sd_notify
from edgekit.serve.sink import JsonLinesSink
from tests.helpers.real_models import onnx_runtime
from tests.helpers.waiting import wait_until

SPEC = InputSpec(shape=(1, 16, 16, 3))
LABELS = ["cat", "dog", "bird"]


def real_runtime():
    """A real model (ONNX Runtime) on the daemon's 16x16 RGB input: 'dog' wins on every frame
    (score 0.7 to 0.79, rising with the frame's brightness), cat and bird share the rest."""
    return onnx_runtime(SPEC, weights=[0.0, 0.5, 0.0], bias=np.log([0.1, 0.7, 0.2]).tolist())


def fake_runtime(delay_s: float = 0.0, fn=None) -> FakeRuntime:
    # FakeRuntime for timing control and fault injection only: delay_s sets the inference time the
    # skip/backpressure counts depend on, fn raises on cue; every other test runs real_runtime.
    scores = np.array([[0.1, 0.7, 0.2]], np.float32)
    return FakeRuntime(fn or (lambda t: [scores]), SPEC, delay_s=delay_s)


def make_config(tmp_path, **tables) -> ServeConfig:
    """Defaults for tests: fast reconnects, results to a file, HTTP on a free port, no MQTT."""
    config = ServeConfig()
    base = {
        "model": {"path": "fake"},
        "camera": {
            "uri": "synthetic:64x48@100",
            "reconnect_min_s": 0.02,
            "reconnect_max_s": 0.1,
            "stall_timeout_s": 0.5,
        },
        "output": {"jsonl": str(tmp_path / "results.jsonl")},
        "http": {"listen": "127.0.0.1:0"},
    }
    for table, values in tables.items():
        base.setdefault(table, {}).update(values)
    for table, values in base.items():
        config = override(config, table, **values)
    return config


@contextmanager
def running(daemon: Daemon, **run_kwargs):
    """Run the inference loop in a thread; stop and join on exit."""
    daemon.start()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(daemon.run(**run_kwargs)), daemon=True)
    thread.start()
    try:
        yield result
    finally:
        daemon.stop()
        thread.join(10)
        assert not thread.is_alive(), "daemon did not stop"


def http_get(daemon: Daemon, path: str) -> tuple[int, bytes]:
    host, port = daemon.http_address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def read_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class ListSource:
    """A finite source of given arrays (None entries are yielded as-is: a broken driver)."""

    def __init__(self, arrays, interval_s=0.0, fail_at_end: bool = False):
        self.arrays, self.interval_s, self.fail_at_end = arrays, interval_s, fail_at_end
        self.closed = False

    def __iter__(self):
        for i, array in enumerate(self.arrays):
            if self.closed:
                return
            time.sleep(self.interval_s)
            yield Frame(array, time.perf_counter_ns(), i)
        if self.fail_at_end:
            raise CameraError("device unplugged")

    def close(self):
        self.closed = True


# ---------------------------------------------------------------------------------------- parts
def test_latest_frame_keeps_only_the_newest():
    slot = FrameMailbox()
    assert slot.put("a") is False
    assert slot.put("b") is True  # "a" was never taken: skipped
    assert slot.take(0.01) == "b"
    assert slot.take(0.01) is None
    threading.Timer(0.05, slot.put, args=("c",)).start()
    assert slot.take(2.0) == "c"  # take waits for a frame


def test_rate_meter_uses_intervals_and_forgets_old_events():
    now = [0]
    meter = RateMeter(window_s=1.0, clock=lambda: now[0])
    for t in range(0, 500_000_000, 100_000_000):  # 5 events 0.1 s apart: 4 intervals in 0.4 s
        meter.add(1, t)
    now[0] = 400_000_000
    assert meter.rate() == pytest.approx(10.0)
    now[0] = 2_000_000_000  # every event is older than the window: a stalled camera reads 0
    assert meter.rate() == 0.0


def test_json_lines_rotate_and_stay_bounded(tmp_path):
    target = tmp_path / "out" / "results.jsonl"
    sink = JsonLinesSink(str(target), max_bytes=1024, backups=2)
    for i in range(200):
        sink.write({"frame": i, "pad": "x" * 40})
    sink.close()
    files = sorted(p.name for p in target.parent.iterdir())
    assert files == ["results.jsonl", "results.jsonl.1", "results.jsonl.2"]
    assert all(p.stat().st_size <= 1024 for p in target.parent.iterdir())
    newest = read_lines(target)[-1]
    assert newest["frame"] == 199 and sink.lines == 200 and sink.errors == 0
    assert read_lines(target.with_name("results.jsonl.1"))[-1]["frame"] == read_lines(target)[0]["frame"] - 1

    truncating = JsonLinesSink(str(tmp_path / "t.jsonl"), max_bytes=1024, backups=0)
    for i in range(200):
        truncating.write({"frame": i, "pad": "x" * 40})
    truncating.close()
    assert [p.name for p in tmp_path.glob("t.jsonl*")] == ["t.jsonl"]
    assert (tmp_path / "t.jsonl").stat().st_size <= 1024


def test_json_lines_write_errors_are_counted_not_raised(tmp_path):
    sink = JsonLinesSink(str(tmp_path / "r.jsonl"))
    sink.close()  # simulate the file going away under the daemon (disk full, unmounted)
    sink.target = str(tmp_path / "missing-dir" / "r.jsonl")
    sink.write({"frame": 1})
    assert sink.errors == 1 and sink.lines == 0


def test_sd_notify_speaks_the_systemd_protocol(tmp_path, monkeypatch):
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(address)
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        assert sd_notify("READY=1")
        assert server.recv(64) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert sd_notify("READY=1") is False


# ---------------------------------------------------------------------------------------- pipeline
@pytest.mark.slow  # asserts on wall-clock time
def test_camera_faster_than_model_skips_frames_and_latency_stays_bounded(tmp_path):
    frame_interval_ms = 5.0  # 200 fps camera, 25 ms model: 4 of 5 frames must be skipped
    config = make_config(tmp_path, camera={"uri": "synthetic:64x48@200"})
    daemon = Daemon(
        config,
        runtime_factory=lambda: fake_runtime(0.025),  # timing control: a 25 ms model, 5 ms frames
        labels=LABELS,
        camera_factory=lambda uri, options: open_camera(uri, **options),
    )
    stats = daemon.run(max_frames=40)
    frames, latency = stats["frames"], stats["latency_ms"]
    assert frames["processed"] == 40
    assert frames["skipped"] >= 2 * frames["processed"]
    # Accounting: every captured frame was processed, skipped, or is the one left in flight.
    assert frames["captured"] - (frames["processed"] + frames["skipped"] + frames["bad"]) in (0, 1, 2)
    # No queue: end-to-end stays near frame interval + inference and does not grow. (A queue
    # would add 20 ms per frame here.) The p99 goal of 2 x (interval + inference p99) is
    # measured by benchmarks/daemon_throughput.py; here the median is held to it, robust to load.
    bound = 2 * (frame_interval_ms + latency["inference"]["p50"])
    assert latency["end_to_end"]["p50"] <= bound, (latency, bound)
    lines = read_lines(tmp_path / "results.jsonl")
    assert len(lines) == 40
    e2e = [line["ms"]["end_to_end"] for line in lines]
    assert np.mean(e2e[-10:]) < np.mean(e2e[:10]) + 25, e2e
    assert lines[0]["top"][0] == {"index": 1, "label": "dog", "score": 0.7}
    indices = [line["frame"] for line in lines]
    assert indices == sorted(indices) and indices[-1] - indices[0] > 2 * len(indices)  # newest frames, gaps


@pytest.mark.slow  # asserts on wall-clock time
def test_camera_that_fails_n_times_then_comes_back(tmp_path):
    attempts = []

    def camera(uri, options):
        attempts.append(time.monotonic())
        if len(attempts) <= 3:
            raise CameraError(f"cannot open {uri}: no such device")
        return open_camera(uri, **options)

    config = make_config(tmp_path, camera={"reconnect_min_s": 0.05, "reconnect_max_s": 1.0})
    daemon = Daemon(config, runtime_factory=real_runtime, camera_factory=camera, labels=LABELS)
    with running(daemon):
        status, body = http_get(daemon, "/healthz")
        if len(attempts) <= 3:  # still failing: health must be red and say why
            assert status == 503 and json.loads(body)["camera"] == "down"
        wait_until(lambda: daemon.health()[0], timeout=5)
        status, body = http_get(daemon, "/healthz")
        assert status == 200 and json.loads(body) == {"status": "ok", "camera": "ok", "model": "ok"}
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 3)
    stats = daemon.stats()
    assert stats["errors"]["camera"] == 3 and len(attempts) == 4
    gaps = np.diff(attempts)
    assert gaps[0] >= 0.045 and gaps[2] > gaps[0] * 2  # exponential backoff: 0.05, 0.1, 0.2 s


def test_camera_lost_mid_stream_turns_health_red_then_recovers(tmp_path):
    opened = []
    frame = np.zeros((48, 64, 3), np.uint8)

    def camera(uri, options):
        opened.append(1)
        if len(opened) == 1:  # the first session dies after 10 frames (USB cable pulled)
            return ListSource([frame] * 10, interval_s=0.01, fail_at_end=True)
        if len(opened) == 2:  # comes back, then stalls: delivers nothing for a while
            return ListSource([frame] * 5 + [frame], interval_s=0.01)
        return open_camera("synthetic:64x48@100")

    config = make_config(tmp_path, camera={"reconnect_min_s": 0.3, "reconnect_max_s": 0.3})
    daemon = Daemon(config, runtime_factory=real_runtime, camera_factory=camera, labels=LABELS)
    seen = []
    with running(daemon):
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not (len(opened) >= 3 and daemon.health()[0] and False in seen):
            seen.append(daemon.health()[0])
            time.sleep(0.01)
        status, _ = http_get(daemon, "/healthz")
    assert True in seen and False in seen and status == 200
    stats = daemon.stats()
    assert stats["reconnects"]["camera"] >= 2
    assert stats["errors"]["camera"] >= 2  # the loss and the end of the second session


def test_bad_frames_are_counted_and_skipped(tmp_path):
    good = np.full((48, 64, 3), 128, np.uint8)
    arrays = [
        good,
        None,
        good.astype(np.float32),
        np.zeros((0, 0, 3), np.uint8),
        np.zeros((4, 4, 2), np.uint8),
        good[:, :, 0],
        good,
    ]
    config = make_config(tmp_path, camera={"on_end": "stop"})
    # interval > inference time, so nothing is skipped and every frame is looked at
    daemon = Daemon(
        config,
        runtime_factory=real_runtime,
        labels=LABELS,
        camera_factory=lambda uri, options: ListSource(arrays, interval_s=0.03),
    )
    stats = daemon.run()
    assert stats["frames"]["bad"] == 4
    assert stats["frames"]["processed"] == 3  # two BGR frames and one gray frame
    assert [line["frame"] for line in read_lines(tmp_path / "results.jsonl")] == [0, 5, 6]


def test_failing_model_is_counted_then_reopened(tmp_path):
    opened = []

    def runtime():
        calls = {"n": 0}

        def fn(tensor):
            calls["n"] += 1
            if len(opened) == 1 and calls["n"] > 2:  # the first runtime dies after two frames
                raise RuntimeError("Edge TPU: USB transfer error")
            return [np.array([[0.2, 0.3, 0.5]], np.float32)]

        opened.append(1)
        return fake_runtime(fn=fn)  # fault injection: the first model fails from its third inference on

    config = make_config(tmp_path, model={"reopen_after_errors": 3})
    daemon = Daemon(config, runtime_factory=runtime, labels=LABELS)
    with running(daemon):
        wait_until(lambda: daemon.stats()["reconnects"]["model"] == 1)
        wait_until(lambda: daemon.stats()["frames"]["processed"] > 2)
        assert daemon.health()[0]
    stats = daemon.stats()
    assert stats["errors"]["inference"] == 3 and len(opened) == 2


@pytest.mark.slow  # asserts on wall-clock time
def test_stats_metrics_and_health_endpoints_agree(tmp_path):
    config = make_config(tmp_path)
    daemon = Daemon(
        config,
        # FakeRuntime for timing control: a known 2 ms inference shows the histogram is in seconds
        runtime_factory=lambda: fake_runtime(0.002),
        labels=LABELS,
        camera_factory=lambda uri, options: open_camera(uri, **options),
    )
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 20)
        assert daemon.http_address[0] == "127.0.0.1"
        status, body = http_get(daemon, "/metrics")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        status, stats_body = http_get(daemon, "/stats")
        stats = json.loads(stats_body)
        assert http_get(daemon, "/nope")[0] == 404
    processed = families["edgekit_frames_processed"].samples[0].value
    assert 20 <= processed <= stats["frames"]["processed"]
    inference = {s.name: s.value for s in families["edgekit_inference_seconds"].samples}
    assert inference["edgekit_inference_seconds_count"] >= 20
    assert 0.002 <= inference["edgekit_inference_seconds_sum"] / inference["edgekit_inference_seconds_count"] < 0.5
    assert families["edgekit_ready"].samples[0].value == 1.0
    # Rates are rate(..._total) in PromQL, not gauges of their own.
    assert not {"edgekit_camera_fps", "edgekit_process_fps", "edgekit_skipped_fps"} & set(families)
    assert families["edgekit_frames_captured"].samples[0].value >= processed
    post = {s.name: s.value for s in families["edgekit_postprocess_seconds"].samples}
    assert post["edgekit_postprocess_seconds_count"] == inference["edgekit_inference_seconds_count"]
    errors = {s.labels["kind"]: s.value for s in families["edgekit_errors"].samples}
    assert errors == {"camera": 0.0, "inference": 0.0, "output": 0.0}
    info = families["edgekit_info"].samples[0].labels
    assert info["backend"] == "fake" and info["camera"] == "synthetic:64x48@100"
    assert "process_resident_memory_bytes" in families
    assert stats["health"]["ready"] == 1 and stats["latency_ms"]["inference"]["count"] >= 20
    assert stats["camera"]["captured"] >= stats["frames"]["processed"]  # the source's own stats


@pytest.mark.slow  # asserts on wall-clock time
def test_stop_finishes_the_current_frame(tmp_path):
    config = make_config(tmp_path)
    runtime = fake_runtime(0.4)  # timing control: an inference still running when stop() arrives
    daemon = Daemon(config, runtime_factory=lambda: runtime, labels=LABELS)
    daemon.start()
    threading.Timer(0.15, daemon.stop).start()  # arrives while the first inference runs
    t0 = time.monotonic()
    stats = daemon.run()
    assert time.monotonic() - t0 < 2.0
    assert stats["frames"]["processed"] == 1 == runtime.calls
    assert len(read_lines(tmp_path / "results.jsonl")) == 1 and runtime.closed


def test_clip_mode_processes_to_the_end_then_returns(tmp_path):
    config = make_config(tmp_path, camera={"uri": "synthetic:64x48", "options": {"frames": 5}, "on_end": "stop"})
    daemon = Daemon(config, runtime_factory=real_runtime, labels=LABELS)
    stats = daemon.run()
    assert stats["frames"]["captured"] == 5
    assert stats["frames"]["processed"] >= 1 and stats["frames"]["processed"] + stats["frames"]["skipped"] == 5


def test_model_that_cannot_load_fails_start_with_its_error(tmp_path):
    from edgekit.errors import ModelError

    config = make_config(tmp_path, model={"path": str(tmp_path / "missing.tflite")})
    with pytest.raises(ModelError, match="does not exist"), Daemon(config):
        pass


def test_serve_does_not_import_heavy_libraries():
    code = (
        "import sys, edgekit.serve.daemon, edgekit.serve.mqtt.from_config, edgekit.serve.http.endpoint\n"
        "import edgekit.serve.config.load\n"
        "bad = [m for m in ('tensorflow', 'keras', 'torch', 'edgekit.build') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


# ---------------------------------------------------------------------------------------- deployment
ROOT = Path(__file__).resolve().parents[2]
UNIT_EXEC = "/opt/edgekit/venv/bin/edgekit"


def test_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    unit = (ROOT / "deploy" / "edgekit.service").read_text()
    assert f"ExecStart={UNIT_EXEC} serve --config /etc/edgekit/serve.toml" in unit
    # `verify` checks that ExecStart's program exists: point it at an executable that does.
    program = tmp_path / "edgekit"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    path = tmp_path / "edgekit.service"
    path.write_text(unit.replace(UNIT_EXEC, str(program)))
    proc = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=120)
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if "edgekit.service" in line]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


def test_unit_and_doc_commands_parse():
    from edgekit.cli import build_parser

    unit = (ROOT / "deploy" / "edgekit.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    commands = [shlex.split(exec_start.removeprefix(f"ExecStart={UNIT_EXEC}"))]
    doc = (ROOT / "docs" / "serve.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", doc, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("edgekit serve"):
                commands.append(shlex.split(line)[1:])
            elif "/bin/edgekit serve" in line:
                commands.append(shlex.split(line.split("/bin/edgekit", 1)[1]))
    assert len(commands) >= 5
    for argv in commands:
        args = build_parser().parse_args(argv)
        assert args.verb == "serve"


def test_doc_config_error_example_is_what_the_cli_prints(tmp_path, capsys, monkeypatch):
    from edgekit.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "serve.toml").write_text("[mqtt]\nprot = 1883\n")
    assert cli_main(["serve", "--config", "serve.toml"]) == 2
    err = capsys.readouterr().err
    doc = (ROOT / "docs" / "serve.md").read_text()
    assert err.strip() in doc, err
