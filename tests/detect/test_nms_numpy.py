"""The numpy NMS (edgekit.detect.nms_numpy) keeps exactly the boxes OpenCV's keeps.

Both backends run on the same inputs through :func:`edgekit.detect.nms.nms` (``backend=``):
random scenes, adversarial ones (equal scores, identical boxes, boxes of no area, IoU exactly at
the threshold, one class, 80 classes, class-agnostic, every ``max_detections``), the detect head
on array outputs and on the demo detector's real outputs; and without OpenCV the head still works.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit.detect import nms as nms_module
from edgekit.detect.head import detector
from edgekit.detect.nms import nms
from edgekit.detect.nms_numpy import ratio_limit
from edgekit.errors import UsageError
from tests.helpers.detect_outputs import Outputs

cv2 = pytest.importorskip("cv2")  # the reference; the numpy path itself is tested without it below

ROOT = Path(__file__).resolve().parents[2]
THRESHOLDS = (0.0, 0.25, 0.3333333, 0.45, 0.5, 0.7, 1.0)


def _both(boxes, scores, classes, iou, limit, agnostic=False) -> np.ndarray:
    found = nms(boxes, scores, classes, iou, limit, agnostic, backend="opencv")
    np.testing.assert_array_equal(nms(boxes, scores, classes, iou, limit, agnostic, backend="numpy"), found)
    return found


def _scene(rng, kind: str, n: int):
    """Boxes (xyxy float32), scores, classes for one kind of scene."""
    if kind == "grid":  # whole pixels and quarter scores: many equal IoUs and equal scores
        xy = rng.integers(0, 20, (n, 2))
        wh = rng.integers(0, 8, (n, 2))
        scores = rng.integers(1, 5, n) / 4
    elif kind == "halves":  # IoUs exactly at 0.5, 1/3, ... and scores of 0 (never kept)
        xy, wh = rng.integers(0, 40, (n, 2)) / 2, rng.integers(1, 12, (n, 2)) / 2
        scores = rng.integers(0, 8, n) / 8
    elif kind == "points":  # duplicates, lines and points (no area), one score
        xy, wh = rng.integers(0, 10, (n, 2)), rng.integers(0, 3, (n, 2)) * 0.5
        scores = np.full(n, 0.5)
    elif kind == "edges":  # floats, many boxes past the top/left edge (negative coordinates)
        xy, wh = rng.random((n, 2)) * 300 - 50, rng.random((n, 2)) * 80
        scores = rng.random(n)
    else:  # "crowded": a trained detector's shape of scores, boxes piled on a few objects
        centres = rng.random((6, 2)) * 64
        xy = centres[rng.integers(0, 6, n)] + rng.normal(0, 2, (n, 2))
        wh = rng.random((n, 2)) * 10 + 20
        scores = rng.random(n) ** 3
    xy = np.asarray(xy, np.float32)
    return np.concatenate([xy, xy + np.asarray(wh, np.float32)], axis=1), scores.astype(np.float32)


@pytest.mark.parametrize("kind", ["grid", "halves", "points", "edges", "crowded"])
def test_random_scenes_keep_the_same_boxes(kind):
    rng = np.random.default_rng(sum(map(ord, kind)))
    for _ in range(120):
        n = int(rng.integers(1, 300))
        boxes, scores = _scene(rng, kind, n)
        classes = rng.integers(0, int(rng.choice([1, 2, 10, 80])), n)
        _both(boxes, scores, classes, float(rng.choice(THRESHOLDS)), int(rng.choice([1, 5, 100, 300])),
              bool(rng.integers(2)))


def test_thresholds_exactly_at_a_pairs_overlap_and_one_float_either_side():
    """OpenCV rounds 1 - IoU to float and compares 1.f - that with the float threshold: so must numpy."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(2, 40))
        xy = (rng.random((n, 2)) * 50).astype(np.float32)
        boxes = np.concatenate([xy, xy + (rng.random((n, 2)) * 30 + 0.1).astype(np.float32)], axis=1)
        scores, classes = rng.random(n).astype(np.float32), rng.integers(0, 3, n)
        a, b = boxes[rng.integers(0, n, 2)].astype(np.float64)
        inter = max(min(a[2], b[2]) - max(a[0], b[0]), 0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0)
        area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
        overlap = np.float32(1) - np.float32(1 - inter / (area(a) + area(b) - inter))
        for iou in (overlap, np.nextafter(overlap, np.float32(0)), np.nextafter(overlap, np.float32(2))):
            _both(boxes, scores, classes, float(iou), 100, bool(rng.integers(2)))


def test_equal_scores_go_in_index_order_and_an_iou_at_the_threshold_keeps():
    boxes = np.float32([[50, 50, 55, 55], [0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 5]])
    scores = np.float32([0.5, 0.5, 0.5, 0.4])
    classes = np.zeros(4, np.int64)
    assert _both(boxes, scores, classes, 0.5, 10).tolist() == [0, 1, 3]  # box 3: IoU 0.5 with box 1, kept
    assert _both(boxes, scores, classes, 0.49, 10).tolist() == [0, 1]
    assert _both(boxes, scores, classes, 1.0, 10).tolist() == [0, 1, 2, 3]  # identical boxes: IoU 1 <= 1


def test_boxes_of_no_area():
    # OpenCV counts two boxes of no area as the same box wherever they lie (jaccardDistance 0)
    points = np.float32([[0, 0, 0, 0], [30, 30, 30, 30], [1, 1, 3, 3], [5, 5, 5, 9]])
    scores = np.float32([0.9, 0.8, 0.7, 0.6])
    assert _both(points, scores, np.zeros(4, np.int64), 0.5, 10).tolist() == [0, 2]
    assert _both(points, scores, np.array([0, 1, 0, 1]), 0.5, 10).tolist() == [0, 1, 2]  # not across classes
    assert _both(points, scores, np.zeros(4, np.int64), 1.0, 10).tolist() == [0, 1, 2, 3]


def test_scores_of_zero_and_boxes_that_are_not_finite_take_no_part():
    boxes = np.float32([[0, 0, 10, 10], [0, 0, np.nan, 10], [20, 20, 30, 30], [40, 40, np.inf, 50]])
    scores = np.float32([0.0, 0.9, 0.5, 0.8])
    assert _both(boxes, scores, np.zeros(4, np.int64), 0.5, 10).tolist() == [2]


def test_max_detections_and_class_counts():
    rng = np.random.default_rng(3)
    boxes, scores = _scene(rng, "edges", 1500)
    for nc in (1, 2, 80):
        classes = rng.integers(0, nc, 1500)
        for limit in (1, 7, 100, 1000, 2000):
            for agnostic in (False, True):
                kept = _both(boxes, scores, classes, 0.45, limit, agnostic)
                assert len(kept) <= limit
    assert _both(boxes[:0], scores[:0], np.zeros(0, np.int64), 0.45, 10).tolist() == []


def test_batched_opencv_does_not_suppress_across_classes_past_the_edge():
    """NMSBoxesBatched's class offset overlaps classes when a box has a negative coordinate."""
    boxes = np.float32([[-20, -20, 5, 5], [-25, -25, 0, 0], [300, 300, 310, 310]])
    assert _both(boxes, np.float32([0.9, 0.8, 0.7]), np.array([0, 1, 1]), 0.5, 10).tolist() == [0, 1, 2]


def test_the_ratio_limit_is_the_last_ratio_opencv_keeps():
    for iou in THRESHOLDS:
        q = ratio_limit(iou)
        for ratio, keeps in ((q, True), (np.nextafter(q, np.inf), False)):
            overlap = np.float32(1) - np.float32(1.0 - ratio)
            assert bool(overlap <= np.float32(iou)) is keeps


def _yolo(rng, n=2000, nc=10, side=64.0):
    out = np.zeros((1, 4 + nc, n), np.float32)
    out[0, :2] = rng.random((2, n)) * side
    out[0, 2:4] = rng.random((2, n)) * side / 6 + 2
    out[0, 4:] = rng.random((nc, n)) ** 6
    return out


def _detections(found):
    return [(d.index, d.score, d.box) for d in found.detections]


@pytest.mark.parametrize("options", [{}, {"class_agnostic": True}, {"score_threshold": 0.05, "max_detections": 300},
                                     {"iou_threshold": 0.7}])
def test_the_detect_head_finds_the_same_with_either_backend(monkeypatch, options):
    rng = np.random.default_rng(11)
    labels = [str(i) for i in range(10)]
    for _ in range(5):
        out = _yolo(rng)
        decode = detector(labels, Outputs([out.shape]), **options)
        with_opencv = _detections(decode([out]))
        monkeypatch.setattr(nms_module, "optional_cv2", lambda: None)  # "auto" finds no OpenCV
        assert _detections(decode([out])) == with_opencv
        monkeypatch.undo()
        assert len(with_opencv) > 5


def test_the_demo_detectors_outputs_decode_the_same(monkeypatch):
    pytest.importorskip("onnxruntime")
    from edgekit.imaging.image import Preprocessor, read_image
    from scripts.train_detector import onnx_runtime

    labels = (ROOT / "models" / "detector.labels.txt").read_text().split()
    runtime = onnx_runtime(ROOT / "models" / "detector.onnx")
    try:
        prep = Preprocessor(runtime.input_spec)
        outputs = [runtime.infer(prep(read_image(p)))
                   for p in sorted((ROOT / "eval" / "detect").glob("*.jpg"))[:12]]
        decoders = [detector(labels, runtime, **options) for options in
                    ({"score_threshold": 0.001}, {"score_threshold": 0.001, "class_agnostic": True}, {})]
    finally:
        runtime.close()
    for decode in decoders:
        with_opencv = [_detections(decode(o)) for o in outputs]
        monkeypatch.setattr(nms_module, "optional_cv2", lambda: None)
        assert [_detections(decode(o)) for o in outputs] == with_opencv
        monkeypatch.undo()
    assert sum(map(len, with_opencv)) > 0


WITHOUT_OPENCV = """
import json, sys
sys.modules["cv2"] = None  # a [litert] install: no OpenCV
import numpy as np
from tests.helpers.detect_outputs import Outputs
from edgekit.detect.head import detector
from edgekit.detect.nms import nms
from edgekit.errors import BackendUnavailable
out = np.load(sys.argv[1])
found = detector([str(i) for i in range(10)], Outputs([out.shape]))([out])
try:
    nms(np.zeros((1, 4), np.float32), np.ones(1, np.float32), np.zeros(1, np.int64), 0.5, 1, backend="opencv")
    refused = ""
except BackendUnavailable as exc:
    refused = str(exc)
assert sys.modules["cv2"] is None
print(json.dumps({"found": [[d.index, d.score, list(d.box)] for d in found.detections], "refused": refused}))
"""


def test_the_detect_head_works_without_opencv(tmp_path):
    out = _yolo(np.random.default_rng(5))
    np.save(tmp_path / "out.npy", out)
    done = subprocess.run([sys.executable, "-c", WITHOUT_OPENCV, str(tmp_path / "out.npy")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    expected = detector([str(i) for i in range(10)], Outputs([out.shape]))([out])
    assert result["found"] == [[d.index, d.score, list(d.box)] for d in expected.detections]
    assert len(result["found"]) > 5
    assert "needs OpenCV" in result["refused"] and "\n" not in result["refused"]


def test_an_unknown_backend_is_refused_in_one_line():
    with pytest.raises(UsageError, match="unknown NMS backend 'torch'"):
        nms(np.zeros((1, 4), np.float32), np.ones(1, np.float32), np.zeros(1, np.int64), 0.5, 1, backend="torch")
