"""serve/record.py: one record per frame, built from the typed result, read by every output."""

from __future__ import annotations

import json

from edgekit.detect.boxes import Detection, Detections
from edgekit.heads.classify import Classification
from edgekit.heads.tensors import Prediction
from edgekit.pipeline import FrameResult
from edgekit.serve.mqtt.policy import PublishPolicy
from edgekit.serve.objects import ObjectTracker
from edgekit.serve.record import ResultRecord, Seen, as_record, record_from
from edgekit.util.finite_json import to_json

IDENTITY = {"bundle": "demo-cpu", "variant": "int8", "sha256": "ab" * 32}
MS = {"capture_wait": 0.5, "preprocess": 1.23456, "inference": 7.5, "postprocess": 0.25, "end_to_end": 9.87654}


def classified() -> FrameResult:
    preds = (Prediction(3, "cat", 0.8123456789), Prediction(1, "dog", 0.1))
    return FrameResult(12, 0, Classification(preds, softmax_applied=True, energy=-2.5), dict(MS))


def detected() -> FrameResult:
    boxes = (Detection(0, "cat", 0.9, (1.004, 2.0, 30.0, 40.0)), Detection(1, "dog", 0.3, (5.0, 5.0, 9.0, 9.0)))
    return FrameResult(7, 0, Detections(boxes, size=(64, 48)), {**MS, "decode": 0.1, "nms": 0.05})


def _without_capture(result: FrameResult) -> dict:
    """``run --json``'s record of a frame without its capture time (the daemon stamps its own ``time``)."""
    return {k: v for k, v in result.to_dict().items() if k != "captured"}


def published_before(result: FrameResult, now: float) -> dict:
    """The dict the daemon built by hand before the record (daemon.py at b0157aa): the payloads must not change."""
    ms = result.timings_ms
    stages = ("preprocess", "inference", "end_to_end", "decode", "nms")
    return {"device": "cam1", "time": round(now, 3), "model": "demo-cpu", "variant": "int8",
            "bundle_sha256": "ab" * 32, **_without_capture(result),
            "ms": {k: round(ms[k], 3) for k in stages if k in ms}}


def test_the_record_publishes_byte_for_byte_what_the_daemon_published_before():
    for result in (classified(), detected()):
        record = record_from(result, "cam1", IDENTITY, now=1700000000.12345)
        before = published_before(result, 1700000000.12345)
        assert record.to_json() == to_json(before)  # the JSON-lines line
        assert record.to_json(state="cat") == to_json({**before, "state": "cat"})  # the MQTT result payload


def test_the_record_carries_the_result_typed():
    record = record_from(detected(), "cam1", IDENTITY, now=5.0)
    assert record.is_detector and record.frame == 7 and record.time == 5.0
    assert record.detections == (Seen("cat", 0.9, (1.0, 2.0, 30.0, 40.0)), Seen("dog", 0.3, (5.0, 5.0, 9.0, 9.0)))
    assert record.top_score == 0.9
    cls = record_from(classified(), "cam1", IDENTITY, now=5.0)
    assert not cls.is_detector and [s.label for s in cls.scores] == ["cat", "dog"]
    assert cls.top[0].score == round(0.8123456789, 6)  # the score the JSON says, so decisions match what is read


def test_policy_and_tracker_decide_on_the_typed_fields_not_the_json_keys():
    # the JSON body names nothing: what the outputs decide on comes from the typed fields alone
    record = ResultRecord(frame=1, time=100.0, detections=(Seen("cat", 0.9, (0.0, 0.0, 10.0, 10.0)),), doc={})
    assert PublishPolicy(min_score=0.5).decide(record) == (True, frozenset({"cat"}))
    events = ObjectTracker(min_frames=1).update(record.detections or (), record.time)
    assert [(e["type"], e["label"], e["box"]) for e in events] == [("new", "cat", [0.0, 0.0, 10.0, 10.0])]


def test_a_plain_dict_is_read_into_a_record_once_and_decides_the_same():
    record = record_from(detected(), "cam1", IDENTITY, now=5.0)
    from_dict = as_record(json.loads(record.to_json()))
    assert from_dict.detections == record.detections and from_dict.to_json() == record.to_json()
    assert as_record(record) is record
    assert PublishPolicy().state_of(from_dict) == PublishPolicy().state_of(record) == frozenset({"cat"})


def test_last_result_for_stats_is_the_frame_its_time_and_the_heads_json():
    result = classified()
    last = record_from(result, "cam1", IDENTITY, now=5.0).last_result()
    # as /stats showed it before: {"frame", "time", **FrameResult.to_dict()}
    assert last == {"frame": 12, "time": 5.0, **_without_capture(result)}


def test_a_named_cameras_record_says_which_camera_right_after_the_device():
    record = record_from(classified(), "cam1", IDENTITY, now=5.0, camera="door")
    doc = json.loads(record.to_json())
    assert record.camera == "door" and list(doc)[:3] == ["device", "camera", "time"] and doc["camera"] == "door"
    assert as_record(doc).camera == "door"  # a Python caller's dict keeps it: MQTT routes on it
    unnamed = record_from(classified(), "cam1", IDENTITY, now=5.0)
    assert unnamed.camera == "" and "camera" not in json.loads(unnamed.to_json())
