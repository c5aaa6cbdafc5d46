"""edgekit serve against real services: a mosquitto broker and a Prometheus server started on
127.0.0.1 by the fixtures below, a real int8 .tflite made by the TF converter, and the daemon
run as ``python -m edgekit.cli serve`` for the signal tests. Every test skips, saying why, when
the Debian package it needs (``mosquitto``, ``prometheus``, ``systemd``) is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from edgekit.camera import open_camera
from edgekit.imaging.image import InputSpec
from edgekit.serve.config.load import ServeConfig, override
from edgekit.serve.daemon import Daemon
from tests.helpers.real_models import onnx_runtime
from tests.helpers.waiting import wait_until

paho = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt not installed (pip install 'edgekit-vision[serve]')")

ROOT = Path(__file__).resolve().parents[2]
MOSQUITTO = shutil.which("mosquitto") or next(
    (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None
)
PROMETHEUS = shutil.which("prometheus")
needs_mosquitto = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto not installed (apt-get install mosquitto)")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# ------------------------------------------------------------------------------------ services
class Broker:
    """A mosquitto process on 127.0.0.1:port; stop()/start() simulate a broker restart."""

    def __init__(self, directory: Path, port: int | None = None, settings: str | None = None):
        self.port = port or free_port()
        self.conf = directory / f"mosquitto-{self.port}.conf"
        settings = "allow_anonymous true\npersistence false\n" if settings is None else settings
        self.conf.write_text(f"listener {self.port} 127.0.0.1\n{settings}")
        self.log = directory / f"mosquitto-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Broker:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=self.log.open("ab"))
        wait_until(lambda: port_open(self.port) or self.proc.poll() is not None, 10, what="mosquitto start")
        assert self.proc.poll() is None, self.log.read_text()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def broker(tmp_path):
    if MOSQUITTO is None:
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    b = Broker(tmp_path).start()
    yield b
    b.stop()


class Subscriber:
    """A real MQTT client collecting (topic, payload, retained) of everything under a filter."""

    def __init__(self, port: int, topic: str = "edgekit/#"):
        self.messages: list[tuple[str, str, bool]] = []
        self._subscribed = threading.Event()
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = lambda c, u, m: self.messages.append(
            (m.topic, m.payload.decode(), bool(m.retain))
        )
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self._subscribed.wait(5), "subscriber could not subscribe"

    def on(self, suffix: str) -> list[tuple[str, bool]]:
        return [(payload, retained) for topic, payload, retained in list(self.messages) if topic.endswith(suffix)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def retained_availability(port: int, topic: str) -> tuple[str, bool] | None:
    """What a dashboard subscribing now would be told about a device (None: nothing retained)."""
    sub = Subscriber(port, f"{topic}/availability")
    try:
        time.sleep(0.2)
        got = sub.on("/availability")
        return got[-1] if got else None
    finally:
        sub.close()


def query_prometheus(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def start_prometheus(directory: Path, targets: list[int], labels: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """A real Prometheus scraping ``127.0.0.1:<port>`` of each target every second; returns it and its web port."""
    web = free_port()
    config = directory / "prometheus.yml"
    config.write_text(textwrap.dedent(f"""\
        global:
          scrape_interval: 1s
          scrape_timeout: 900ms
        scrape_configs:
          - job_name: edgekit
            static_configs:
              - targets: {json.dumps([f"127.0.0.1:{p}" for p in targets])}
                labels: {json.dumps(labels)}
        """))
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
         f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=(directory / "prometheus.log").open("wb"),
    )
    return proc, web


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A Prometheus server scraping 127.0.0.1:<daemon_port> every second.

    Started when the module starts because Prometheus applies discovered targets only
    about 5 s after boot; the other tests of this module run meanwhile.
    """
    if PROMETHEUS is None:
        yield None
        return
    directory = tmp_path_factory.mktemp("prometheus")
    daemon_port = free_port()
    proc, web_port = start_prometheus(directory, [daemon_port], {"board": "test"})
    yield {"web_port": web_port, "daemon_port": daemon_port, "log": directory / "prometheus.log", "proc": proc}
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module", autouse=True)
def _start_prometheus_early(prometheus):
    yield


# ------------------------------------------------------------------------------------ models
@pytest.fixture(scope="session")
def tiny_tflite(tmp_path_factory) -> Path:
    """A real full-integer (uint8 in/out) .tflite made by the TensorFlow converter.

    Converted in a subprocess so this test process never imports TensorFlow (~500 MB).
    """
    pytest.importorskip("tensorflow", reason="tensorflow not installed (pip install 'edgekit-vision[build]')")
    path = tmp_path_factory.mktemp("model") / "tiny.tflite"
    script = textwrap.dedent(f"""\
        import numpy as np, tensorflow as tf, keras
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                                  keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, activation="softmax")])
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        rng = np.random.default_rng(0)
        conv.representative_dataset = lambda: ([rng.random((1, 32, 32, 3), dtype=np.float32)] for _ in range(20))
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = conv.inference_output_type = tf.uint8
        open({str(path)!r}, "wb").write(conv.convert())
        """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, env=env, timeout=120)
    return path


def real_runtime():
    """A real model (ONNX Runtime) on a 16x16 RGB input: 'dog' (0.7 to 0.79) on every frame;
    the camera (50 fps) paces the results counted against the broker."""
    return onnx_runtime(InputSpec(shape=(1, 16, 16, 3)), weights=[0.0, 0.5, 0.0],
                        bias=np.log([0.1, 0.7, 0.2]).tolist())


def make_config(tmp_path, broker_port: int | None, **tables) -> ServeConfig:
    config = ServeConfig()
    base = {
        "model": {"path": "fake"},
        "camera": {"uri": "synthetic:64x48@50"},
        "output": {"jsonl": str(tmp_path / "results.jsonl")},
        "http": {"listen": "127.0.0.1:0"},
        "mqtt": {"host": "127.0.0.1" if broker_port else "", "port": broker_port or 1883, "device": "cam-1",
                 "stats_interval_s": 0.3, "reconnect_min_s": 1.0, "reconnect_max_s": 1.0, "publish": "every"},
    }
    for table, values in tables.items():
        base.setdefault(table, {}).update(values)
    for table, values in base.items():
        config = override(config, table, **values)
    return config


@contextmanager
def running(daemon: Daemon):
    daemon.start()
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(10)
        assert not thread.is_alive()


def new_daemon(config: ServeConfig) -> Daemon:
    return Daemon(config, runtime_factory=real_runtime, labels=["cat", "dog", "bird"],
                  camera_factory=lambda uri, options: open_camera(uri, **options))


def count_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


# ------------------------------------------------------------------------------------ MQTT
@needs_mosquitto
def test_results_stats_and_retained_availability_over_mqtt(tmp_path, broker):
    sub = Subscriber(broker.port)
    daemon = new_daemon(make_config(tmp_path, broker.port))
    try:
        with running(daemon):
            wait_until(lambda: len(sub.on("/result")) >= 5 and len(sub.on("/stats")) >= 2, what="results and stats")
            # A dashboard that subscribes later still learns the device is online (retained).
            assert retained_availability(broker.port, "edgekit/cam-1") == ("online", True)
        result = json.loads(sub.on("edgekit/cam-1/result")[0][0])
        assert result["device"] == "cam-1" and result["top"][0]["label"] == "dog"
        assert set(result["ms"]) == {"preprocess", "inference", "end_to_end"}
        stats = json.loads(sub.on("edgekit/cam-1/stats")[-1][0])
        assert stats["frames"]["processed"] >= 1 and stats["mqtt"]["connected"] == 1
        # Clean shutdown: offline, retained, so the device does not look alive forever.
        assert retained_availability(broker.port, "edgekit/cam-1") == ("offline", True)
        # Every MQTT result also went to the JSON-lines file.
        assert count_lines(tmp_path / "results.jsonl") >= len(sub.on("/result"))
    finally:
        sub.close()


@needs_mosquitto
def test_broker_restart_results_still_logged_then_reconnects(tmp_path, broker):
    daemon = new_daemon(make_config(tmp_path, broker.port))
    results = tmp_path / "results.jsonl"
    with running(daemon):
        wait_until(lambda: daemon.mqtt.connected.is_set(), what="first connection")
        broker.stop()
        wait_until(lambda: not daemon.mqtt.connected.is_set(), what="disconnect noticed")
        lines_down, dropped = count_lines(results), daemon.stats()["mqtt"]["dropped"]
        # Broker down: inference and the local log go on, health stays green, MQTT copies are dropped
        # (waited for, not slept for: a loaded machine wrote 5 lines in 0.5 s only most of the time).
        wait_until(lambda: count_lines(results) > lines_down + 5, what="results logged while the broker is down")
        wait_until(lambda: daemon.stats()["mqtt"]["dropped"] > dropped, what="MQTT copies dropped")
        assert daemon.health()[0]
        broker.start()  # same port
        wait_until(lambda: daemon.stats()["reconnects"].get("mqtt") == 1, timeout=10, what="reconnect")
        sub = Subscriber(broker.port)
        try:
            wait_until(lambda: sub.on("/result"), what="results after the restart")
            # The broker lost its retained messages; the daemon said "online" again on reconnect.
            assert ("online", True) in sub.on("/availability")
        finally:
            sub.close()


# ------------------------------------------------------------------------------------ real bundle
def test_default_model_path_opens_a_real_bundle_with_its_labels(tmp_path, tiny_tflite):
    from edgekit.bundle import BundleWriter

    # edgekit build writes the input's quantisation; a uint8 input without a scale is refused at load.
    spec = InputSpec(shape=(1, 32, 32, 3), dtype="uint8", colour="rgb", scale=1 / 255, zero_point=0)
    with BundleWriter(tmp_path / "tiny-cpu") as w:
        shutil.copy(tiny_tflite, w.dir / "tiny_int8.tflite")
        (w.dir / "labels.txt").write_text("red\ngreen\nblue\n")
        bundle = w.commit({
            "target": "cpu", "default_model": "int8", "labels": "labels.txt",
            "runtime": {"adapter": "edgekit.runtime.litert:LiteRTRuntime", "options": {"num_threads": 1}},
            "models": [{"name": "int8", "file": "tiny_int8.tflite", "format": "tflite", "precision": "int8",
                        "input": spec.to_dict(), "outputs": [{"name": "scores"}]}],
        })
    config = make_config(tmp_path, None, model={"path": str(bundle), "top_k": 2}, http={"listen": ""})
    stats = Daemon(config).run(max_frames=5)  # no factories: [model] path -> edgekit.model.open_model
    assert stats["frames"]["processed"] == 5 and stats["runtime"]["backend"] == "ai_edge_litert"
    assert stats["info"]["model"] == "tiny-cpu"
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {p["label"] for line in lines for p in line["top"]} <= {"red", "green", "blue"}
    assert all(len(line["top"]) == 2 for line in lines)
    # Every result names what produced it (a fleet mid-rollout runs several bundles).
    from edgekit.bundle import MANIFEST, sha256_file

    digest = sha256_file(Path(bundle) / MANIFEST)
    assert {(r["model"], r["variant"], r["bundle_sha256"]) for r in lines} == {("tiny-cpu", "int8", digest)}


# ------------------------------------------------------------------------------------ real process
def start_serve(tmp_path: Path, model: Path, broker_port: int, device: str) -> tuple[subprocess.Popen, int]:
    """``python -m edgekit.cli serve`` with a real model; returns the process and its HTTP port."""
    cmd = [sys.executable, "-m", "edgekit.cli", "serve", str(model),
           "--camera", "synthetic:320x240@30", "--mqtt", f"127.0.0.1:{broker_port}", "--node-name", device,
           "--http", "127.0.0.1:0", "--output", str(tmp_path / f"{device}.jsonl")]
    stderr = (tmp_path / f"{device}.err").open("w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def http_port():
        assert proc.poll() is None, (tmp_path / f"{device}.err").read_text()
        m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", (tmp_path / f"{device}.err").read_text())
        return int(m.group(1)) if m else None

    return proc, wait_until(http_port, timeout=20, what="daemon HTTP endpoint")


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow  # asserts on wall-clock time
@needs_mosquitto
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_finishes_flushes_publishes_offline_and_exits_0(tmp_path, broker, tiny_tflite, signum):
    sub = Subscriber(broker.port)
    proc, port = start_serve(tmp_path, tiny_tflite, broker.port, "term")
    try:
        wait_until(lambda: healthz(port) == 200, timeout=10, what="ready")
        wait_until(lambda: sub.on("term/result"), what="a result over MQTT (\"change\" mode: the first one)")
        t0 = time.monotonic()
        proc.send_signal(signum)
        rc = proc.wait(10)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        sub.close()
    log = (tmp_path / "term.err").read_text()
    assert rc == 0, log
    assert elapsed < 3.0, f"took {elapsed:.2f} s to stop"
    assert f"{signum.name}: finishing the current frame" in log and "stopped after" in log
    lines = (tmp_path / "term.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["device"] == "term" for line in lines)  # no torn last line
    top = json.loads(lines[-1])["top"]
    assert abs(sum(p["score"] for p in top) - 1) < 0.05  # uint8 output dequantised to probabilities
    assert retained_availability(broker.port, "edgekit/term") == ("offline", True)


@needs_mosquitto
def test_last_will_marks_a_killed_daemon_offline(tmp_path, broker, tiny_tflite):
    proc, port = start_serve(tmp_path, tiny_tflite, broker.port, "killed")
    try:
        wait_until(lambda: healthz(port) == 200, timeout=10, what="ready")
        wait_until(lambda: retained_availability(broker.port, "edgekit/killed") == ("online", True),
                   what="online")
        proc.send_signal(signal.SIGKILL)  # no goodbye: the broker must publish the last will
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_until(lambda: retained_availability(broker.port, "edgekit/killed") == ("offline", True),
               timeout=5, what="last will")


# ------------------------------------------------------------------------------------ Prometheus
@needs_prometheus
def test_prometheus_scrapes_the_daemon(tmp_path, prometheus):
    config = make_config(tmp_path, None, http={"listen": f"127.0.0.1:{prometheus['daemon_port']}"})
    daemon = new_daemon(config)
    web = prometheus["web_port"]
    with running(daemon):

        def target_up():
            targets = query_prometheus(web, "/api/v1/targets")["data"]["activeTargets"]
            return targets and targets[0]["health"] == "up" and targets[0]

        target = wait_until(target_up, timeout=20, interval=0.2, what="Prometheus target up")
        assert target["labels"]["board"] == "test"

        def processed():
            result = query_prometheus(web, "/api/v1/query", query='edgekit_frames_processed_total{job="edgekit"}')
            values = result["data"]["result"]
            return values and float(values[0]["value"][1]) > 0 and values

        wait_until(processed, timeout=10, interval=0.2, what="a scraped frame count")
        ready = query_prometheus(web, "/api/v1/query", query="edgekit_ready")["data"]["result"]
        assert float(ready[0]["value"][1]) == 1.0
        quantile = query_prometheus(
            web, "/api/v1/query", query="histogram_quantile(0.5, edgekit_inference_seconds_bucket)"
        )["data"]["result"]
        assert 0 < float(quantile[0]["value"][1]) < 0.1  # seconds: the tiny model takes well under 1 ms


# ------------------------------------------------------------------------------------ fleet examples
PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_fleet_scrape_config_and_documented_alert_rules_are_valid(tmp_path):
    proc = subprocess.run([PROMTOOL, "check", "config", str(ROOT / "deploy" / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    # The alert rules ship beside the scrape config (docs/serve.md links them; `edgekit deploy` writes both).
    proc = subprocess.run([PROMTOOL, "check", "rules", str(ROOT / "deploy" / "alerts.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "9 rules found" in proc.stdout, proc.stdout + proc.stderr
    assert "deploy/alerts.yml" in (ROOT / "docs" / "serve.md").read_text()
