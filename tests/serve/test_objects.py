"""Object events without a broker: the IoU tracker's new/update/end, the [events] table, the
sensor feed, the Home Assistant discovery payloads, where "auto" results go, and the model's
name from its manifest (never from a symlink's name)."""

from __future__ import annotations

import json
import os

import pytest

from edgekit.errors import UsageError
from edgekit.serve.config.load import ServeConfig, from_dict, override
from edgekit.serve.mqtt.discovery import BINARY_DEVICE_CLASSES, discovery_messages
from edgekit.serve.mqtt.from_config import count_labels
from edgekit.serve.mqtt.sensors import SensorFeed
from edgekit.serve.objects import MAX_TRACKS, ObjectTracker, iou
from edgekit.serve.record import as_record
from edgekit.serve.supervisor import manifest_name, model_identity
from edgekit.serve.systemd import results_path


def box(label: str, x: float, score: float = 0.8, w: float = 40.0) -> dict:
    return {"label": label, "score": score, "box": [x, 10.0, x + w, 50.0]}


def feed(tracker: ObjectTracker, frames: list[list[dict]], t0: float = 1000.0, dt: float = 0.1) -> list[dict]:
    events = []
    for n, detections in enumerate(frames):
        events += tracker.update(detections, t0 + n * dt)
    return events


def test_iou():
    assert iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert iou([0, 0, 10, 10], [20, 0, 30, 10]) == 0.0
    assert iou([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0  # empty boxes: no division by zero


def test_one_object_held_in_view_is_one_event_story():
    tracker = ObjectTracker(min_frames=2, max_missing=3, update_interval_s=0.25)
    # a cat walks right for 10 frames (a little each frame), then is gone for 3
    frames = [[box("cat", 10 + 2 * n, score=0.6 + n / 100)] for n in range(10)] + [[]] * 3
    events = feed(tracker, frames)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "new" and kinds[-1] == "end" and set(kinds[1:-1]) == {"update"}
    assert len({e["id"] for e in events}) == 1
    new, end = events[0], events[-1]
    assert new["frames"] == 2 and new["start_time"] == 1000.0 and "end_time" not in new
    assert end["frames"] == 10 and end["end_time"] == pytest.approx(1000.9) and end["score"] == pytest.approx(0.69)
    assert end["box"] == [28.0, 10.0, 68.0, 50.0]
    # updates at most every update_interval_s (0.1 s frames: every third frame)
    times = [round(1000 + 0.1 * i, 1) for i in range(10)]
    assert len(kinds) - 2 <= len(times) // 2
    assert tracker.tracks == [] and tracker.counts() == {}


def test_a_one_frame_flicker_is_no_event_and_updates_can_be_off():
    tracker = ObjectTracker(min_frames=3, max_missing=2, update_interval_s=0)
    assert feed(tracker, [[box("dog", 100)], [], [], [box("dog", 100)], [box("dog", 100)], []]) == []
    events = feed(tracker, [[box("cat", 10)]] * 5 + [[]] * 2)
    assert [e["type"] for e in events] == ["new", "end"]


def test_two_objects_of_one_label_stay_apart_and_counts_follow_them():
    tracker = ObjectTracker(min_frames=1, max_missing=2)
    events = tracker.update([box("person", 0), box("person", 200)], 1.0)
    assert [e["type"] for e in events] == ["new", "new"] and tracker.counts() == {"person": 2}
    # they swap order in the list; IoU keeps each id on its own box
    left_id = next(e["id"] for e in events if e["box"][0] == 0)
    tracker.update([box("person", 205), box("person", 3)], 1.1)
    assert next(t for t in tracker.tracks if t.id == left_id).box[0] == 3
    # a label never links to another label's track, even on the same spot
    tracker.update([box("person", 205), box("person", 3), box("dog", 3)], 1.2)
    assert tracker.counts() == {"person": 2, "dog": 1}
    ends = feed(tracker, [[box("dog", 3)], [box("dog", 3)]], t0=1.3)
    assert sorted(e["type"] for e in ends) == ["end", "end"] and tracker.counts() == {"dog": 1}
    assert [e["type"] for e in tracker.end_all()] == ["end"] and tracker.counts() == {}


def test_labels_of_interest_min_score_and_bad_boxes_are_filtered():
    tracker = ObjectTracker(min_frames=1, labels=("cat",), min_score=0.5)
    got = tracker.update([box("dog", 0), box("cat", 100, score=0.4), {"label": "cat", "box": [1, 2]},
                          "not a box", {"label": "cat", "score": 0.9, "box": "nope"}, box("cat", 300)], 5.0)
    assert [e["label"] for e in got] == ["cat"] and got[0]["box"][0] == 300


def test_tracks_are_bounded():
    tracker = ObjectTracker(min_frames=5)
    tracker.update([box("x", 50 * n, w=10) for n in range(MAX_TRACKS + 50)], 1.0)
    assert len(tracker.tracks) == MAX_TRACKS


def test_events_table_is_checked_like_the_others():
    config = from_dict({"events": {"labels": ["person"], "min_frames": 3, "update_interval_s": 0}})
    assert config.events.labels == ("person",) and config.events.min_frames == 3
    with pytest.raises(UsageError, match="unknown key 'min_frame' in \\[events\\]") as exc:
        from_dict({"events": {"min_frame": 3}})
    assert "did you mean 'min_frames'" in exc.value.hint
    for bad, message in (({"min_frames": 0}, "below the minimum 1"), ({"iou": 1.5}, "iou is a score"),
                         ({"min_score": "high"}, "must be a number"), ({"max_missing": 0}, "below the minimum")):
        with pytest.raises(UsageError, match=message):
            from_dict({"events": bad})
    with pytest.raises(UsageError, match="did you mean \\[events\\]"):
        from_dict({"event": {}})
    with pytest.raises(UsageError, match="device_class = 'occupied' is not one of"):
        from_dict({"mqtt": {"device_class": "occupied"}})
    assert "occupancy" in BINARY_DEVICE_CLASSES and ServeConfig().mqtt.device_class == "occupancy"
    assert ServeConfig().model.allow_task_change is False
    assert override(ServeConfig(), "model", allow_task_change=True).model.allow_task_change is True


def test_count_labels_are_a_detectors_only():
    config = ServeConfig()
    assert count_labels(config, ["cat", "dog"], detector=True) == ("cat", "dog")
    assert count_labels(config, ["cat", "dog"], detector=False) == ()
    chosen = override(config, "events", labels=["dog"])
    assert count_labels(chosen, ["cat", "dog"], detector=True) == ("dog",)
    assert count_labels(override(config, "events", counts=False), ["cat"], detector=True) == ()
    assert count_labels(config, [f"c{n}" for n in range(1000)], detector=True) == ()  # name them instead


def test_sensor_feed_is_sent_on_change_and_at_least_every_interval():
    now = [0.0]
    feed_ = SensorFeed("edgekit/gate", 10.0, ("person", "Red Car"), clock=lambda: now[0])
    record = {"time": 5.0, "detections": [box("person", 0, 0.9), box("person", 90, 0.3)]}
    first = json.loads(feed_.offer(record, "person", changed=True))
    assert first == {"state": "person", "score": 0.9, "count": 1, "counts": {"person": 0, "red_car": 0}, "time": 5.0}
    now[0] = 3.0
    assert feed_.offer(record, "person", changed=False) is None
    assert feed_.set_counts({"person": 1}) == [("edgekit/gate/count/person", "1")]
    assert json.loads(feed_.offer(record, "person", changed=False))["counts"]["person"] == 1  # a count changed
    now[0] = 12.0
    assert feed_.offer(record, "person", changed=False) is None
    now[0] = 13.5
    assert feed_.offer(record, "person", changed=False) is not None  # 10 s since the last one
    assert feed_.set_counts({"person": 1}) == []
    assert as_record({"top": [{"score": 0.25}, {"score": 0.5}]}).top_score == 0.5 and as_record({}).top_score == 0.0


def test_discovery_payloads_match_home_assistants_schema():
    messages = dict(discovery_messages("edgekit/gate", "Gate Cam", ["person"], count_labels=["person", "{{x}}"],
                                       device_class="occupancy", sensor_interval_s=10.0))
    assert set(messages) == {f"homeassistant/{t}/config" for t in (
        "sensor/gate_cam/label", "sensor/gate_cam/score", "sensor/gate_cam/count",
        "sensor/gate_cam/count_person", "sensor/gate_cam/count_x", "binary_sensor/gate_cam/label_person")}
    known = {"name", "state_topic", "value_template", "state_class", "expire_after", "icon", "unique_id",
             "default_entity_id", "availability_topic", "payload_available", "payload_not_available", "device",
             "json_attributes_topic", "payload_on", "payload_off", "device_class", "suggested_display_precision"}
    for topic, payload in messages.items():
        entity = json.loads(payload)
        assert set(entity) <= known, set(entity) - known
        component = topic.split("/")[1]
        assert entity["default_entity_id"].startswith(f"{component}.gate_cam_")
        assert isinstance(entity.get("expire_after", 0), int)
        assert "{{x}}" not in entity.get("value_template", "")  # a label never enters a template
    binary = json.loads(messages["homeassistant/binary_sensor/gate_cam/label_person/config"])
    assert binary["device_class"] == "occupancy" and binary["state_topic"] == "edgekit/gate/label/person"
    count = json.loads(messages["homeassistant/sensor/gate_cam/count_person/config"])
    assert count["state_topic"] == "edgekit/gate/sensors" and "counts['person']" in count["value_template"]
    assert count["state_class"] == "measurement" and count["expire_after"] == 31
    plain = dict(discovery_messages("edgekit/gate", "gate", ["person"], device_class=""))
    assert "device_class" not in json.loads(plain["homeassistant/binary_sensor/gate/label_person/config"])


def test_auto_results_go_to_stdout_by_hand_and_to_the_state_directory_under_systemd():
    assert results_path("auto", {}) == "-"
    assert results_path("auto", {"INVOCATION_ID": "x", "STATE_DIRECTORY": "/var/lib/edgekit"}) == \
        "/var/lib/edgekit/results.jsonl"
    assert results_path("auto", {"INVOCATION_ID": "x", "STATE_DIRECTORY": "/a:/b"}) == "/a/results.jsonl"
    assert results_path("auto", {"INVOCATION_ID": "x"}) == ""  # the journal never gets them
    assert results_path("-", {"INVOCATION_ID": "x"}) == "-" and results_path("r.jsonl", {}) == "r.jsonl"
    assert ServeConfig().output.jsonl == "auto"


def test_the_model_is_named_by_its_manifest_not_by_a_symlink(tmp_path):
    real = tmp_path / "bundles" / "v2"
    real.mkdir(parents=True)
    (real / "edgekit.json").write_text(json.dumps({"name": "demo-cpu"}))
    link = tmp_path / "bundle"
    os.symlink(real, link)
    assert model_identity(str(link), "int8", "cpu")["bundle"] == "demo-cpu"
    for bad in ('{"name": "a\\nb"}', '{"name": 5}', "[1]", "not json", '{"name": "' + "x" * 101 + '"}'):
        (real / "edgekit.json").write_text(bad)
        assert manifest_name(str(real)) == ""
    assert model_identity(str(link), "int8", "cpu")["bundle"] == "bundle"  # nothing better to say


class Outputs:
    """What ObjectFeed publishes to, recorded (the broker path is in test_serve_events_mqtt.py)."""

    def __init__(self):
        self.events, self.counts, self.snapshots, self.lines = [], [], [], []

    def publish_event(self, event):
        self.events.append(event)

    def publish_counts(self, counts):
        self.counts.append(dict(counts))

    def publish_snapshot(self, label, jpeg):
        self.snapshots.append((label, jpeg))

    def write(self, record):
        self.lines.append(record)


def test_object_feed_names_the_model_and_keeps_only_best_frames():
    import numpy as np

    pytest.importorskip("cv2", reason="snapshots need OpenCV")
    from edgekit.serve.object_feed import MAX_SNAPSHOT_TRACKS, ObjectFeed

    config = override(ServeConfig(), "events", snapshots=True, min_frames=1, max_missing=1, jsonl=True)
    out = Outputs()
    feed_ = ObjectFeed(config, lambda: {"bundle": "demo", "sha256": "ab"}, mqtt=out, sink=out)
    bright = np.full((60, 80, 3), 200, np.uint8)
    feed_.frame({"time": 1.0, "detections": [box("cat", 10, 0.6)]}, bright)
    bright[:] = 0  # the source reuses its buffer: the kept frame is a copy
    feed_.frame({"time": 1.1, "detections": [box("cat", 10, 0.5)]}, np.zeros((60, 80, 3), np.uint8))
    feed_.frame({"time": 1.2, "detections": []}, None)
    assert [e["type"] for e in out.events] == ["new", "end"] and out.lines == out.events
    assert {e["model"] for e in out.events} == {"demo"} and out.counts[-1] == {}
    import cv2

    best = cv2.imdecode(np.frombuffer(out.snapshots[-1][1], np.uint8), cv2.IMREAD_COLOR)
    assert best[5, 5].mean() > 150  # the 0.6 frame (bright), not the later 0.5 one
    assert feed_.snapshots._best == {}  # forgotten once the object ended
    many = [box("x", 50 * n, w=10) for n in range(MAX_SNAPSHOT_TRACKS + 10)]
    feed_.frame({"time": 2.0, "detections": many}, np.zeros((10, 10, 3), np.uint8))
    assert len(feed_.snapshots._best) == MAX_SNAPSHOT_TRACKS


class CameraOutputs(Outputs):
    """Outputs of a named camera's feed: counts and snapshots say which camera."""

    def publish_counts(self, counts, camera=""):
        self.counts.append((camera, dict(counts)))

    def publish_snapshot(self, label, jpeg, camera=""):
        self.snapshots.append((camera, label))


def test_a_named_cameras_objects_say_which_camera_and_track_alone():
    from edgekit.serve.object_feed import ObjectFeed

    config = override(ServeConfig(), "events", min_frames=1, max_missing=1)
    out = CameraOutputs()
    door, yard = (ObjectFeed(config, lambda: {"bundle": "demo"}, mqtt=out, camera=c) for c in ("door", "yard"))
    door.frame({"time": 1.0, "detections": [box("cat", 10, 0.6)]})
    yard.frame({"time": 1.0, "detections": [box("cat", 10, 0.6)]})  # the same box, another camera: its own object
    assert [(e["camera"], e["type"]) for e in out.events] == [("door", "new"), ("yard", "new")]
    assert list(out.events[0])[:2] == ["device", "camera"] and out.events[0]["id"] != out.events[1]["id"]
    assert out.counts == [("door", {"cat": 1}), ("yard", {"cat": 1})]
