"""A fleet on one machine: three ``edgekit serve`` daemons (different HTTP ports and device names,
synthetic cameras, a small real LiteRT bundle) scraped by ONE real Prometheus and publishing to
ONE real mosquitto. Every query of docs/fleet.md runs against that Prometheus and must give one
series per device; the retained availability topics say which device is online, and which went
offline when one stops.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest

from edgekit.serve.config.load import ServeConfig, override
from edgekit.serve.daemon import Daemon
from tests.helpers.waiting import wait_until
from tests.runtime.test_adapters import write_bundle
from tests.serve.test_daemon import running
from tests.serve.test_daemon_services import (
    MOSQUITTO,
    PROMETHEUS,
    PROMTOOL,
    Broker,
    Subscriber,
    free_port,
    query_prometheus,
    start_prometheus,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(MOSQUITTO is None or PROMETHEUS is None,
                       reason="needs mosquitto and prometheus (apt-get install mosquitto prometheus)"),
]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "fleet.md"
DEVICES = ("cam-a", "cam-b", "cam-c")


def doc_queries() -> list[tuple[str, str]]:
    """(title, query) of every query in docs/fleet.md's promql block."""
    [block] = re.findall(r"```promql\n(.*?)```", DOC.read_text(), flags=re.S)
    queries, title = [], ""
    for line in block.splitlines():
        if line.startswith("#"):
            title = line.lstrip("# ")
        elif line.strip():
            queries.append((title, line.strip()))
    return queries


def device_config(tmp_path: Path, bundle: Path, device: str, http_port: int, broker_port: int) -> ServeConfig:
    config = ServeConfig()
    tables = {
        "model": {"path": str(bundle)},
        "camera": {"uri": "synthetic:64x48@15"},
        "output": {"jsonl": str(tmp_path / f"{device}.jsonl")},
        "http": {"listen": f"127.0.0.1:{http_port}"},
        "mqtt": {"host": "127.0.0.1", "port": broker_port, "device": device, "stats_interval_s": 5.0},
    }
    for table, values in tables.items():
        config = override(config, table, **values)
    return config


def query(web: int, promql: str) -> list[dict]:
    answer = query_prometheus(web, "/api/v1/query", query=promql)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_three_daemons_one_prometheus_one_broker(tmp_path):
    from tests.helpers import tflite_models

    bundle = write_bundle(tmp_path / "bundle", {"fp32": tflite_models.model_path("small_float")})
    ports = [free_port() for _ in DEVICES]
    proc, web = start_prometheus(tmp_path, ports, {"site": "test"})  # first: it applies its targets ~5 s after boot
    broker = Broker(tmp_path).start()
    sub = Subscriber(broker.port, "edgekit/+/availability")
    daemons = [Daemon(device_config(tmp_path, bundle, d, p, broker.port)) for d, p in zip(DEVICES, ports)]
    try:
        with running(daemons[0]), running(daemons[1]):
            with running(daemons[2]):
                def all_scraped():
                    try:
                        got = query(web, "sum by (instance) (edgekit_frames_processed_total) > 0")
                    except OSError:  # 503 while Prometheus starts (HTTPError is an OSError)
                        return False
                    return len(got) == 3 and got

                wait_until(all_scraped, timeout=25, interval=0.25, what="three devices scraped with frames")
                wait_until(lambda: len(query(web, doc_queries()[0][1])) == 3, timeout=10, interval=0.25,
                           what="a rate over two scrapes of each device")
                for title, promql in doc_queries():
                    series = query(web, promql)
                    devices = sorted(s["metric"].get("device", "") for s in series)
                    if "per device and result" in title:
                        assert devices == sorted(DEVICES * 3), (title, series)
                    else:
                        assert devices == sorted(DEVICES), (title, series)
                    for s in series:
                        value = float(s["value"][1])
                        assert not math.isinf(value) and value >= 0 or math.isnan(value), (title, s)
                fps = {s["metric"]["device"]: float(s["value"][1]) for s in query(web, doc_queries()[0][1])}
                assert all(v > 0 for v in fps.values()), fps
                p90 = {s["metric"]["device"]: float(s["value"][1]) for s in query(web, doc_queries()[3][1])}
                assert all(0 < v < 1 for v in p90.values()), p90
                wait_until(lambda: {t.split("/")[1] for t, p, _r in sub.messages if p == "online"} == set(DEVICES),
                           timeout=10, what="three devices online over MQTT")
            # cam-c stopped: it says offline (retained), Prometheus finds it down but still names it
            wait_until(lambda: ("edgekit/cam-c/availability", "offline", False) in sub.messages, timeout=10,
                       what="cam-c offline")

            def cam_c_down():
                up = {s["metric"]["instance"]: float(s["value"][1]) for s in query(web, 'up{job="edgekit"}')}
                return up.get(f"127.0.0.1:{ports[2]}") == 0.0 and up

            up = wait_until(cam_c_down, timeout=10, interval=0.25, what="cam-c down in Prometheus")
            assert up[f"127.0.0.1:{ports[0]}"] == up[f"127.0.0.1:{ports[1]}"] == 1.0
            availability = [q for t, q in doc_queries() if t.startswith("Availability")][0]
            named = {s["metric"]["device"]: float(s["value"][1]) for s in query(web, availability)}
            assert set(named) == set(DEVICES) and named["cam-c"] < 1.0, named
        retained = Subscriber(broker.port, "edgekit/+/availability")
        try:
            wait_until(lambda: len(retained.messages) == 3, timeout=5, what="three retained availabilities")
            assert {(t, p, r) for t, p, r in retained.messages} == {
                (f"edgekit/{d}/availability", "offline", True) for d in DEVICES}
        finally:
            retained.close()
    finally:
        sub.close()
        broker.stop()
        proc.terminate()
        proc.wait(10)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_the_documented_prometheus_config_is_valid(tmp_path):
    [config] = [b for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S) if "scrape_configs" in b]
    (tmp_path / "prometheus.yml").write_text(config)
    proc = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
