"""The fleet follower as a service: swap events on MQTT name the channel, a read-only device pulls
from a plain web server, and ``edgekit serve --source`` (the acceptance command) stops on SIGTERM
with exit 0 and no traceback."""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from edgekit.serve.config.load import override
from edgekit.serve.daemon import Daemon
from tests.fleet.test_follower import config, serving
from tests.helpers import seaweed as sw
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon import running
from tests.serve.test_daemon_services import MOSQUITTO, Broker, Subscriber, free_port


def test_swap_events_on_mqtt_name_the_channel_and_the_versions(fleet, bundles, tmp_path):
    if MOSQUITTO is None:
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    broker = Broker(tmp_path).start()
    try:
        fleet.push(bundles["v1"])
        daemon = Daemon(override(config(fleet), "mqtt", host="127.0.0.1", port=broker.port))
        sub = Subscriber(broker.port)
        with running(daemon):
            wait_until(lambda: daemon.stats()["mqtt"]["connected"], timeout=60, what="the broker connected")
            fleet.push(bundles["v2"], key="stranger")
            # the refusal first: pushed at once, v3 could move the channel before a poll saw v2 (a CI run
            # under load waited 60 s for a refused event that never came)
            wait_until(lambda: daemon.stats()["swaps"]["refused"] == 1, timeout=60, what="v2 refused")
            v3 = fleet.push(bundles["v3"])
            wait_until(lambda: daemon.stats()["swaps"]["ok"] == 1, timeout=60, what="v3 swapped in")
            wait_until(lambda: len(sub.on("/events")) >= 2, timeout=60)
        sub.close()
    finally:
        broker.stop()
    events = [json.loads(payload) for payload, _ in sub.on("/events")]
    refused = next(e for e in events if e["result"] == "refused")
    ok = next(e for e in events if e["result"] == "ok")
    assert refused["channel"] == ok["channel"] == "stable" and refused["source"] == fleet.dest
    assert "not trusted" in refused["reason"] and ok["sha256"] == ok["active_sha256"] == v3


def test_a_read_only_device_follows_a_channel_on_a_plain_web_server(fleet, bundles, tmp_path):
    v1 = fleet.push(bundles["v1"])
    mirror = tmp_path / "www"

    def sync() -> None:  # what `aws s3 sync s3://models/PREFIX www/` does for a static site or a CDN
        client = fleet.server.client()
        for obj in client.list_objects_v2(Bucket=sw.BUCKET, Prefix=fleet.prefix + "/").get("Contents", []):
            dest = mirror / obj["Key"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(client.get_object(Bucket=sw.BUCKET, Key=obj["Key"])["Body"].read())

    sync()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mirror))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sw.clear_env(fleet.monkeypatch)  # no credentials at all
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/{fleet.prefix}"
        daemon = Daemon(override(config(fleet), "model", source=base))
        with running(daemon):
            assert serving(daemon) == v1
            with fleet.admin():
                v2 = fleet.push(bundles["v2"])
            sync()
            wait_until(lambda: serving(daemon) == v2, timeout=60)  # a ceiling for a loaded machine
    finally:
        server.shutdown()
        server.server_close()


def test_edgekit_serve_source_stops_on_sigterm_with_exit_0(fleet, bundles, tmp_path):
    v1 = fleet.push(bundles["v1"])
    port = free_port()
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("STATE_DIRECTORY", None)
    argv = [sys.executable, "-c", "import sys; from edgekit.cli import main; sys.exit(main())", "serve",
            "--source", fleet.dest, "--channel", "stable", "--trusted-key", fleet.pub(),
            "--camera", "synthetic:64x64@10", "--output", "off", "--mqtt", "off", "--http", f"127.0.0.1:{port}",
            "--poll-interval", "1"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def info() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    return next((line for line in resp.read().decode().splitlines()
                                 if line.startswith("edgekit_info")), "")
            except OSError:
                return ""

        line = wait_until(info, timeout=60, what="the daemon serving")
        assert f'bundle_sha256="{v1}"' in line and 'channel="stable"' in line
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "fetched version" in err
