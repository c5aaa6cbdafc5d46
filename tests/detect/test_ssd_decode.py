"""SSD decoding as MediaPipe models ship it (``ssd_decode``) and keypoints as results.

Every expected number below is worked out by hand from MediaPipe's ``DecodeBoxes``
(tensors_to_detections_calculator.cc): ``cx = x / x_scale * anchor_w + anchor_cx``, sizes
``w / w_scale * anchor_w`` (or ``exp``), keypoints like the centre. The input is 128 x 128, so
a normalised 0.1 is 12.8 px. The real BlazeFace check at the end runs only where the model
file from the mediapipe wheel is present (it is not part of the repository).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgekit.builders.gate.detect import DetectGate, detect_result
from edgekit.detect.boxes import Detection, Detections
from edgekit.detect.head import detector
from edgekit.errors import EdgekitError, ModelError, UsageError
from edgekit.evaluation.evaluate import keypoint_error
from edgekit.imaging.image import InputSpec
from tests.conftest import real_model_file
from tests.helpers.detect_outputs import Outputs

SPEC = InputSpec.from_dict({"shape": [1, 128, 128, 3], "dtype": "float32"})
# anchor 0 fixed-size (BlazeFace's are 1 x 1), anchor 1 half as tall and a quarter as wide
ANCHORS = [[0.5, 0.5, 1.0, 1.0], [0.25, 0.75, 0.5, 0.25], [0.75, 0.25, 1.0, 1.0]]
BLAZE_DECODE = {"num_classes": 1, "num_boxes": 3, "num_coords": 16, "box_coord_offset": 0, "keypoint_coord_offset": 4,
                "num_keypoints": 6, "num_values_per_keypoint": 2, "sigmoid_score": True,
                "score_clipping_thresh": 100.0, "reverse_output_order": True, "x_scale": 128.0, "y_scale": 128.0,
                "w_scale": 128.0, "h_scale": 128.0, "min_score_thresh": 0.5}
BLAZE_ANCHORS = {"num_layers": 4, "min_scale": 0.1484375, "max_scale": 0.75, "input_size_height": 128,
                 "input_size_width": 128, "anchor_offset_x": 0.5, "anchor_offset_y": 0.5, "strides": [8, 16, 16, 16],
                 "aspect_ratios": [1.0], "fixed_anchor_size": True}


def _outputs(rows: dict[int, list[float]], logits: dict[int, float], width: int = 16):
    """``[1, 3, width]`` regressors (zeros but ``rows``) and ``[1, 3, 1]`` logits (-10 but ``logits``)."""
    reg = np.zeros((1, 3, width), np.float32)
    for i, row in rows.items():
        reg[0, i, : len(row)] = row
    score = np.full((1, 3, 1), -10.0, np.float32)
    for i, v in logits.items():
        score[0, i, 0] = v
    return [reg, score]


def _decode(outputs, spec=SPEC, quant=None, frame_shape=None, **options):
    head = detector([], Outputs([o.shape for o in outputs], quant, spec), anchors=ANCHORS, **options)
    return head(outputs, frame_shape=frame_shape)


# x, y, w, h then six keypoints x, y (MediaPipe's XYWH order, reverse_output_order true)
ROW1 = [3.2, 12.8, 64.0, 32.0, -12.8, 25.6, 0.0, 0.0, 12.8, -12.8, 6.4, 6.4, 25.6, 0.0, 0.0, 64.0]
# anchor 1 (cy .25, cx .75, h .5, w .25): cx .75 + 3.2/128*.25 = .75625, cy .25 + 12.8/128*.5 = .3,
# w 64/128*.25 = .125, h 32/128*.5 = .125 -> x .69375-.81875, y .2375-.3625 -> pixels x 128
ROW1_BOX = [88.8, 30.4, 104.8, 46.4]
ROW1_POINTS = [(92.8, 44.8), (96.0, 32.0), (99.2, 25.6), (97.6, 35.2), (102.4, 32.0), (96.0, 64.0)]


def test_blazeface_row_decodes_to_the_hand_computed_box_and_keypoints():
    found = _decode(_outputs({1: ROW1}, {1: 2.0}), ssd_decode=BLAZE_DECODE)
    assert len(found) == 1
    d = found.top
    assert d.score == pytest.approx(1 / (1 + math.exp(-2.0)), abs=1e-6)
    np.testing.assert_allclose(d.box, ROW1_BOX, atol=1e-4)
    np.testing.assert_allclose(d.keypoints, ROW1_POINTS, atol=1e-4)


def test_reverse_output_order_off_reads_y_first():
    # the same box and keypoints written y, x, h, w and keypoints y, x (MediaPipe's default, YXHW)
    yx = [12.8, 3.2, 32.0, 64.0] + [v for k in range(6) for v in (ROW1[5 + 2 * k], ROW1[4 + 2 * k])]
    off = {**BLAZE_DECODE, "reverse_output_order": False}
    found = _decode(_outputs({1: yx}, {1: 2.0}), ssd_decode=off)
    np.testing.assert_allclose(found.top.box, ROW1_BOX, atol=1e-4)
    np.testing.assert_allclose(found.top.keypoints, ROW1_POINTS, atol=1e-4)
    # the x-first row read y-first: swapped centre offsets and sizes, another box
    swapped = _decode(_outputs({1: ROW1}, {1: 2.0}), ssd_decode=off)
    # cx .75 + 12.8/128*.25 = .775, cy .25 + 3.2/128*.5 = .2625, w 32/128*.25 = .0625, h 64/128*.5 = .25
    np.testing.assert_allclose(swapped.top.box, [95.2, 17.6, 103.2, 49.6], atol=1e-4)
    assert _decode(_outputs({1: yx}, {1: 2.0}), ssd_decode={**off, "box_format": "XYWH"}).top.box != found.top.box


def test_box_offset_and_keypoint_offset_are_columns_of_the_row():
    # 2 leading columns, box at 2, one keypoint at 8 (after 2 unused columns): num_coords 10
    row = [99.0, -99.0, *ROW1[:4], 7.0, 7.0, *ROW1[4:6]]
    options = {**BLAZE_DECODE, "num_coords": 10, "box_coord_offset": 2, "keypoint_coord_offset": 8, "num_keypoints": 1}
    found = _decode(_outputs({1: row}, {1: 2.0}, width=10), ssd_decode=options)
    np.testing.assert_allclose(found.top.box, ROW1_BOX, atol=1e-4)
    np.testing.assert_allclose(found.top.keypoints, ROW1_POINTS[:1], atol=1e-4)


def test_exponential_and_linear_sizes():
    row = [0.0, 0.0, 64.0, -64.0]  # x, y, w, h against anchor 0 (centre .5, .5, size 1)
    linear = _decode(_outputs({0: row}, {0: 2.0}, width=4),
                     ssd_decode={"x_scale": 128, "y_scale": 128, "w_scale": 128, "h_scale": 128,
                                 "reverse_output_order": True, "sigmoid_score": True})
    assert len(linear) == 0  # h -0.5: a negative height, dropped as MediaPipe drops it
    exp = _decode(_outputs({0: row}, {0: 2.0}, width=4),
                  ssd_decode={"x_scale": 128, "y_scale": 128, "w_scale": 128, "h_scale": 128,
                              "reverse_output_order": True, "sigmoid_score": True,
                              "apply_exponential_on_box_size": True})
    w, h = math.exp(0.5) * 128, math.exp(-0.5) * 128  # 211.0 wide (clipped to the input), 77.6 tall
    np.testing.assert_allclose(exp.top.box, [0.0, 64 - h / 2, 128.0, 64 + h / 2], atol=1e-3)
    assert w > 128


def test_without_ssd_decode_the_tf_object_detection_decode_is_unchanged():
    rel = np.zeros((1, 3, 4), np.float32)
    rel[0, 1] = [1.0, -2.0, 0.5, -0.5]  # ty, tx, th, tw (scales 10, 10, 5, 5)
    scores = np.float32([[[0.1], [0.9], [0.2]]])
    found = _decode([rel, scores])
    # anchor 1: cy .25 + .1*.5 = .3, cx .75 - .2*.25 = .7, h exp(.1)*.5, w exp(-.1)*.25
    h, w = math.exp(0.1) * 0.5, math.exp(-0.1) * 0.25
    expected = np.array([0.7 - w / 2, 0.3 - h / 2, 0.7 + w / 2, 0.3 + h / 2]) * 128
    np.testing.assert_allclose(found.top.box, expected, atol=1e-4)
    assert found.top.keypoints == () and "keypoints" not in found.top.to_dict()
    # the same numbers spelled as MediaPipe options
    named = _decode([rel, scores], ssd_decode={"y_scale": 10, "x_scale": 10, "h_scale": 5, "w_scale": 5,
                                               "apply_exponential_on_box_size": True})
    np.testing.assert_allclose(named.top.box, expected, atol=1e-4)


def test_sigmoid_score_with_clipping():
    outputs = _outputs({0: ROW1, 1: ROW1, 2: ROW1}, {0: 200.0, 1: -200.0, 2: 0.5})
    clip2 = {**BLAZE_DECODE, "score_clipping_thresh": 2.0}
    found = _decode(outputs, ssd_decode=clip2)  # min_score_thresh .5: sigmoid(2), sigmoid(.5) pass
    assert sorted(round(d.score, 4) for d in found.detections) == [0.6225, 0.8808]
    # clipped at 1, no logit can reach 0.8: the 200 is sigmoid(1) = 0.73
    assert len(_decode(outputs, ssd_decode={**clip2, "score_clipping_thresh": 1.0, "min_score_thresh": 0.8})) == 0
    # a low threshold: -200 clipped to -2 scores sigmoid(-2) = 0.119 and is kept, as MediaPipe keeps it
    low = _decode(outputs, ssd_decode={**clip2, "min_score_thresh": 0.1}, iou_threshold=1.0)
    assert sorted(round(d.score, 4) for d in low.detections) == [0.1192, 0.6225, 0.8808]
    unclipped = _decode(outputs, ssd_decode={**BLAZE_DECODE, "min_score_thresh": 0.1}, iou_threshold=1.0)
    assert sorted(round(d.score, 4) for d in unclipped.detections) == [0.6225, 1.0]
    # sigmoid_score false: the scores are taken as they are (MediaPipe: no activation)
    plain = {k: v for k, v in BLAZE_DECODE.items() if k != "score_clipping_thresh"}
    raw = _decode(_outputs({1: ROW1}, {1: 0.7}), ssd_decode={**plain, "sigmoid_score": False})
    assert raw.top.score == pytest.approx(0.7)


def test_min_score_thresh_is_the_threshold_unless_score_threshold_is_given():
    outputs = _outputs({1: ROW1}, {1: 0.0})  # sigmoid(0) = 0.5: MediaPipe keeps >= 0.5, edgekit > threshold
    assert len(_decode(outputs, ssd_decode={**BLAZE_DECODE, "min_score_thresh": 0.6})) == 0
    assert len(_decode(outputs, ssd_decode={**BLAZE_DECODE, "min_score_thresh": 0.6}, score_threshold=0.4)) == 1


def test_quantised_regressors_and_scores_decode_as_their_real_values():
    reg, score = _outputs({1: ROW1, 2: [v * 0.5 for v in ROW1]}, {1: 2.0, 2: 1.0})
    rq, sq = (0.8, 3), (0.1, -20)  # (scale, zero_point): every value of ROW1 and ROW1 / 2 is a multiple of 0.8
    qreg = np.clip(np.round(reg / rq[0]) + rq[1], -128, 127).astype(np.int8)
    qscore = np.clip(np.round(score / sq[0]) + sq[1], -128, 127).astype(np.int8)
    found = _decode([qreg, qscore], quant=[rq, sq], ssd_decode=BLAZE_DECODE)
    real = [(qreg.astype(np.float32) - rq[1]) * rq[0], (qscore.astype(np.float32) - sq[1]) * sq[0]]
    floating = _decode(real, ssd_decode=BLAZE_DECODE)
    assert len(found) == 2 and [d.score for d in found.detections] == [d.score for d in floating.detections]
    for q, f in zip(found.detections, floating.detections):
        np.testing.assert_allclose(q.box, f.box, atol=1e-4)
        np.testing.assert_allclose(q.keypoints, f.keypoints, atol=1e-4)
    np.testing.assert_allclose(found.top.keypoints, ROW1_POINTS, atol=1e-3)
    np.testing.assert_allclose(found.top.box, ROW1_BOX, atol=1e-3)


def test_keypoints_map_back_through_letterbox_and_crop():
    outputs = _outputs({1: ROW1}, {1: 2.0})
    letterbox = InputSpec.from_dict({"shape": [1, 128, 128, 3], "dtype": "float32", "resize": "letterbox"})
    # a 256 x 128 frame letterboxed into 128 x 128: scale 2, 32 px of padding above and below
    wide = _decode(outputs, spec=letterbox, frame_shape=(128, 256, 3), ssd_decode=BLAZE_DECODE)
    np.testing.assert_allclose(wide.top.box, [177.6, 0.0, 209.6, 28.8], atol=1e-3)  # y1 clipped at the frame
    np.testing.assert_allclose(wide.top.keypoints,
                               # keypoints are not clipped: the third lies 12.8 px above the frame, as the model put it
                               [(185.6, 25.6), (192.0, 0.0), (198.4, -12.8), (195.2, 6.4), (204.8, 0.0), (192.0, 64.0)],
                               atol=1e-3)
    assert wide.size == (256, 128)
    # a centred 200 x 100 crop (rows 50-249, columns 150-249 of a 300 x 400 frame), stretched to 128 x 128
    crop = InputSpec.from_dict({"shape": [1, 128, 128, 3], "dtype": "float32", "crop": [200, 100]})
    cropped = _decode(outputs, spec=crop, frame_shape=(300, 400, 3), ssd_decode=BLAZE_DECODE)
    sx, sy = 100 / 128, 200 / 128
    np.testing.assert_allclose(cropped.top.keypoints, [(150 + x * sx, 50 + y * sy) for x, y in ROW1_POINTS],
                               atol=1e-3)
    np.testing.assert_allclose(cropped.top.box, [150 + ROW1_BOX[0] * sx, 50 + ROW1_BOX[1] * sy,
                                                 150 + ROW1_BOX[2] * sx, 50 + ROW1_BOX[3] * sy], atol=1e-3)


def test_nms_keeps_each_kept_box_its_own_keypoints():
    # anchors 0 (centre .5, .5) and 2 (centre .25, .75 as x, y), both 1 x 1, regress the same 32 px box
    # around (64, 64); their keypoints (all offsets 0) sit on their own anchor centres
    found = _decode(_outputs({0: [0, 0, 32, 32], 2: [32, -32, 32, 32]}, {0: 1.0, 2: 3.0}), ssd_decode=BLAZE_DECODE)
    assert len(found) == 1 and found.top.score == pytest.approx(1 / (1 + math.exp(-3.0)), abs=1e-6)
    np.testing.assert_allclose(found.top.box, [48, 48, 80, 80], atol=1e-4)
    assert found.top.keypoints == ((32.0, 96.0),) * 6  # anchor 2's, not anchor 0's (64, 64)
    both = _decode(_outputs({0: [0, 0, 32, 32], 2: [32, -32, 32, 32]}, {0: 1.0, 2: 3.0}), ssd_decode=BLAZE_DECODE,
                   iou_threshold=1.0)
    assert [d.keypoints[0] for d in both.detections] == [(32.0, 96.0), (64.0, 64.0)]


def test_json_has_keypoints_only_for_detections_that_have_them():
    with_points = Detection(0, "face", 0.923456789, (1.0, 2.0, 30.456, 40.0), ((3.14159, 4.0), (5.0, 6.005)))
    plain = Detection(1, "cat", 0.5, (1.0, 2.0, 3.0, 4.0))
    out = json.loads(json.dumps(Detections((with_points, plain), (64, 48)).to_dict()))
    assert out == {"detections": [{"index": 0, "label": "face", "score": 0.923457, "box": [1.0, 2.0, 30.46, 40.0],
                                   "keypoints": [[3.14, 4.0], [5.0, 6.0]]},
                                  {"index": 1, "label": "cat", "score": 0.5, "box": [1.0, 2.0, 3.0, 4.0]}],
                   "count": 2, "image_size": [64, 48]}


def test_overlay_draws_keypoints_as_dots():
    pytest.importorskip("cv2")
    from edgekit.outputs.overlay import colour_for, draw

    frame = np.zeros((120, 160, 3), np.uint8)
    found = Detections((Detection(3, "face", 0.9, (20.0, 20.0, 140.0, 100.0), ((50.0, 60.0), (90.0, 40.0))),),
                       (160, 120))
    image = draw(frame, found)
    for x, y in ((50, 60), (90, 40)):
        assert tuple(image[y, x]) == colour_for(3)
    assert not image[80, 50].any()  # between the dots, inside the box: untouched
    assert not frame.any()


def test_keypoint_error_of_matched_detections_normalised_by_box_size():
    ref = [Detections((Detection(0, "face", 0.9, (0.0, 0.0, 10.0, 10.0), ((2.0, 2.0), (8.0, 8.0))),
                       Detection(0, "face", 0.1, (50.0, 50.0, 60.0, 60.0), ((55.0, 55.0),) * 2))),
           Detections((Detection(0, "face", 0.8, (0.0, 0.0, 20.0, 5.0), ((1.0, 1.0), (2.0, 2.0))),))]
    conv = [Detections((Detection(0, "face", 0.7, (0.0, 0.0, 10.0, 11.0), ((2.0, 5.0), (8.0, 8.0))),)),
            Detections((Detection(0, "face", 0.8, (40.0, 40.0, 60.0, 45.0), ((1.0, 1.0), (2.0, 2.0))),))]
    err = keypoint_error(ref, conv, min_score=0.25)
    # image 0: distances 3 and 0 over sqrt(100) = 0.15; image 1 unmatched (IoU 0); the 0.1 one not a reference
    assert err == {"mean": 0.15, "p95": 0.15, "max": 0.15, "matched": 1, "reference": 2,
                   "normalised_by": "sqrt(reference box area)"}
    assert keypoint_error([Detections((Detection(0, "a", 0.9, (0, 0, 1, 1)),))], conv[:1]) is None
    # equal boxes (clipped to the same edges): the one of the closest score is the counterpart
    twins = [Detections((Detection(0, "face", 0.6, (0.0, 0.0, 10.0, 10.0), ((9.0, 9.0),)),
                         Detection(0, "face", 0.89, (0.0, 0.0, 10.0, 10.0), ((2.0, 3.0),))))]
    one = [Detections((Detection(0, "face", 0.9, (0.0, 0.0, 10.0, 10.0), ((2.0, 2.0),)),))]
    assert keypoint_error(one, twins)["mean"] == pytest.approx(0.1)


def _gate(reference, original=None, evaluation=None):
    return DetectGate("ssd", ["face"], {}, None, None, [], evaluation, reference, original or {})


def test_gate_reports_keypoint_error_and_warns_of_a_near_zero_original():
    box, points = (10.0, 10.0, 50.0, 50.0), ((20.0, 20.0), (40.0, 20.0))
    ref = [Detections((Detection(0, "face", 0.9, box, points),), (64, 64))]
    moved = [Detections((Detection(0, "face", 0.9, box, ((20.0, 24.0), (40.0, 20.0))),), (64, 64))]
    res = detect_result(_gate({"holdout": ref}), "holdout", moved, 0.99)
    assert res["metric"] == "map_agreement" and res["agreement"] == pytest.approx(1.0)
    assert res["keypoints"]["mean"] == pytest.approx(2.0 / 40.0) and res["keypoints"]["matched"] == 1
    assert "keypoints" not in detect_result(_gate({"holdout": [Detections(())]}), "holdout", [Detections(())], 0.99)
    weak = _gate({"eval": ref}, {"eval": {"map": 0.0051}}, evaluation=object())
    warning = weak.weak_original_warning()
    assert "mAP@[.5:.95] 0.0051" in warning and "ssd_decode" in warning and "preprocessing" in warning
    assert _gate({"eval": ref}, {"eval": {"map": 0.4}}, evaluation=object()).weak_original_warning() is None
    assert _gate({"holdout": ref}).weak_original_warning() is None  # no eval set: nothing to say


def _one_line(exc: EdgekitError) -> str:
    assert "\n" not in str(exc) and exc.hint
    return str(exc)


@pytest.mark.parametrize("change, says", [
    ({"num_keypoint": 6}, "ssd_decode has no option 'num_keypoint'"),
    ({"x_scale": None}, "needs x_scale"),
    ({"w_scale": 0}, "ssd_decode.w_scale must be a number from 1e-06"),
    ({"num_values_per_keypoint": 1}, "num_values_per_keypoint must be a whole number from 2"),
    ({"num_keypoints": 2.5}, "num_keypoints must be a whole number"),
    ({"reverse_output_order": "yes"}, "reverse_output_order must be true or false"),
    ({"box_format": "CXCYWH"}, "box_format must be one of: UNSPECIFIED, YXHW, XYWH, XYXY"),
    ({"num_keypoints": 7}, "7 keypoints of 2 values from keypoint_coord_offset 4 need 18 coordinates"),
    ({"keypoint_coord_offset": 2, "num_keypoints": 5}, "overlap the box"),
    ({"box_coord_offset": 14}, "runs past num_coords 16"),
    ({"sigmoid_score": False}, "score_clipping_thresh applies only with sigmoid_score true"),
    ({"min_score_thresh": 1.5}, "min_score_thresh must be a number from 0 to 1"),
])
def test_bad_decode_options_are_refused_in_one_line_with_a_fix(change, says):
    options = {k: v for k, v in {**BLAZE_DECODE, **change}.items() if v is not None}
    with pytest.raises(UsageError) as err:
        detector([], Outputs([(1, 3, 16), (1, 3, 1)], spec=SPEC), anchors=ANCHORS, ssd_decode=options)
    assert says in _one_line(err.value)


@pytest.mark.parametrize("options, says", [
    ({"ssd_decode": [1, 2]}, "ssd_decode must be a table"),
    ({"box_coder_scales": [10, 10, 5, 5]}, "box_coder_scales and ssd_decode both give the box scales"),
    ({"score_activation": "softmax"}, "contradicts ssd_decode.sigmoid_score true"),
])
def test_decode_options_that_contradict_the_head_are_refused(options, says):
    with pytest.raises(UsageError) as err:
        detector([], Outputs([(1, 3, 16), (1, 3, 1)], spec=SPEC), anchors=ANCHORS,
                 **{"ssd_decode": BLAZE_DECODE, **options})
    assert says in _one_line(err.value)


def test_the_model_must_have_the_boxes_and_coordinates_the_options_say():
    with pytest.raises(ModelError, match="the model has 3 boxes, ssd_decode.num_boxes says 896"):
        detector([], Outputs([(1, 3, 16), (1, 3, 1)], spec=SPEC), anchors=ANCHORS,
                 ssd_decode={**BLAZE_DECODE, "num_boxes": 896})
    with pytest.raises(ModelError, match="do not fit the ssd layout"):  # 18 columns, options say 16
        detector([], Outputs([(1, 3, 18), (1, 3, 1)], spec=SPEC), layout="ssd", anchors=ANCHORS,
                 ssd_decode=BLAZE_DECODE)
    with pytest.raises(ModelError, match="the model has 896 boxes, the anchors 3"):
        detector([], Outputs([(1, 896, 16), (1, 896, 1)], spec=SPEC), anchors=ANCHORS,
                 ssd_decode={**BLAZE_DECODE, "num_boxes": 896})
    head = detector([], Outputs([(1, 896, 16), (1, 896, 1)], spec=SPEC), ssd_anchors=BLAZE_ANCHORS,
                    ssd_decode={**BLAZE_DECODE, "num_boxes": 896})
    assert head.layout == "ssd"  # auto: the 16-column output is the regressors


REAL_BLAZEFACE_WHY = "the real BlazeFace is not under $EDGEKIT_REAL_MODELS (unpack the mediapipe 0.10.14 wheel there)"
REAL_BLAZEFACE = real_model_file("face_detection_short_range.tflite")  # set EDGEKIT_REAL_MODELS (tests/conftest.py)


@pytest.mark.skipif(REAL_BLAZEFACE is None, reason=REAL_BLAZEFACE_WHY)
def test_real_blazeface_finds_the_astronauts_face_and_its_landmarks():
    """MediaPipe's face_detection_short_range.tflite on scikit-image's astronaut, decoded with the
    options of MediaPipe's face_detection.pbtxt: one face, eyes above nose above mouth, ears outside."""
    pytest.importorskip("skimage")
    from skimage import data

    from edgekit.imaging.image import Preprocessor
    from edgekit.runtime import open_runtime

    frame = data.astronaut()[:, :, ::-1].copy()  # BGR, as cameras give frames
    # face_detection.pbtxt: 128 x 128, keep_aspect_ratio (letterbox), pixels to [-1, 1]
    spec = InputSpec.from_dict({"shape": [1, 128, 128, 3], "dtype": "float32", "mean": [127.5] * 3,
                                "std": [127.5] * 3, "resize": "letterbox"})
    with open_runtime(REAL_BLAZEFACE) as rt:
        outputs = rt.infer(Preprocessor(spec)(frame))
    head = detector(["face"], Outputs([o.shape for o in outputs], spec=spec), ssd_anchors=BLAZE_ANCHORS,
                    ssd_decode={**BLAZE_DECODE, "num_boxes": 896}, iou_threshold=0.3)
    found = head(outputs, frame_shape=frame.shape)
    assert len(found) == 1 and found.top.score > 0.85
    x1, y1, x2, y2 = found.top.box
    assert 160 < x1 < 200 and 60 < y1 < 100 and 250 < x2 < 290 and 160 < y2 < 200  # the face, by eye: 180-275, 80-175
    (rex, rey), (lex, ley), (nx, ny), (mx, my), (rrx, _), (lrx, _) = found.top.keypoints
    assert rex < nx < lex and max(rey, ley) < ny < my < y2 and rrx < rex and lrx > lex
    assert all(x1 - 5 <= x <= x2 + 5 and y1 <= y <= y2 for x, y in found.top.keypoints)
