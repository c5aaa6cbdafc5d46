"""Object events of a detector daemon over a real mosquitto: a cat enters a clip and leaves it,
and a subscriber sees one ``new``, its ``update``s and one ``end`` on ``<topic>/events``, the
count topics go 1 then 0, Home Assistant gets count sensors and an occupancy binary sensor, and
the JSON lines carry the same events. The detector is a real ONNX model run by ONNX Runtime,
opened from its bundle (through a symlink, as the documented layout has it) by the daemon."""

from __future__ import annotations

import json
import os

import cv2
import pytest

from edgekit.camera import open_camera
from edgekit.serve.daemon import Daemon
from tests.helpers.detector_model import FRAME_W, detector_bundle, expected_box, scene
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon_services import Subscriber, broker, make_config  # noqa: F401

pytest.importorskip("paho.mqtt.client", reason="pip install 'edgekit-vision[serve]'")
EMPTY_BEFORE, CAT_FRAMES, EMPTY_AFTER = 6, 15, 12
PACE = 10
"""The clip's frame rate: a paced camera drops the frames a busy daemon cannot take (the newest wins), so
the cat is in view for 1.5 s, which a daemon slowed by a loaded machine still sees min_frames times (at
30 fps a loaded 2-core host saw no cat at all)."""


@pytest.fixture(scope="module")
def bundle_link(tmp_path_factory):
    d = tmp_path_factory.mktemp("det")
    detector_bundle(d / "twobox-v1")
    os.symlink(d / "twobox-v1", d / "bundle")  # named "bundle": results must still say "twobox"
    return d / "bundle"


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """Dark frames, a cat on the left whose brightness (its score) rises frame by frame, dark again."""
    d = tmp_path_factory.mktemp("clip")
    for i in range(EMPTY_BEFORE + CAT_FRAMES + EMPTY_AFTER):
        frame = scene(False, False, seed=i)
        k = i - EMPTY_BEFORE
        if 0 <= k < CAT_FRAMES:
            frame[:, : FRAME_W // 2] = 150 + 6 * k  # the score rises with it
        cv2.imwrite(str(d / f"{i:03d}.png"), frame)
    return d


def test_a_cat_entering_and_leaving_is_one_new_update_end_story(tmp_path, broker, bundle_link, clip):  # noqa: F811
    sub = Subscriber(broker.port, "#")
    config = make_config(tmp_path, broker.port, model={"path": str(bundle_link)},
                         camera={"on_end": "stop"}, http={"listen": ""},
                         mqtt={"publish": "change", "discovery": True, "labels_of_interest": ["cat"],
                               "sensor_interval_s": 1.0},
                         events={"min_frames": 2, "max_missing": 3, "update_interval_s": 0.05, "jsonl": True})
    daemon = Daemon(config, camera_factory=lambda uri, options: open_camera(f"folder:{clip}", fps=PACE))
    try:
        daemon.start()
        wait_until(daemon.mqtt.connected.is_set, 10, what="connected")
        daemon.run()  # the clip plays once (on_end = "stop"); run() returns after closing everything
        wait_until(lambda: sub.on("/count/cat") and sub.on("/count/cat")[-1][0] == "", 5, what="cleared counts")
    finally:
        sub.close()
    events = [json.loads(p) for p, _ in sub.on("edgekit/cam-1/events")]
    print("\nevent sequence:\n" + "\n".join(json.dumps(e) for e in events))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "new" and kinds[-1] == "end" and set(kinds[1:-1]) <= {"update"} and "update" in kinds
    assert len({e["id"] for e in events}) == 1 and {e["label"] for e in events} == {"cat"}
    new, end = events[0], events[-1]
    assert new["model"] == "twobox" and len(new["bundle_sha256"]) == 64 and new["device"] == "cam-1"
    assert "end_time" not in new and end["end_time"] >= end["start_time"] == new["start_time"]
    assert 2 <= new["frames"] <= end["frames"] <= CAT_FRAMES
    assert end["score"] >= max(e["score"] for e in events[:-1]) and end["score"] > new["score"]  # top so far
    for e in events:
        assert e["box"] == pytest.approx(expected_box(0), abs=0.5)
    # counts: retained, on change; cleared by the clean stop
    counts = [p for p, _ in sub.on("/count/cat")]
    assert "1" in counts and counts[-2:] == ["0", ""] and counts.index("1") < len(counts) - 2
    assert "1" not in [p for p, _ in sub.on("/count/dog")]
    # Home Assistant: count sensors per label, an occupancy binary sensor, all reading fresh topics
    configs = {t.split("/", 1)[1]: json.loads(p) for t, p, _ in sub.messages if t.endswith("/config")}
    assert set(configs) >= {"sensor/cam_1/count_cat/config", "sensor/cam_1/count_dog/config",
                            "sensor/cam_1/count/config", "binary_sensor/cam_1/label_cat/config"}
    assert configs["binary_sensor/cam_1/label_cat/config"]["device_class"] == "occupancy"
    assert configs["sensor/cam_1/count_cat/config"]["state_topic"] == "edgekit/cam-1/sensors"
    assert configs["sensor/cam_1/label/config"]["device"]["model"] == "twobox"
    sensors = [json.loads(p) for p, _ in sub.on("/sensors") if p]
    assert any(s["counts"]["cat"] == 1 for s in sensors) and sensors[-1]["counts"] == {"cat": 0, "dog": 0}
    # the JSON lines: every result, and the same events where asked ([events] jsonl)
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [e["id"] for e in lines if "type" in e] == [e["id"] for e in events]
    assert all(r["model"] == "twobox" for r in lines if "frame" in r)


def test_snapshots_are_the_best_frame_with_its_box(tmp_path, broker, bundle_link, clip):  # noqa: F811
    import numpy as np
    import paho.mqtt.client as paho

    images: list[tuple[str, bytes]] = []
    raw = paho.Client(paho.CallbackAPIVersion.VERSION2)  # JPEG payloads: the text Subscriber would choke
    raw.on_connect = lambda c, u, f, rc, p: c.subscribe("edgekit/cam-1/snapshot/#", qos=1)
    raw.on_message = lambda c, u, m: images.append((m.topic, m.payload))
    raw.connect("127.0.0.1", broker.port)
    raw.loop_start()
    sub = Subscriber(broker.port, "homeassistant/#")
    config = make_config(tmp_path, broker.port, model={"path": str(bundle_link)}, camera={"on_end": "stop"},
                         http={"listen": ""}, mqtt={"discovery": True},
                         events={"snapshots": True, "snapshot_width": 160, "update_interval_s": 0})
    try:
        Daemon(config, camera_factory=lambda uri, options: open_camera(f"folder:{clip}", fps=PACE)).run()
        wait_until(lambda: len(images) >= 2, 5, what="snapshots at new and end")
    finally:
        raw.disconnect()
        raw.loop_stop()
        sub.close()
    assert {t for t, _ in images} == {"edgekit/cam-1/snapshot/cat"}
    picture = cv2.imdecode(np.frombuffer(images[-1][1], np.uint8), cv2.IMREAD_COLOR)
    assert picture.shape == (120, 160, 3)  # 320x240 scaled to snapshot_width
    x1, y1, x2, y2 = (round(v / 2) for v in expected_box(0))
    edge = picture[y1 + 5:y2 - 5, x1]  # the left edge of the drawn box: green
    assert edge[:, 1].mean() > 150 and edge[:, 2].mean() < 100
    assert picture[60, 40].mean() > 200  # the cat's half is the bright one: its best (brightest) frame
    cameras = [json.loads(p) for t, p, _ in sub.messages if t.startswith("homeassistant/camera/")]
    assert [c["topic"] for c in cameras] == ["edgekit/cam-1/snapshot/cat", "edgekit/cam-1/snapshot/dog"]
