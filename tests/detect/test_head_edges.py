"""The detect head's edges, pinned: the shapes each YOLO layout takes, the box units boundary,
objectness on quantised outputs, the candidate cap, NMS ties and rounds, the message without
OpenCV, and the map back onto the frame.

Each test here holds behaviour that a planted one-line bug changed while the rest of the
fast suite stayed green (``python -m scripts.mutate detect_yolo detect_nms detect_boxes``,
docs/mutation.md). Arrays stand for model outputs; NMS is OpenCV's real one.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from edgekit.detect import nms as nms_module
from edgekit.detect import yolo
from edgekit.detect.boxes import Detection, Detections
from edgekit.detect.config import DetectConfig
from edgekit.detect.head import detector
from edgekit.detect.nms import nms
from edgekit.detect.scores import real
from edgekit.errors import BackendUnavailable
from edgekit.imaging.geometry import box_map
from edgekit.imaging.image import InputSpec
from tests.helpers.detect_outputs import Outputs


def _config(num_classes=2, **kw) -> DetectConfig:
    return DetectConfig(input_size=(64, 64), num_classes=num_classes, **kw)


def _found(found):
    return [(d.index, round(d.score, 4), tuple(round(v, 2) for v in d.box)) for d in found.detections]


# ---------------------------------------------------------------------------------------------
# which outputs the YOLO layouts take


@pytest.mark.parametrize("shapes, num_classes, fits", [
    ([(1, 6, 8400)], None, True),
    ([(6, 8400)], None, True),  # a 2-D output (no batch dimension)
    ([(8400, 6)], None, True),
    ([(2, 6, 8400)], None, False),  # batch 2: edgekit runs one frame at a time
    ([(1, 1, 6, 8400)], None, False),
    ([(1, 6)], None, False),
    ([(1, 6, 8400), (1, 6, 8400)], None, False),
    ([(1, 5, 8400)], None, True),  # one class
    ([(1, 4, 8400)], None, False),  # boxes and no score
    ([(1, 3, 8400)], None, False),
    ([(1, 6, 6)], None, False),  # unknown classes: which side is K cannot be told
    ([(1, 6, 8400)], 2, True),
    ([(1, 7, 8400)], 2, False),  # 4 + 3: another class count than the labels'
    ([(1, 8400, 6)], 2, True),
    ([(1, 84, 84)], 80, True),
])
def test_anchor_free_yolo_fits(shapes, num_classes, fits):
    assert yolo.fits(shapes, _config(num_classes)) is fits


@pytest.mark.parametrize("shapes, num_classes, fits", [
    ([(1, 8400, 7)], 2, True),
    ([(1, 7, 8400)], 2, True),
    ([(1, 8400, 6)], 2, False),
    ([(1, 8400, 85)], None, False),  # the class count must be known: [N, 85] is also 81 classes anchor-free
])
def test_objectness_yolo_fits(shapes, num_classes, fits):
    assert yolo.fits_objectness(shapes, _config(num_classes)) is fits


@pytest.mark.parametrize("shape, width, rows", [
    ((6, 50), None, (6, 50)),  # [K, N] as it is
    ((50, 6), None, (6, 50)),  # [N, K] transposed
    ((1, 6, 50), None, (6, 50)),
    ((6, 6), None, (6, 6)),
    ((84, 50), 84, (84, 50)),  # more classes than anchors: the width decides, not the smaller side
    ((50, 84), 84, (84, 50)),
    ((84, 84), 84, (84, 84)),  # square: channels first
    ((7, 50), 6, (7, 50)),  # no side is the width (fits refuses it): left as it is
])
def test_channels_first_is_a_view(shape, width, rows):
    out = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    got = yolo.channels_first(out, width)
    assert got.shape == rows and np.shares_memory(got, out)
    transposed = rows != shape[-2:]
    np.testing.assert_array_equal(got, out.reshape(shape[-2:]).T if transposed else out.reshape(shape[-2:]))


def _v8(n, nc, at, box, cls, score=0.9, transpose=False):
    """A YOLOv8 output ``[1, 4 + nc, n]`` with one box at anchor ``at``."""
    out = np.zeros((1, 4 + nc, n), np.float32)
    out[0, :4, at] = box
    out[0, 4 + cls, at] = score
    return out.transpose(0, 2, 1).copy() if transpose else out


@pytest.mark.parametrize("transpose", [False, True])
def test_more_classes_than_anchors_reads_the_width_from_the_labels(transpose):
    out = _v8(50, 80, at=7, box=[32, 20, 16, 8], cls=41, transpose=transpose)
    found = detector([str(i) for i in range(80)], Outputs([out.shape]))([out])
    assert _found(found) == [(41, 0.9, (24, 16, 40, 24))]


def test_a_square_output_is_channels_first():
    """YOLOv8 at 64 x 64 has 8*8 + 4*4 + 2*2 = 84 anchors: with COCO's 80 classes Ultralytics
    exports ``[1, 84, 84]``, channels first like every other size."""
    out = _v8(84, 80, at=7, box=[32, 20, 16, 8], cls=41)
    found = detector([str(i) for i in range(80)], Outputs([out.shape]))([out])
    assert _found(found) == [(41, 0.9, (24, 16, 40, 24))]


def test_unknown_classes_take_the_smaller_side_as_the_values():
    out = _v8(100, 3, at=9, box=[10, 10, 4, 4], cls=2)
    cand = yolo.candidates([out], _config(None), [])
    assert cand.classes.tolist() == [2] and cand.scores.tolist() == [pytest.approx(0.9)]
    np.testing.assert_allclose(cand.boxes, [[8, 8, 12, 12]])
    assert [d.index for d in detector([], Outputs([out.shape]))([out]).detections] == [2]


def test_the_outputs_option_picks_the_output_and_its_quantisation():
    out = _v8(100, 2, at=9, box=[10, 10, 4, 4], cls=1, score=0.5)
    q = np.round(out / 0.25).astype(np.uint8)  # box and score exact in steps of 0.25 (the score is 2 x 0.25)
    decoy = _v8(100, 2, at=3, box=[50, 50, 4, 4], cls=0)
    cand = yolo.candidates([decoy, q], _config(outputs=(1,)), [None, (0.25, 0)])
    assert cand.classes.tolist() == [1] and cand.scores.tolist() == [0.5]
    np.testing.assert_allclose(cand.boxes, [[8, 8, 12, 12]])
    found = detector(["a", "b"], Outputs([out.shape]), outputs=[0])([out])
    assert [d.label for d in found.detections] == ["b"]


def test_logit_class_scores_go_through_the_sigmoid():
    out = np.full((1, 6, 100), -6.0, np.float32)
    out[0, :4] = [[32], [32], [8], [8]]
    out[0, 5, 40] = 2.0
    found = detector(["a", "b"], Outputs([out.shape]))([out])
    assert [(d.label, round(d.score, 4)) for d in found.detections] == [("b", round(1 / (1 + np.exp(-2.0)), 4))]


# ---------------------------------------------------------------------------------------------
# box format and units


def test_boxes_up_to_1_5_are_normalised_and_above_are_pixels():
    config = _config()
    np.testing.assert_allclose(yolo.to_xyxy(np.float32([[0, 0.5, 1.5, 1.0]]), config, "xyxy"), [[0, 32, 96, 64]])
    np.testing.assert_allclose(yolo.to_xyxy(np.float32([[0, 0.5, 1.5001, 1.0]]), config, "xyxy"),
                               [[0, 0.5, 1.5001, 1.0]], rtol=1e-6)


@pytest.mark.parametrize("raw", [np.array([[10, 10, 4, 4]]), np.array([[0.5, 0.5, 0.25, 0.25]], np.float64)])
def test_boxes_come_out_float32_whatever_the_raw_type(raw):
    boxes = yolo.to_xyxy(raw, _config())
    assert boxes.dtype == np.float32
    np.testing.assert_allclose(boxes, [[8, 8, 12, 12]] if raw.dtype.kind == "i" else [[24, 24, 40, 40]])


# ---------------------------------------------------------------------------------------------
# YOLOv5 objectness


def _v5(rows, n=20):
    """A YOLOv5 output ``[1, n, 5 + nc]``: ``rows`` maps anchor -> (cx, cy, w, h, objectness, *classes)."""
    width = len(next(iter(rows.values())))
    out = np.zeros((1, n, width), np.float32)
    for anchor, values in rows.items():
        out[0, anchor] = values
    return out


def test_quantised_objectness_decodes_as_its_real_values():
    """int8 with zero point -128: objectness 0.4 is raw -26, under the float threshold 0.25 read raw."""
    out = _v5({2: [0.5, 0.5, 0.25, 0.25, 0.4, 1.0, 0.0, 0.0],   # 0.4 x 1.0: class a
               6: [0.25, 0.25, 0.125, 0.25, 0.9, 0.2, 0.0, 0.6],  # 0.9 x 0.6: class c
               9: [0.75, 0.75, 0.25, 0.25, 0.2, 1.0, 1.0, 1.0]})  # objectness too low
    scale, zero_point = 1 / 255, -128
    q = (np.round(out / scale) + zero_point).astype(np.int8)
    labels = ["a", "b", "c"]
    quantised = detector(labels, Outputs([q.shape], [(scale, zero_point)]))([q])
    floating = detector(labels, Outputs([q.shape]))([real(q, (scale, zero_point))])
    assert [(d.label, round(d.score, 2)) for d in quantised.detections] == [("c", 0.54), ("a", 0.4)]
    assert _found(quantised) == _found(floating)
    np.testing.assert_allclose(quantised.detections[1].box, [24, 24, 40, 40], atol=0.2)


def test_objectness_with_nothing_above_the_threshold():
    out = _v5({3: [32, 32, 8, 8, 0.2, 1.0, 1.0]})
    cand = yolo.objectness([out], _config(), [])
    assert cand.boxes.shape == (0, 4) and cand.scores.dtype == np.float32 and cand.classes.dtype == np.int64
    assert len(detector(["a", "b"], Outputs([out.shape]))([out])) == 0


def test_an_objectness_score_exactly_at_the_threshold_is_not_a_detection():
    out = _v5({3: [32, 32, 8, 8, 0.5, 0.5, 0.0], 5: [10, 10, 8, 8, 0.5, 0.0, 0.5001]})
    cand = yolo.objectness([out], _config(), [])  # 0.5 x 0.5 is 0.25 exactly, the default threshold
    assert cand.classes.tolist() == [1] and cand.scores.dtype == np.float32


def test_objectness_candidates_capped_to_the_best():
    rng = np.random.default_rng(5)
    n, nc = 300, 4
    out = np.zeros((1, n, 5 + nc), np.float32)
    out[0, :, :4] = [32, 32, 8, 8]
    out[0, :, 4] = rng.uniform(0.3, 1.0, n)
    out[0, :, 5:] = rng.uniform(0.3, 1.0, (n, nc))
    scores = out[0, :, 4] * out[0, :, 5:].max(axis=1)
    for cap in (1, 7, 40, int((scores > 0.25).sum()) - 1):
        cand = yolo.objectness([out], _config(nc, max_candidates=cap), [])
        np.testing.assert_array_equal(np.sort(cand.scores), np.sort(scores[scores > 0.25])[-cap:])


def test_objectness_candidates_at_the_cap_keep_anchor_order():
    out = _v5({a: [a, 10, 4, 4, 0.3 + 0.1 * i, 1.0, 0.0] for i, a in enumerate((2, 5, 8, 11, 14))})
    cand = yolo.objectness([out], _config(max_candidates=5), [])
    assert cand.boxes[:, 0].tolist() == [0, 3, 6, 9, 12]  # cx 2, 5, 8, ... minus half of w 4


# ---------------------------------------------------------------------------------------------
# NMS


def test_nms_without_opencv_runs_in_numpy_and_refuses_only_an_explicit_opencv_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 raises ImportError
    monkeypatch.setattr(nms_module, "optional_cv2", lambda: None)  # what the cached lookup says on such an install
    boxes, scores = np.float32([[0, 0, 10, 10], [1, 0, 11, 10]]), np.float32([0.9, 0.8])
    assert nms(boxes, scores, np.array([0, 0]), 0.5, 10).tolist() == [0]  # auto: numpy, the same box kept
    with pytest.raises(BackendUnavailable) as err:
        nms(boxes, scores, np.array([0, 0]), 0.5, 10, backend="opencv")
    assert "needs OpenCV" in str(err.value) and "opencv" in str(err.value)


def test_nms_of_nothing():
    kept = nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), 0.5, 10)
    assert kept.dtype == np.int64 and kept.shape == (0,)


@pytest.mark.parametrize("agnostic", [False, True])
def test_nms_iou_threshold_and_sub_pixel_widths(agnostic):
    third = np.float32([[0, 0, 10, 10], [5, 0, 15, 10]])  # IoU 1/3
    assert nms(third, np.float32([0.9, 0.8]), np.array([0, 0]), 0.5, 10, agnostic).tolist() == [0, 1]
    assert nms(third, np.float32([0.9, 0.8]), np.array([0, 0]), 0.3, 10, agnostic).tolist() == [0]
    thin = np.float32([[0, 0, 0.5, 10], [0.5, 0, 1.0, 10]])  # side by side, half a pixel wide: no overlap
    assert nms(thin, np.float32([0.9, 0.8]), np.array([0, 0]), 0.1, 10, agnostic).tolist() == [0, 1]


def test_nms_class_ids_given_as_floats():
    """TFLite writes class ids as floats; NMS reads them as the integers they are."""
    boxes = np.float32([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 9]])
    kept = nms(boxes, np.float32([0.9, 0.8, 0.7]), np.float32([0.0, 1.0, 0.0]), 0.5, 10)
    assert kept.tolist() == [0, 1]


@pytest.mark.parametrize("classes_of_pairs", [
    lambda p: np.zeros_like(p),  # one class: one batched call
    lambda p: p % 2,  # two big classes: one call per class
    lambda p: p,  # a class per pair: one batched call over many classes
    None,  # class-agnostic
])
def test_nms_ties_go_to_the_lower_index_on_every_path(classes_of_pairs):
    """Pairs of identical boxes with equal scores: the first of each pair stays (OpenCV visits
    equal scores in index order), and equal scores come out in index order."""
    rng = np.random.default_rng(2)
    pairs = 100
    xy = np.repeat(np.arange(pairs) * 40.0, 2)[:, None]
    boxes = np.concatenate([xy, xy * 0, xy + 20, xy * 0 + 20], axis=1).astype(np.float32)
    scores = np.repeat(rng.choice(np.float32([0.3, 0.5, 0.7]), pairs), 2)
    pair = np.repeat(np.arange(pairs), 2)
    classes = pair if classes_of_pairs is None else classes_of_pairs(pair)
    kept = nms(boxes, scores, classes, 0.5, 300, class_agnostic=classes_of_pairs is None)
    firsts = np.arange(0, 2 * pairs, 2)
    np.testing.assert_array_equal(kept, firsts[np.lexsort((firsts, -scores[firsts]))])


def test_nms_grows_its_rounds_until_enough_are_kept():
    """The best 64 boxes pile on 4 objects: the first round keeps 4 of the 10 wanted, the next
    round takes more candidates (not yet all 1,000) and finds the rest."""
    import cv2

    rng = np.random.default_rng(4)
    piles = np.repeat(np.float32([[0, 0, 20, 20], [100, 0, 120, 20], [0, 100, 20, 120], [100, 100, 120, 120]]),
                      16, axis=0)
    xy = rng.random((936, 2)).astype(np.float32) * 3000 + 200
    boxes = np.concatenate([piles, np.concatenate([xy, xy + 10], axis=1)])
    scores = np.concatenate([np.linspace(0.99, 0.9, 64), np.linspace(0.89, 0.3, 936)]).astype(np.float32)
    classes = np.zeros(1000, np.int64)
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1).astype(np.float64)
    full = np.asarray(cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), 0.0, 0.5)).reshape(-1)
    kept = nms(boxes, scores, classes, 0.5, 10)
    np.testing.assert_array_equal(kept, full[:10])
    assert kept[:4].tolist() == [0, 16, 32, 48] and (kept[4:] >= 64).all()


class _CountedOpenCV:
    """OpenCV with each NMS call written down (function, box count); the real ``cv2.dnn`` does the work."""

    def __init__(self):
        import cv2

        self._dnn = cv2.dnn
        self.dnn = self
        self.calls: list[tuple[str, int]] = []

    def NMSBoxes(self, boxes, *args):  # noqa: N802 - OpenCV's name
        self.calls.append(("NMSBoxes", len(boxes)))
        return self._dnn.NMSBoxes(boxes, *args)

    def NMSBoxesBatched(self, boxes, *args):  # noqa: N802 - OpenCV's name
        self.calls.append(("NMSBoxesBatched", len(boxes)))
        return self._dnn.NMSBoxesBatched(boxes, *args)


def _grid(n, at=0.0):
    """``n`` boxes 10 px wide, 20 px apart in rows of 40: no two overlap."""
    i = np.arange(n)
    xy = np.stack([i % 40, i // 40], axis=1) * 20.0 + at
    return np.concatenate([xy, xy + 10], axis=1).astype(np.float32)


@pytest.mark.parametrize("counts, calls", [
    ([10], [("NMSBoxes", 10)]),  # one class: plain NMS
    ([100, 100], [("NMSBoxes", 100)] * 2),  # 2 calls + 20,000 pairs beat 1 call + 40,000 pairs
    ([40, 40], [("NMSBoxes", 40)] * 2),  # 2 calls + 3,200 pairs beat 1 call + 6,400 pairs
    ([30, 50], [("NMSBoxesBatched", 80)]),  # 2 calls + 3,400 pairs cost as much as 1 call + 6,400 pairs: one call
    ([2] * 100, [("NMSBoxesBatched", 200)]),  # many small classes: one call
])
def test_class_aware_nms_runs_per_class_only_when_the_cost_model_says_it_is_cheaper(counts, calls):
    """The cost model (``CALL_NS`` per call, ``PAIR_NS`` per box pair compared) picks the calls;
    either way every box of these apart is kept."""
    n = sum(counts)
    counted = _CountedOpenCV()
    boxes = _grid(n).astype(np.float64)
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
    classes = np.repeat(np.arange(len(counts)), counts).astype(np.int32)
    kept = nms_module._suppress(counted, xywh, np.linspace(0.9, 0.3, n, dtype=np.float32), classes, 0.5)
    assert counted.calls == calls
    assert sorted(kept.tolist()) == list(range(n))


def _piled(piles, n):
    """The best 64 of ``n`` boxes piled on ``piles`` objects (box i on pile i % piles), the rest apart."""
    k = 64 if piles else 0
    pile = np.arange(k) % max(piles, 1)
    on_piles = np.stack([pile * 50.0, pile * 0.0, pile * 50.0 + 20, pile * 0.0 + 20], axis=1)
    boxes = np.concatenate([on_piles, _grid(n - k, at=1000.0)]).astype(np.float32)
    return boxes, np.linspace(0.99, 0.3, n, dtype=np.float32)


@pytest.mark.parametrize("piles, n, limit, rounds", [
    (0, 1000, 100, [200]),  # the first round: the best 2 x max_detections...
    (0, 1000, 10, [64]),  # ... and at least 64
    (0, 50, 10, [50]),  # fewer candidates: all of them
    (10, 1000, 10, [64]),  # the first round keeps max_detections: the answer
    (4, 1000, 10, [64, 200]),  # keeps 4 of 10: 64 x 10 / 4 x 1.25 = 200 more, under a third of 1,000
    (4, 700, 10, [64, 200]),  # 200 is under 700 // 3
    (4, 601, 10, [64, 601]),  # 200 is 601 // 3: a third or more, all at once
    (7, 1000, 10, [64, 128]),  # 64 x 10 / 7 x 1.25 = 114: at least twice the last round
    (1, 1000, 10, [64, 1000]),  # one object under the best 64: 800 needed, all at once
])
def test_nms_rounds_grow_as_the_kept_share_says(monkeypatch, piles, n, limit, rounds):
    import cv2

    boxes, scores = _piled(piles, n)
    counted = _CountedOpenCV()
    monkeypatch.setattr(nms_module, "_opencv", lambda _backend: counted)
    kept = nms(boxes, scores, np.zeros(n, np.int64), 0.5, limit)
    assert [size for _, size in counted.calls] == rounds
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1).astype(np.float64)
    full = np.asarray(cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), 0.0, 0.5)).reshape(-1)
    np.testing.assert_array_equal(kept, full[:limit])
    assert kept[: min(piles, limit)].tolist() == list(range(min(piles, limit)))


def test_nms_is_opencvs_on_the_exact_box_values():
    """Widths in float64 (OpenCV's Rect2d is double): at an IoU threshold equal to this pair's IoU
    both stay, as OpenCV keeps them given the boxes' exact values (float32 widths round it over)."""
    import cv2

    boxes = np.float32([[54.95936965942383, 2.755911350250244, 75.35131072998047, 53.8143310546875],
                        [53.25668716430664, 5.640198707580566, 73.38326263427734, 53.34931182861328]])
    threshold = 0.7831225991249084
    b = boxes.astype(np.float64)
    xywh = np.concatenate([b[:, :2], b[:, 2:] - b[:, :2]], axis=1)
    assert np.asarray(cv2.dnn.NMSBoxes(xywh.tolist(), [0.9, 0.8], 0.0, threshold)).tolist() == [0, 1]
    assert nms(boxes, np.float32([0.9, 0.8]), np.zeros(2, np.int64), threshold, 10).tolist() == [0, 1]


def test_nms_reads_scores_as_opencv_does():
    """OpenCV takes float32 scores: two float64 scores equal in float32 are a tie, the lower index wins."""
    import cv2

    boxes = np.float32([[0, 0, 10, 10], [0, 0, 10, 10]])
    scores = np.array([0.5, 0.5 + 1e-9])
    assert np.asarray(cv2.dnn.NMSBoxes([[0, 0, 10, 10]] * 2, scores.tolist(), 0.0, 0.5)).tolist() == [0]
    assert nms(boxes, scores, np.zeros(2, np.int64), 0.5, 10).tolist() == [0]


# ---------------------------------------------------------------------------------------------
# boxes back onto the frame


def test_stretch_maps_exactly():
    spec = InputSpec.from_dict({"shape": [1, 160, 160, 3], "dtype": "float32", "resize": "stretch"})
    mapping = box_map(spec, (480, 640, 3))
    out = mapping(np.float32([[10, 10, 80, 150]]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[40, 30, 320, 450]])  # x by 4, y by 3
    mapping = box_map(spec, (480, 640, 3))
    assert mapping(np.array([[0.1, 0.1, 0.2, 0.2]], np.float64)).dtype == np.float32


def test_detections_without_a_frame_are_in_input_pixels():
    out = _v8(100, 2, at=9, box=[10, 10, 4, 4], cls=1)
    found = detector(["a", "b"], Outputs([out.shape]))([out])
    assert found.size == (64, 64) and found.to_dict()["image_size"] == [64, 64]


def test_detections_text_separates_objects_by_two_spaces():
    found = Detections((Detection(2, "cat", 0.91, (1, 2, 30, 40)), Detection(0, "dog", 0.5, (0, 0, 1, 1))))
    assert str(found) == "cat 0.91 [1, 2, 30, 40]  dog 0.50 [0, 0, 1, 1]"


def test_nms_of_many_boxes_that_all_score_zero_keeps_none_without_dividing_by_zero():
    from edgekit.detect.nms import nms

    boxes = np.tile(np.array([[0.0, 0.0, 10.0, 10.0]]), (100, 1)) + np.arange(100)[:, None] * 20
    kept = nms(boxes, np.zeros(100, np.float32), np.zeros(100, np.int64), 0.5, 5)
    assert kept.dtype == np.int64 and len(kept) <= 5
