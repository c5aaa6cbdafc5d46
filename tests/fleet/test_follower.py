"""edgekit serve following a channel of a real SeaweedFS store: a new version is swapped in; an
untrusted, tampered or missing one is refused, counted once and not retried until the channel
moves; the store down (at start, during a download) never stops inference; two devices follow one
channel; a channel moved back rolls the devices back; a hot-swap refusal or a probation failure
leaves ``current`` on what runs."""

from __future__ import annotations

import json
import logging
import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgekit.errors import UsageError
from edgekit.fleet.channel import channel_object, make_pointer, version_dir
from edgekit.fleet.follower import StoreUnavailable
from edgekit.serve.config.load import ServeConfig, override
from edgekit.serve.daemon import Daemon
from tests.helpers import seaweed as sw
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon import http_get, running
from tests.serve.test_swap import FailingAfter


def config(fleet, device: str = "dev1", **model) -> ServeConfig:
    model = {"source": fleet.dest, "channel": "stable", "trusted_keys": (fleet.pub(),), "poll_interval_s": 0.1,
             "versions_dir": str(fleet.tmp / device), "warmup_frames": 2, "probation_frames": 3, **model}
    c = override(ServeConfig(), "model", **model)
    c = override(c, "camera", uri="synthetic:64x48@60", reconnect_min_s=0.02, reconnect_max_s=0.1)
    c = override(c, "output", jsonl="")
    c = override(c, "http", listen="127.0.0.1:0")
    return override(c, "mqtt", device=device)


def serving(daemon: Daemon) -> str:
    return daemon.stats()["model"]["sha256"]


def frames(daemon: Daemon) -> int:
    return daemon.stats()["frames"]["processed"]


def metrics(daemon: Daemon) -> dict:
    return {f.name: f for f in text_string_to_metric_families(http_get(daemon, "/metrics")[1].decode())}


def keeps_serving(daemon: Daemon, n: int = 5) -> None:
    before = frames(daemon)
    wait_until(lambda: frames(daemon) >= before + n, timeout=60, what="frames going on")
    assert daemon.health()[0]


def refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "hot-swap refused" in r.getMessage()]


def test_a_version_pushed_to_the_channel_is_swapped_in(fleet, bundles):
    v1 = fleet.push(bundles["v1"])
    daemon = Daemon(config(fleet, keep_versions=1))
    with running(daemon):
        assert serving(daemon) == v1
        keeps_serving(daemon)
        v2 = fleet.push(bundles["v2"])
        wait_until(lambda: serving(daemon) == v2 and not daemon.stats()["swaps"]["probation"], timeout=60)
        wait_until(lambda: daemon.stats()["fleet"]["state"] == "serving", timeout=60)
        keeps_serving(daemon)
        stats, families = daemon.stats(), metrics(daemon)
    info = families["edgekit_info"].samples[0].labels
    assert info["bundle_sha256"] == v2 and info["channel"] == "stable" and info["model"] == "v2"
    assert stats["swaps"]["ok"] == 1 and stats["swaps"]["refused"] == 0
    assert stats["fleet"]["channel_version"] == v2 and stats["fleet"]["fetch_errors"] == 0
    assert families["edgekit_fleet_store_up"].samples[0].value == 1
    versions = fleet.tmp / "dev1" / "versions"
    wait_until(lambda: sorted(os.listdir(versions)) == [v2], timeout=60, what="keep_versions = 1")
    assert os.readlink(fleet.tmp / "dev1" / "current") == f"versions/{v2}"


def test_a_version_signed_by_an_untrusted_key_is_refused_once_and_the_previous_keeps_serving(fleet, bundles, caplog):
    v1 = fleet.push(bundles["v1"])
    daemon = Daemon(config(fleet))
    caplog.set_level(logging.INFO, logger="edgekit")
    with running(daemon):
        fleet.push(bundles["v2"], key="stranger")
        wait_until(lambda: daemon.stats()["swaps"]["refused"] == 1, timeout=60)
        polls = daemon.stats()["fleet"]["polls"]
        wait_until(lambda: daemon.stats()["fleet"]["polls"] >= polls + 5, timeout=60)  # polled on, not retried
        keeps_serving(daemon)
        assert daemon.stats()["swaps"]["refused"] == 1 and serving(daemon) == v1
        assert len(refusals(caplog)) == 1 and "not trusted here" in refusals(caplog)[0]
        swaps = {s.labels["result"]: s.value for s in metrics(daemon)["edgekit_model_swaps"].samples
                 if s.name.endswith("_total")}
        assert swaps["refused"] == 1
        v3 = fleet.push(bundles["v3"])  # the channel moves on to a trusted version
        wait_until(lambda: serving(daemon) == v3 and daemon.stats()["swaps"]["ok"] == 1, timeout=60)


def test_a_tampered_object_and_a_missing_version_are_refused(fleet, bundles):
    fleet.push(bundles["v1"])
    daemon = Daemon(config(fleet))
    with running(daemon):
        v2 = fleet.push(bundles["v2"], channel=None)  # uploaded, then changed in the store, then promoted
        client, base = fleet.server.client(), f"{fleet.prefix}/{version_dir(v2)}"
        manifest = json.loads(client.get_object(Bucket=sw.BUCKET, Key=f"{base}/edgekit.json")["Body"].read())
        model = next(n for n in manifest["files"] if n.endswith(".tflite"))
        client.put_object(Bucket=sw.BUCKET, Key=f"{base}/{model}", Body=b"not the model that was signed")
        fleet.promote(v2)
        wait_until(lambda: daemon.stats()["swaps"]["refused"] == 1, timeout=60)
        assert "does not match its sha256" in daemon.stats()["swaps"]["last"]
        missing = "f" * 64
        client.put_object(Bucket=sw.BUCKET, Key=f"{fleet.prefix}/{channel_object('stable')}",
                          Body=make_pointer("stable", missing, {}, ""))
        wait_until(lambda: daemon.stats()["swaps"]["refused"] == 2, timeout=60)
        assert "missing version" in daemon.stats()["swaps"]["last"]
        keeps_serving(daemon)
        refused = daemon.stats()["fleet"]["refused"]
    assert set(refused) == {v2[:12], missing[:12]}
    assert not (fleet.tmp / "dev1" / "versions" / v2).exists()


def test_the_store_down_at_start_serves_the_last_good_version(fleet, bundles):
    v1 = fleet.push(bundles["v1"])
    with running(Daemon(config(fleet))) as _:
        pass  # the first start fetched v1
    proxy = fleet.proxy()
    proxy.set_down(True)
    fleet.as_device(proxy.endpoint)
    daemon = Daemon(config(fleet))
    with running(daemon):
        assert serving(daemon) == v1
        wait_until(lambda: daemon.stats()["fleet"]["fetch_errors"] >= 1, timeout=60)
        keeps_serving(daemon)
        assert http_get(daemon, "/healthz")[0] == 200 and daemon.stats()["fleet"]["store_up"] == 0
        assert daemon.stats()["fleet"]["state"] == "store unreachable"
        v2 = fleet.push(bundles["v2"])
        proxy.set_down(False)
        wait_until(lambda: serving(daemon) == v2, timeout=60)  # after the backoff, from the store again


def test_nothing_on_the_device_and_the_store_down_is_a_clean_failed_start(fleet, bundles):
    fleet.push(bundles["v1"])
    proxy = fleet.proxy()
    proxy.set_down(True)
    fleet.as_device(proxy.endpoint)
    daemon = Daemon(config(fleet))
    with pytest.raises(StoreUnavailable, match="no version of channel stable is on this device") as info:
        daemon.start()
    daemon.close()
    assert info.value.exit_code == 1


def test_the_store_down_during_a_download_never_stops_inference(fleet, bundles):
    v1 = fleet.push(bundles["v1"])
    proxy = fleet.proxy()
    fleet.as_device(proxy.endpoint)
    daemon = Daemon(config(fleet))
    with running(daemon):
        assert serving(daemon) == v1
        proxy.rules.cut = lambda request: 1_200_000 if "padding.bin" in request else None
        proxy.rules.down_after_cut = True  # the store dies 1.2 MB into the padding
        big = fleet.push(bundles["big"])
        wait_until(lambda: daemon.stats()["fleet"]["fetch_errors"] >= 2, timeout=60)
        keeps_serving(daemon)
        assert serving(daemon) == v1 and daemon.stats()["fleet"]["state"] == "store unreachable"
        proxy.rules.cut, proxy.rules.down_after_cut = (lambda request: None), False
        proxy.set_down(False)
        wait_until(lambda: serving(daemon) == big, timeout=60)
        downloaded = daemon.stats()["fleet"]["downloaded_bytes"]
    padding = [r for r in proxy.requests if r.startswith("GET") and "padding.bin" in r]
    assert len(padding) == 2 and "range: bytes=" in padding[1].lower()  # resumed, not started over
    assert downloaded < 3.5e6


def test_two_daemons_follow_one_channel(fleet, bundles):
    fleet.push(bundles["v1"])
    first, second = Daemon(config(fleet, "dev1")), Daemon(config(fleet, "dev2"))
    with running(first), running(second):
        v2 = fleet.push(bundles["v2"])
        wait_until(lambda: serving(first) == v2 and serving(second) == v2, timeout=60)
        wait_until(lambda: first.stats()["swaps"]["ok"] == second.stats()["swaps"]["ok"] == 1, timeout=60)
        keeps_serving(first)
        keeps_serving(second)
    third = Daemon(config(fleet, "dev1"))
    with running(Daemon(config(fleet, "dev1"))), pytest.raises(UsageError, match="in use by another edgekit serve"):
        third.start()  # one versions folder, one daemon
    third.close()


def test_a_channel_moved_back_rolls_the_device_back_from_its_own_copy(fleet, bundles):
    v1 = fleet.push(bundles["v1"])
    daemon = Daemon(config(fleet))
    with running(daemon):
        v2 = fleet.push(bundles["v2"])
        wait_until(lambda: serving(daemon) == v2 and not daemon.stats()["swaps"]["probation"], timeout=60)
        downloaded = daemon.stats()["fleet"]["downloaded_bytes"]
        fleet.promote(v1)  # rollback = promote the previous version
        wait_until(lambda: serving(daemon) == v1 and daemon.stats()["swaps"]["ok"] == 2, timeout=60)
        keeps_serving(daemon)
        stats = daemon.stats()
    assert stats["fleet"]["downloaded_bytes"] == downloaded


def test_a_version_the_hot_swap_refuses_is_left_until_the_channel_moves(fleet, bundles):
    v1 = fleet.push(bundles["v1"])
    daemon = Daemon(config(fleet))
    with running(daemon):
        relabelled = fleet.push(bundles["relabelled"])  # other labels: refused beside the running model
        wait_until(lambda: daemon.stats()["swaps"]["refused"] == 1, timeout=60)
        wait_until(lambda: os.readlink(fleet.tmp / "dev1" / "current") == f"versions/{v1}", timeout=60)
        polls = daemon.stats()["fleet"]["polls"]
        wait_until(lambda: daemon.stats()["fleet"]["polls"] >= polls + 5, timeout=60)
        keeps_serving(daemon)
        stats = daemon.stats()
    assert stats["swaps"]["refused"] == 1 and serving(daemon) == v1 and "changes the labels" in stats["swaps"]["last"]
    assert relabelled[:12] in stats["fleet"]["refused"]
    assert not (fleet.tmp / "dev1" / "versions" / relabelled).exists()


def test_a_version_that_fails_on_probation_is_rolled_back_and_current_follows(fleet, bundles):
    v1 = fleet.push(bundles["v1"])
    daemon = Daemon(config(fleet, probation_frames=20))
    with running(daemon):
        real_open = daemon._swap.opener

        def flaky_open(path):
            loaded = real_open(path)
            loaded.pipeline.runtime = FailingAfter(loaded.pipeline.runtime, 2 + 4)  # warm-up 2, then 4 frames
            return loaded

        daemon._swap.opener = flaky_open
        v2 = fleet.push(bundles["v2"])
        wait_until(lambda: daemon.stats()["swaps"]["rolled_back"] == 1, timeout=60)
        wait_until(lambda: os.readlink(fleet.tmp / "dev1" / "current") == f"versions/{v1}", timeout=60)
        keeps_serving(daemon)
        stats = daemon.stats()
    assert serving(daemon) == v1 and stats["fleet"]["refused"] == {v2[:12]: stats["fleet"]["refused"][v2[:12]]}
    assert "device disconnected" in stats["fleet"]["refused"][v2[:12]]


def test_a_pointer_that_arrives_before_its_version_is_waited_for_not_refused(fleet, bundles):
    """A mirror or a CDN may copy the channel's pointer before the version it names: the follower
    polls again (MISSING_POLLS) before it refuses a missing version."""
    v1 = fleet.push(bundles["v1"])
    daemon = Daemon(config(fleet, poll_interval_s=2.0))
    with running(daemon):
        wait_until(lambda: serving(daemon) == v1, timeout=60)
        v2 = fleet.push(bundles["v2"], channel=None)
        client, key = fleet.server.client(), f"{fleet.prefix}/{version_dir(v2)}/edgekit.json"
        manifest = client.get_object(Bucket=sw.BUCKET, Key=key)["Body"].read()
        client.delete_object(Bucket=sw.BUCKET, Key=key)
        client.put_object(Bucket=sw.BUCKET, Key=f"{fleet.prefix}/{channel_object('stable')}",
                          Body=make_pointer("stable", v2, {}, ""))  # the pointer first
        wait_until(lambda: daemon.stats()["fleet"]["state"] == "waiting for the version", timeout=60)
        client.put_object(Bucket=sw.BUCKET, Key=key, Body=manifest)  # then the version, as a sync does
        wait_until(lambda: serving(daemon) == v2, timeout=60)
        assert daemon.stats()["swaps"]["refused"] == 0
