"""The second stage (edgekit/cascade/stage.py) on frames whose right answer is known: two coloured
"eyes" on a rotated face, a fake landmark model that, like MediaPipe's, expects the eyes level in its
crop, and a fake classifier that names a patch's colour. A cascade that ignored the rotation, or
projected back without the inverse rotation, puts the second eye tens of pixels off."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from edgekit.camera.base import Frame
from edgekit.cascade import SecondStage, parse_roi
from edgekit.detect.boxes import Detection, Detections
from edgekit.imaging.image import InputSpec
from edgekit.pipeline import Pipeline
from edgekit.runtime.fake import FakeRuntime

SIDE = 96  # the landmark model's input
EYE_GAP = 40.0  # frame pixels between the eyes
EYES = {"rotation_vector_start_keypoint_index": 0, "rotation_vector_end_keypoint_index": 1,
        "rotation_vector_target_angle_degrees": 0, "scale_x": 2.0, "scale_y": 2.0, "square_long": True}


def _face(degrees: float, centre=(200.0, 150.0)) -> tuple[np.ndarray, Detection]:
    """A dark frame with a red and a blue eye EYE_GAP apart, the pair turned ``degrees`` clockwise."""
    frame = np.zeros((300, 400, 3), np.uint8)
    a = math.radians(degrees)
    dx, dy = EYE_GAP / 2 * math.cos(a), EYE_GAP / 2 * math.sin(a)
    red, blue = (centre[0] - dx, centre[1] - dy), (centre[0] + dx, centre[1] + dy)
    cv2.circle(frame, (round(red[0]), round(red[1])), 3, (0, 0, 255), -1)  # BGR
    cv2.circle(frame, (round(blue[0]), round(blue[1])), 3, (255, 0, 0), -1)
    box = (centre[0] - 30, centre[1] - 30, centre[0] + 30, centre[1] + 30)
    return frame, Detection(0, "face", 0.9, box, (red, blue))


def _spot(channel: np.ndarray) -> tuple[float, float] | None:
    ys, xs = np.nonzero(channel > 0.5)
    return (float(xs.mean()), float(ys.mean())) if len(xs) else None


def _upright_landmark_model(present: bool = True) -> FakeRuntime:
    """Finds both eyes in its RGB crop and, as a model trained on upright faces would, puts the blue eye
    level to the right of the red one at their distance; z = 5; presence logit +-4. The x, y are in a
    192-px frame (input_image_width 192), to check the head's normalisation."""
    spec = InputSpec(shape=(1, SIDE, SIDE, 3), colour="rgb", mean=(0.0,), std=(255.0,))

    def infer(tensor: np.ndarray) -> list[np.ndarray]:
        red = _spot(tensor[0, :, :, 0] - tensor[0, :, :, 2]) or (0.0, 0.0)
        blue = _spot(tensor[0, :, :, 2] - tensor[0, :, :, 0]) or red
        gap = float(np.hypot(blue[0] - red[0], blue[1] - red[1]))
        points = np.array([[red[0], red[1], 5.0], [red[0] + gap, red[1], 5.0]]) * 2  # in 192-px units
        return [points.reshape(1, 6).astype(np.float32), np.array([[4.0 if present else -4.0]], np.float32)]

    return FakeRuntime(infer, spec)


LANDMARK_OPTIONS = {"landmarks": {"num_landmarks": 2, "input_image_width": 192, "input_image_height": 192},
                    "presence": {"output": 1, "activation": "sigmoid", "threshold": 0.5}}


@pytest.mark.parametrize("degrees", [0.0, 40.0, -40.0])
def test_landmarks_come_back_to_the_eyes_on_a_rotated_face(degrees):
    frame, face = _face(degrees)
    stage = SecondStage(_upright_landmark_model(), "landmarks", (), LANDMARK_OPTIONS, parse_roi(EYES))
    out = stage(frame, Detections((face,), (400, 300))).detections[0]
    assert len(out.landmarks) == 2 and out.landmark_score == pytest.approx(1 / (1 + math.exp(-4)), abs=1e-4)
    for found, eye in zip(out.landmarks, face.keypoints):
        assert found[:2] == pytest.approx(eye, abs=1.5)
    assert out.landmarks[0][2] == pytest.approx(10.0 / 192 * 120, abs=1e-3)  # z: 10 of 192 units x the 120-px region
    assert out.region[4] == pytest.approx(degrees, abs=1e-6)


def test_ignoring_the_rotation_misses_the_second_eye():
    frame, face = _face(40.0)
    no_rotation = {k: v for k, v in EYES.items() if not k.startswith("rotation")}
    stage = SecondStage(_upright_landmark_model(), "landmarks", (), LANDMARK_OPTIONS, parse_roi(no_rotation))
    out = stage(frame, Detections((face,), (400, 300))).detections[0]
    miss = math.dist(out.landmarks[1][:2], face.keypoints[1])
    assert miss > EYE_GAP / 4  # the fixture can tell a rotation-blind cascade from a right one


def test_presence_below_the_threshold_drops_the_landmarks():
    frame, face = _face(0.0)
    stage = SecondStage(_upright_landmark_model(present=False), "landmarks", (), LANDMARK_OPTIONS, parse_roi(EYES))
    out = stage(frame, Detections((face,), (400, 300))).detections[0]
    assert out.landmarks == () and out.landmark_score < 0.5
    assert out.to_dict()["landmarks"] == [] and "landmark_score" in out.to_dict()


def _colour_classifier() -> FakeRuntime:
    spec = InputSpec(shape=(1, 32, 32, 3), colour="rgb", mean=(0.0,), std=(255.0,))
    return FakeRuntime(lambda t: [np.array([[t[0, ..., 0].mean(), t[0, ..., 2].mean()]], np.float32)], spec)


def test_a_classifier_gives_each_detection_its_sub_label():
    frame = np.zeros((200, 300, 3), np.uint8)
    frame[20:80, 20:80] = (0, 0, 255)  # red (BGR)
    frame[100:180, 180:260] = (255, 0, 0)  # blue
    found = Detections((Detection(0, "thing", 0.9, (20, 20, 80, 80)), Detection(0, "thing", 0.8, (180, 100, 260, 180))),
                       (300, 200))
    stage = SecondStage(_colour_classifier(), "classify", ("red", "blue"), {"softmax": "never"}, parse_roi(None))
    out = stage(frame, found).detections
    assert [d.sub_label for d in out] == ["red", "blue"]
    assert out[0].sub_label_score == pytest.approx(1.0, abs=0.02)
    assert out[0].to_dict()["sub_label"] == "red" and str(found).startswith("thing")


def test_at_most_max_regions_run_best_first():
    frame, face = _face(0.0)
    runtime = _upright_landmark_model()
    stage = SecondStage(runtime, "landmarks", (), LANDMARK_OPTIONS, parse_roi({**EYES, "max_regions": 2}))
    out = stage(frame, Detections((face,) * 5, (400, 300))).detections
    assert runtime.calls == 2 and stage.regions == 2
    assert [d.landmarks is not None for d in out] == [True, True, False, False, False]
    assert "second_stage@k=2" in stage.stage_ns and stage.stage_ns["second_inference"] > 0


def test_a_first_stage_that_is_not_a_detector_is_refused():
    from edgekit.errors import UsageError
    from edgekit.heads.classify import Classification

    stage = SecondStage(_colour_classifier(), "classify", ("red", "blue"))
    with pytest.raises(UsageError, match="must be a detector"):
        stage(np.zeros((10, 10, 3), np.uint8), Classification(()))


def test_the_pipeline_records_the_second_stage_beside_the_first():
    frame, face = _face(40.0)
    detector = FakeRuntime(lambda t: [np.zeros((1, 1), np.float32)], InputSpec(shape=(1, 16, 16, 3)))
    stage = SecondStage(_upright_landmark_model(), "landmarks", (), LANDMARK_OPTIONS, parse_roi(EYES))
    pipeline = Pipeline(detector, decoder=lambda outputs: Detections((face,), (400, 300)), warmup=0, then=stage)
    result = pipeline.step(Frame(frame, 0, 0))
    assert len(result.result.detections[0].landmarks) == 2
    assert {"second_stage", "second_stage@k=1", "crop", "second_inference"} <= set(result.timings_ms)
    assert "second_stage@k=1" in pipeline.metrics.summary()["stages"]
    assert result.to_dict()["detections"][0]["landmarks"][0][:2] == pytest.approx(face.keypoints[0], abs=1.5)


def _tracking_stage(present: list[bool]) -> tuple[SecondStage, FakeRuntime]:
    """A landmark model whose presence follows ``present`` call by call, and a stage tracking its two eyes."""
    model = _upright_landmark_model()
    calls = iter(present)
    inner = model._fn

    def infer(tensor):
        points, _flag = inner(tensor)
        return [points, np.array([[4.0 if next(calls, True) else -4.0]], np.float32)]

    model._fn = infer
    track = parse_roi({**EYES, "rotation_vector_start_keypoint_index": 0, "rotation_vector_end_keypoint_index": 1})
    return SecondStage(model, "landmarks", (), LANDMARK_OPTIONS, parse_roi(EYES), track), model


def test_tracking_follows_the_landmarks_and_detects_again_when_presence_drops():
    frame, face = _face(40.0)
    stage, _model = _tracking_stage([True, True, True, False, True])
    detector = FakeRuntime(lambda t: [np.zeros((1, 1), np.float32)], InputSpec(shape=(1, 16, 16, 3)))
    pipeline = Pipeline(detector, decoder=lambda outputs: Detections((face,), (400, 300)), warmup=0, then=stage)
    results = [pipeline.step(Frame(frame, 0, i)) for i in range(4)]
    # frame 0 detects; frames 1-2 follow the landmarks; frame 3 loses the face (presence) and detects again
    assert detector.calls == 2
    assert ["tracked" in r.timings_ms for r in results] == [False, True, True, False]
    for r in results:
        eyes = r.result.detections[0].landmarks
        assert eyes[0][:2] == pytest.approx(face.keypoints[0], abs=1.5)
        assert eyes[1][:2] == pytest.approx(face.keypoints[1], abs=1.5)


def test_tracking_needs_a_landmarks_model():
    from edgekit.errors import UsageError

    with pytest.raises(UsageError, match="--track-roi follows landmarks"):
        SecondStage(_colour_classifier(), "classify", ("red", "blue"), {}, parse_roi(None), parse_roi(EYES))
