"""Bundle hot-swap with real bundles (real LiteRT models, BundleWriter, sha256 checks).

The bundle path is a symlink flipped atomically, as a fleet tool would; the daemon watches it
(every 50 ms here) or is asked (SIGHUP / POST /reload / request_reload). Each case checks the
counts, the active bundle's hash in /stats and /metrics, and that the results file stays
valid with every frame processed once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgekit.bundle import MANIFEST, BundleWriter, sha256_file
from edgekit.serve.config.load import ServeConfig, override
from edgekit.serve.daemon import Daemon
from tests.helpers.waiting import wait_until
from tests.runtime.test_adapters import SPEC, write_bundle
from tests.serve.test_daemon import http_get, read_lines, running


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """Two good bundles of different models (float and int8) for the same target."""
    from tests.helpers import tflite_models

    d = tmp_path_factory.mktemp("swap")
    models = {"fp32": tflite_models.model_path("small_float"), "int8": tflite_models.model_path("small_int8")}
    return {
        "v1": write_bundle(d / "v1", {"fp32": models["fp32"]}),
        "v2": write_bundle(d / "v2", {"int8": models["int8"]}),
        "models": models,
    }


def flip(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` atomically (a new symlink renamed over the old one)."""
    tmp = link.with_name(link.name + ".tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def swap_config(tmp_path, link: Path, **model) -> ServeConfig:
    config = ServeConfig()
    tables = {
        "model": {"path": str(link), "watch": True, "watch_interval_s": 0.05, "warmup_frames": 3,
                  "probation_frames": 5, **model},
        "camera": {"uri": "synthetic:64x48@60", "reconnect_min_s": 0.02, "reconnect_max_s": 0.1},
        "output": {"jsonl": str(tmp_path / "results.jsonl")},
        "http": {"listen": "127.0.0.1:0", "reload": True},
    }
    for table, values in tables.items():
        config = override(config, table, **values)
    return config


def manifest_sha(bundle: Path) -> str:
    return sha256_file(Path(bundle) / MANIFEST)


def copy_bundle(src: Path, dest: Path, age_s: float = 0.0) -> Path:
    shutil.copytree(src, dest)
    if age_s:  # as `cp -p` / rsync -t leave them: the files are not being written now
        past = time.time() - age_s
        for f in dest.iterdir():
            os.utime(f, (past, past))
    return dest


def check_results(path: Path, processed: int) -> None:
    """Every line parses, frames are strictly increasing (none twice), one line per processed frame."""
    lines = read_lines(path)
    frames = [r["frame"] for r in lines]
    assert frames == sorted(set(frames))
    assert len(lines) == processed


def test_a_new_bundle_is_swapped_in_between_frames(tmp_path, bundles):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    daemon = Daemon(swap_config(tmp_path, link))
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 10, timeout=10)
        assert daemon.stats()["model"]["sha256"] == manifest_sha(bundles["v1"])
        flip(link, bundles["v2"])
        wait_until(lambda: daemon.stats()["swaps"]["ok"] == 1, timeout=10)
        before = daemon.stats()["frames"]["processed"]
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= before + 5, timeout=10)
        stats = daemon.stats()
        families = {f.name: f for f in text_string_to_metric_families(http_get(daemon, "/metrics")[1].decode())}
    assert stats["model"]["sha256"] == manifest_sha(bundles["v2"]) and stats["model"]["variant"] == "int8"
    assert stats["info"]["bundle_sha256"] == manifest_sha(bundles["v2"])
    assert stats["swaps"]["rolled_back"] == stats["swaps"]["refused"] == 0
    swaps = {s.labels["result"]: s.value for s in families["edgekit_model_swaps"].samples if s.name.endswith("_total")}
    assert swaps == {"ok": 1.0, "rolled_back": 0.0, "refused": 0.0}
    assert families["edgekit_info"].samples[0].labels["bundle_sha256"] == manifest_sha(bundles["v2"])
    assert stats["errors"]["inference"] == 0
    check_results(tmp_path / "results.jsonl", daemon.stats()["frames"]["processed"])


def _bad_bundles(tmp_path: Path, bundles: dict) -> dict[str, tuple[Path, str]]:
    """name -> (bundle, words the refusal names)."""
    corrupt = copy_bundle(bundles["v2"], tmp_path / "corrupt", age_s=120)
    model = next(corrupt.glob("*.tflite"))
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    past = time.time() - 120
    os.utime(model, (past, past))
    rejected = write_bundle(tmp_path / "rejected", {"int8": bundles["models"]["int8"]},
                            verification={"passed": False, "reason": "top-1 0.41 < 0.9"})
    other = write_bundle(tmp_path / "other-target", {"int8": bundles["models"]["int8"]}, target="rpi")
    with BundleWriter(tmp_path / "labels") as w:  # 3 labels for a 5-class model
        shutil.copy(bundles["models"]["int8"], w.dir / "m.tflite")
        (w.dir / "labels.txt").write_text("a\nb\nc\n")
        mislabelled = w.commit({"target": "cpu", "default_model": "int8", "labels": "labels.txt",
                                "runtime": {"adapter": "edgekit.runtime.litert:LiteRTRuntime"},
                                "models": [{"name": "int8", "file": "m.tflite", "format": "tflite",
                                            "precision": "int8", "input": SPEC.to_dict(), "outputs": []}]})
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / MANIFEST).write_text("{not json")
    return {"corrupt": (corrupt, "sha256"), "rejected": (rejected, "accuracy check"),
            "other target": (other, "target 'rpi'"), "labels": (mislabelled, "3 labels for a model with 5 classes"),
            "garbage": (garbage, "corrupt")}


def test_bad_bundles_are_refused_with_one_line_each_and_the_model_keeps_serving(tmp_path, bundles, caplog):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    bad = _bad_bundles(tmp_path, bundles)
    daemon = Daemon(swap_config(tmp_path, link))
    caplog.set_level(logging.INFO, logger="edgekit")
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 5, timeout=10)
        for n, (name, (bundle, words)) in enumerate(bad.items(), start=1):
            caplog.clear()
            flip(link, bundle)
            wait_until(lambda n=n: daemon.stats()["swaps"]["refused"] == n, timeout=10)
            refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
            assert len(refusals) == 1 and words in refusals[0], (name, refusals)
            assert daemon.health()[0], name
        link.unlink()  # the path gone (mid-rename): not a refusal, the model keeps serving
        time.sleep(0.2)
        flip(link, bundles["v1"])
        daemon.request_reload("test")  # unchanged: nothing to do
        time.sleep(0.2)
        stats = daemon.stats()
    assert stats["swaps"] == {**stats["swaps"], "ok": 0, "rolled_back": 0, "refused": len(bad)}
    assert stats["model"]["sha256"] == manifest_sha(bundles["v1"])
    assert stats["errors"]["inference"] == 0 and stats["health"]["ready"] == 1
    check_results(tmp_path / "results.jsonl", daemon.stats()["frames"]["processed"])


def test_a_half_copied_bundle_is_waited_for_not_refused(tmp_path, bundles):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    daemon = Daemon(swap_config(tmp_path, link))
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 5, timeout=10)
        partial = copy_bundle(bundles["v2"], tmp_path / "incoming")
        model = next(partial.glob("*.tflite"))
        whole = model.read_bytes()
        model.write_bytes(whole[: len(whole) // 3])  # the copy is still under way
        flip(link, partial)
        time.sleep(0.5)
        assert daemon.stats()["swaps"]["refused"] == 0
        assert daemon.stats()["model"]["sha256"] == manifest_sha(bundles["v1"])
        model.write_bytes(whole)  # the copy finished
        wait_until(lambda: daemon.stats()["swaps"]["ok"] == 1, timeout=10)
        stats = daemon.stats()
    assert stats["swaps"]["refused"] == 0 and stats["model"]["sha256"] == manifest_sha(bundles["v2"])


class FailingAfter:
    """A runtime that fails every inference after ``n`` (a device unplugged right after the swap)."""

    def __init__(self, runtime, n: int):
        self._rt, self._left = runtime, n
        self.input_spec = runtime.input_spec

    def infer(self, tensor):
        self._left -= 1
        if self._left < 0:
            raise RuntimeError("Edge TPU: device disconnected")
        return self._rt.infer(tensor)

    def __getattr__(self, name):
        return getattr(self._rt, name)


def test_a_bundle_that_fails_on_probation_is_rolled_back(tmp_path, bundles, caplog):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    daemon = Daemon(swap_config(tmp_path, link, probation_frames=20))
    caplog.set_level(logging.INFO, logger="edgekit")
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 5, timeout=10)
        real_open = daemon._swap.opener

        def flaky_open(path):
            loaded = real_open(path)
            loaded.pipeline.runtime = FailingAfter(loaded.pipeline.runtime, 3 + 4)  # warm-up 3, then 4 frames
            return loaded

        daemon._swap.opener = flaky_open
        flip(link, bundles["v2"])
        wait_until(lambda: daemon.stats()["swaps"]["rolled_back"] == 1, timeout=10)
        before = daemon.stats()["frames"]["processed"]
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= before + 5, timeout=10)
        daemon.request_reload("test")  # the same files again: refused before, not retried
        time.sleep(0.3)
        stats = daemon.stats()
    assert stats["model"]["sha256"] == manifest_sha(bundles["v1"])
    assert stats["swaps"]["ok"] == 0 and stats["swaps"]["rolled_back"] == 1
    assert "device disconnected" in stats["swaps"]["last"]
    assert stats["errors"]["inference"] == 0  # the failed frame ran again on the previous model
    assert any("rolled back" in r.getMessage() for r in caplog.records)
    check_results(tmp_path / "results.jsonl", daemon.stats()["frames"]["processed"])


def test_swap_during_a_camera_outage_warms_up_on_a_test_pattern(tmp_path, bundles):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    config = override(swap_config(tmp_path, link), "camera", uri=f"file:{tmp_path / 'gone.avi'}")
    daemon = Daemon(config)
    with running(daemon):
        wait_until(lambda: daemon.stats()["errors"]["camera"] >= 1, timeout=10)
        flip(link, bundles["v2"])
        wait_until(lambda: daemon.stats()["model"]["sha256"] == manifest_sha(bundles["v2"]), timeout=10)
        stats = daemon.stats()
    # No frame arrives, so the probation has not counted down: installed, the old model kept for rollback.
    assert stats["swaps"]["refused"] == 0 and stats["swaps"]["probation"] == 5


def test_reload_requests_sighup_storm_and_post(tmp_path, bundles, caplog):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    daemon = Daemon(override(swap_config(tmp_path, link), "model", watch=False))
    caplog.set_level(logging.INFO, logger="edgekit")
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 5, timeout=10)
        for _ in range(200):  # a storm of SIGHUPs: coalesced, the model keeps serving
            daemon.request_reload("SIGHUP")
        time.sleep(0.5)
        flip(link, bundles["v2"])
        time.sleep(0.3)
        assert daemon.stats()["swaps"]["ok"] == 0  # not watching: nothing happens until asked
        host, port = daemon.http_address
        import urllib.request

        req = urllib.request.Request(f"http://{host}:{port}/reload", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 202 and json.loads(resp.read())["requested"] == "POST /reload"
        wait_until(lambda: daemon.stats()["swaps"]["ok"] == 1, timeout=10)
    unchanged = [r for r in caplog.records if "unchanged" in r.getMessage()]
    assert 1 <= len(unchanged) < 50
    assert daemon.stats()["model"]["sha256"] == manifest_sha(bundles["v2"])


def test_post_reload_is_off_by_default(tmp_path, bundles):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    daemon = Daemon(override(swap_config(tmp_path, link), "http", reload=False))
    with running(daemon):
        host, port = daemon.http_address
        import urllib.error
        import urllib.request

        req = urllib.request.Request(f"http://{host}:{port}/reload", method="POST", data=b"")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        assert info.value.code == 404


@pytest.mark.slow
def test_sighup_to_edgekit_serve_swaps_and_sigterm_still_exits_0(tmp_path, bundles):
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    out = tmp_path / "results.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli", "serve", str(link), "--camera", "synthetic:64x48@30",
         "--output", str(out), "--http", "off"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        wait_until(lambda: out.exists() and out.stat().st_size > 0, timeout=30)
        proc.send_signal(signal.SIGHUP)  # unchanged bundle: logged, ignored
        wait_until(lambda: any("unchanged" in line for line in err), timeout=10)
        flip(link, bundles["v2"])
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: any("hot-swap done" in line for line in err) or proc.poll() is not None, timeout=20)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        reader.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(err)
    assert proc.returncode == 0, text
    assert "hot-swap done" in text and "Traceback" not in text
    lines = read_lines(out)
    assert [r["frame"] for r in lines] == sorted({r["frame"] for r in lines})


def test_every_swap_outcome_is_an_mqtt_event(tmp_path, bundles):
    """ok, refused and rolled_back each arrive once on <topic>/events of a real mosquitto, naming
    the reason, the bundle and its sha256 beside the one serving afterwards."""
    from tests.serve.test_daemon_services import MOSQUITTO, Broker, Subscriber

    if MOSQUITTO is None:
        pytest.skip("mosquitto not installed (apt-get install mosquitto)")
    broker = Broker(tmp_path).start()
    link = tmp_path / "bundle"
    link.symlink_to(bundles["v1"])
    corrupt = _bad_bundles(tmp_path, bundles)["corrupt"][0]
    config = override(swap_config(tmp_path, link, probation_frames=20), "mqtt", host="127.0.0.1",
                      port=broker.port, device="cam-swap")
    sub = Subscriber(broker.port, f"{config.topic}/events")
    daemon = Daemon(config)
    try:
        with running(daemon):
            wait_until(lambda: daemon.mqtt.connected.is_set() and daemon.stats()["frames"]["processed"] >= 5,
                       timeout=10)
            flip(link, corrupt)
            wait_until(lambda: len(sub.on("/events")) == 1, timeout=10)
            flip(link, bundles["v2"])
            wait_until(lambda: len(sub.on("/events")) == 2, timeout=10)
            real_open = daemon._swap.opener

            def flaky_open(path):
                loaded = real_open(path)
                loaded.pipeline.runtime = FailingAfter(loaded.pipeline.runtime, 3 + 2)  # warm-up, 2 frames
                return loaded

            daemon._swap.opener = flaky_open
            flip(link, copy_bundle(bundles["v1"], tmp_path / "v1-again", age_s=60))
            wait_until(lambda: len(sub.on("/events")) == 3, timeout=10)
    finally:
        sub.close()
        broker.stop()
    refused, ok, rolled_back = (json.loads(payload) for payload, _retained in sub.on("/events"))
    v1, v2 = manifest_sha(bundles["v1"]), manifest_sha(bundles["v2"])
    assert refused["result"] == "refused" and "sha256" in refused["reason"]
    assert refused["sha256"] == manifest_sha(corrupt) and refused["active_sha256"] == v1
    assert refused["device"] == "cam-swap" and refused["event"] == "model_swap"
    assert ok["result"] == "ok" and ok["reason"] == "" and ok["sha256"] == ok["active_sha256"] == v2
    assert ok["variant"] == "int8"
    assert rolled_back["result"] == "rolled_back" and "device disconnected" in rolled_back["reason"]
    assert rolled_back["sha256"] == v1 and rolled_back["active_sha256"] == v2
    assert daemon.stats()["swaps"] == {**daemon.stats()["swaps"], "ok": 1, "refused": 1, "rolled_back": 1}
