"""The detect head's decoding, fast: anchors, layout choice, thresholds in the quantised domain,
NMS rounds, box formats, and every bad input refused in one line.

Arrays stand for model outputs here (the same contract the runtimes give: a list of arrays,
each output's ``(scale, zero_point)``); tests/detect/test_layouts.py runs real converted models,
and one ONNX model made with onnx.helper runs through ONNX Runtime below.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.detect.anchors import anchors_for, check_anchors, check_ssd_anchors, generate
from edgekit.detect.config import OPTIONS
from edgekit.detect.head import LAYOUTS, detect_config, detector
from edgekit.detect.nms import nms
from edgekit.detect.scores import above, raw_threshold, real
from edgekit.errors import EdgekitError, ModelError, UsageError
from edgekit.heads.table import TASK_HEADS
from edgekit.imaging.image import InputSpec
from tests.helpers.detect_outputs import SPEC, Outputs

BLAZEFACE = {"num_layers": 4, "min_scale": 0.1484375, "max_scale": 0.75, "input_size_height": 128,
             "input_size_width": 128, "strides": [8, 16, 16, 16], "aspect_ratios": [1.0], "fixed_anchor_size": True}
MOBILENET_SSD = {"num_layers": 6, "min_scale": 0.2, "max_scale": 0.95, "input_size_height": 300,
                 "input_size_width": 300, "strides": [16, 32, 64, 128, 256, 512],
                 "aspect_ratios": [1.0, 2.0, 0.5, 3.0, 0.3333], "reduce_boxes_in_lowest_layer": True}


def _one_line(exc: EdgekitError) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------------------------------------
# anchors


def test_generated_anchor_counts_match_the_published_models():
    assert generate(check_ssd_anchors(BLAZEFACE)).shape == (896, 4)  # BlazeFace front camera
    assert generate(check_ssd_anchors(MOBILENET_SSD)).shape == (1917, 4)  # ssd_mobilenet_v2 300x300


def test_generated_anchors_follow_the_documented_rules():
    a = generate(check_ssd_anchors(MOBILENET_SSD))
    # lowest layer reduced: (0.1, 1:1), (0.2, 2:1), (0.2, 1:2) on a 19 x 19 grid, centres at (i + 0.5) / 19
    np.testing.assert_allclose(a[0], [0.5 / 19, 0.5 / 19, 0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(a[1, 2:], [0.2 / np.sqrt(2), 0.2 * np.sqrt(2)], rtol=1e-6)
    np.testing.assert_allclose(a[3, :2], [0.5 / 19, 1.5 / 19], rtol=1e-6)  # next column, same row
    # second layer: scale 0.35, five ratios, then the interpolated sqrt(0.35 * 0.5) at 1:1
    second = a[19 * 19 * 3: 19 * 19 * 3 + 6]
    np.testing.assert_allclose(second[0, 2:], [0.35, 0.35], rtol=1e-6)
    np.testing.assert_allclose(second[5, 2:], [np.sqrt(0.35 * 0.5)] * 2, rtol=1e-6)
    # the last layer interpolates towards 1.0
    np.testing.assert_allclose(a[-1, 2:], [np.sqrt(0.95)] * 2, rtol=1e-6)
    blaze = generate(check_ssd_anchors(BLAZEFACE))
    assert (blaze[:, 2:] == 1.0).all()  # fixed_anchor_size
    # stride 16 layers pool into one 8 x 8 grid with 6 anchors per cell
    np.testing.assert_allclose(blaze[512:518, :2], [[0.0625, 0.0625]] * 6)


def test_feature_map_sizes_stand_for_strides():
    maps = dict(MOBILENET_SSD, feature_map_height=[19, 10, 5, 3, 2, 1], feature_map_width=[19, 10, 5, 3, 2, 1])
    del maps["strides"], maps["input_size_height"], maps["input_size_width"]
    np.testing.assert_array_equal(generate(check_ssd_anchors(maps)), generate(check_ssd_anchors(MOBILENET_SSD)))


def test_generated_anchors_are_cached_and_read_only():
    key = check_ssd_anchors(BLAZEFACE)
    assert generate(key) is generate(check_ssd_anchors(dict(BLAZEFACE)))
    with pytest.raises(ValueError):
        generate(key)[0, 0] = 5.0


@pytest.mark.parametrize("change, says", [
    ({"num_layers": 0}, "num_layers must be a whole number from 1"),
    ({"num_layers": 2.5}, "num_layers must be a whole number"),
    ({"min_scale": float("nan")}, "min_scale must be a number"),
    ({"min_scale": "0.1"}, "min_scale must be a number"),
    ({"anchor_offset_x": 2}, "anchor_offset_x must be a number from 0 to 1"),
    ({"fixed_anchor_size": 1}, "fixed_anchor_size must be true or false"),
    ({"strides": [8, 16]}, "strides has 2 values for num_layers 4"),
    ({"strides": [8, 16, 0, 16]}, "strides must be a list of whole numbers from 1"),
    ({"strides": "8"}, "strides must be a list"),
    ({"aspect_ratios": [1.0] * 65}, "at most 64"),
    ({"strides": [1, 1, 1, 1], "input_size_height": 16384, "input_size_width": 16384}, "more than 1000000"),
    ({"anchor_scale": 4.0}, "has no option 'anchor_scale'"),
    ({"aspect_ratios": [], "interpolated_scale_aspect_ratio": 0.0}, "makes no anchors"),
    ({"input_size_height": 0}, "needs input_size_height and input_size_width"),
])
def test_bad_anchor_options_are_refused_in_one_line(change, says):
    with pytest.raises(UsageError) as err:
        check_ssd_anchors({**BLAZEFACE, **change})
    assert says in _one_line(err.value)


def test_anchor_options_missing_a_required_one():
    options = dict(BLAZEFACE)
    del options["min_scale"]
    with pytest.raises(UsageError, match="needs min_scale"):
        check_ssd_anchors(options)


def test_anchors_given_as_a_list_or_an_absolute_npy(tmp_path):
    rows = [[0.5, 0.5, 0.2, 0.2], [0.25, 0.75, 0.1, 0.3]]
    np.testing.assert_array_equal(check_anchors(rows), np.float32(rows))
    path = tmp_path / "anchors.npy"
    np.save(path, np.float32(rows))
    np.testing.assert_array_equal(check_anchors(str(path)), np.float32(rows))


@pytest.mark.parametrize("value, says", [
    ("anchors.npy", "must be an absolute path"),
    ("/nonexistent/anchors.npy", "cannot read"),
    ([[0.5, 0.5, 0.2]], "must be [N, 4]"),
    ([[0.5, 0.5, 0.2, "x"]], "rows of numbers"),
    ([[0.5, 0.5, 0.2, float("inf")]], "NaN or infinite"),
    (7, "must be a list or a .npy path"),
])
def test_bad_anchors_are_refused_in_one_line(value, says):
    with pytest.raises(UsageError) as err:
        check_anchors(value)
    assert says in _one_line(err.value)


def test_a_pickled_npy_is_not_loaded(tmp_path):
    path = tmp_path / "evil.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(UsageError, match="cannot read"):
        check_anchors(str(path))


def test_an_anchor_count_that_is_not_the_models_fails_when_the_model_opens():
    runtime = Outputs([(1, 900, 4), (1, 900, 3)])
    with pytest.raises(ModelError) as err:
        detector(["a", "b"], runtime, ssd_anchors=BLAZEFACE)
    assert "the model has 900 boxes, the anchors 896" in _one_line(err.value)
    assert detector(["a", "b"], Outputs([(1, 896, 4), (1, 896, 3)]), ssd_anchors=BLAZEFACE).layout == "ssd"


def test_anchors_for_without_anchors():
    config = detect_config(SPEC, 2, {})
    with pytest.raises(ModelError, match="needs anchors"):
        anchors_for(config, 10)


# ---------------------------------------------------------------------------------------------
# layouts


def test_the_head_options_are_the_task_heads_options():
    # one list, not two kept equal: the table row holds the spec detect_config checks against
    assert TASK_HEADS["detect"].options is OPTIONS
    assert TASK_HEADS["detect"].option_names[0] == "layout" and len(OPTIONS) == 16


@pytest.mark.parametrize("shapes, options, layout", [
    ([(1, 10), (1,), (1, 10, 4), (1, 10)], {}, "postprocess"),
    ([(1, 896, 4), (1, 896, 3)], {"ssd_anchors": BLAZEFACE}, "ssd"),
    ([(1, 896, 4), (1, 896, 3)], {}, "decoded"),  # same shapes, no anchors: boxes already decoded
    ([(1, 300, 2), (1, 300, 4)], {}, "decoded"),
    ([(1, 6, 8400)], {}, "yolo"),
    ([(1, 8400, 6)], {}, "yolo"),
    ([(1, 8400, 7)], {}, "yolo_objectness"),
])
def test_layout_auto_picks_by_shapes_and_anchors(shapes, options, layout):
    assert detector(["a", "b"], Outputs(shapes), **options).layout == layout


def test_outputs_matching_no_layout_name_every_layout_and_the_shapes():
    with pytest.raises(ModelError) as err:
        detector(["a", "b"], Outputs([(1, 3, 3, 3), (1, 5)]))
    text = _one_line(err.value)
    assert "[1, 3, 3, 3], [1, 5]" in text and "with 2 classes" in text
    for name in LAYOUTS:
        assert f"{name}: " in text


def test_a_named_layout_that_does_not_fit():
    with pytest.raises(ModelError, match="do not fit the ssd layout"):
        detector(["a", "b"], Outputs([(1, 6, 8400)]), layout="ssd", ssd_anchors=BLAZEFACE)
    with pytest.raises(UsageError, match="unknown"):
        detector(["a", "b"], Outputs([(1, 6, 8400)]), layout="retina")


@pytest.mark.parametrize("options, says", [
    ({"score_threshold": 2}, "score_threshold must be a number from 0 to 1"),
    ({"iou_threshold": "high"}, "iou_threshold must be a number"),
    ({"max_detections": 0}, "max_detections must be a whole number"),
    ({"box_format": "xywh"}, "box_format must be one of"),
    ({"class_agnostic": "yes"}, "class_agnostic must be true or false"),
    ({"box_coder_scales": [10, 10, 5]}, "box_coder_scales must be 4 numbers"),
    ({"outputs": [0, -1]}, "outputs must be a list of whole numbers from 0 to 63"),
    ({"anchors": "relative/anchors.npy"}, "absolute path"),
    ({"ssd_anchors": [1, 2]}, "ssd_anchors must be a table"),
])
def test_bad_option_values_are_refused_in_one_line(options, says):
    with pytest.raises(UsageError) as err:
        detector(["a", "b"], Outputs([(1, 6, 100)]), **options)
    assert says in _one_line(err.value)


def test_symbolic_onnx_dimensions(tmp_path):
    """An ONNX model made here with a symbolic batch runs through ONNX Runtime; the head reads its
    ``[batch, 4 + nc, N]`` output as YOLO and decodes the box the graph holds."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from edgekit.runtime.onnxrt import OnnxRuntime

    n = 50
    table = np.zeros((1, 6, n), np.float32)
    table[0, :, 7] = [32, 20, 16, 8, 0.0, 0.0]  # box 7: cx 32, cy 20, 16 x 8; its scores come from the input
    const = helper.make_tensor("table", TensorProto.FLOAT, table.shape, table.reshape(-1))
    mask = np.zeros((1, 6, n), np.float32)
    mask[0, 5, 7] = 1.0
    mask_t = helper.make_tensor("mask", TensorProto.FLOAT, mask.shape, mask.reshape(-1))
    nodes = [helper.make_node("ReduceMax", ["image"], ["peak"], keepdims=1, axes=[1, 2, 3]),
             helper.make_node("Reshape", ["peak", "shape"], ["peak3"]),
             helper.make_node("Mul", ["peak3", "mask"], ["score"]),
             helper.make_node("Add", ["table", "score"], ["out"])]
    shape_t = helper.make_tensor("shape", TensorProto.INT64, [3], [-1, 1, 1])
    graph = helper.make_graph(
        nodes, "yolo", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 32, 32, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 6, n])], [const, mask_t, shape_t])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "yolo.onnx"
    onnx.save(model, str(path))
    spec = InputSpec.from_dict({"shape": [1, 32, 32, 3], "dtype": "float32"})
    with OnnxRuntime(path, input_spec=spec, providers="cpu") as runtime:
        decode = detector(["a", "b"], runtime)
        assert decode.layout == "yolo"
        found = decode(runtime.infer(np.full((1, 32, 32, 3), 0.8, np.float32)))
    assert [(d.label, round(d.score, 3)) for d in found.detections] == [("b", 0.8)]
    np.testing.assert_allclose(found.top.box, [24, 16, 32, 24])  # clipped to the 32 x 32 input


# ---------------------------------------------------------------------------------------------
# thresholds in the quantised domain


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("scale, zero_point", [(1 / 255, 0), (0.0039, -128), (0.05, 17), (2.5, 3), (1e-4, 0)])
def test_the_raw_threshold_keeps_exactly_the_values_above(dtype, scale, zero_point):
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1).astype(dtype)
    quant = (scale, zero_point)
    for threshold in (0.0, 0.25, 0.5, 0.999, 1.0, -3.0, 1e6):
        expected = np.flatnonzero(real(values, quant) > threshold)
        np.testing.assert_array_equal(above(values, quant, threshold), expected)
    assert raw_threshold(0.5, None, np.float32) == 0.5


def _yolo_output(n=2000, nc=10, seed=0):
    rng = np.random.default_rng(seed)
    out = np.zeros((1, 4 + nc, n), np.float32)
    out[0, :2] = rng.random((2, n)) * 60 + 2
    out[0, 2:4] = rng.random((2, n)) * 10 + 2
    out[0, 4:] = rng.random((nc, n)) ** 6  # most low, a few high, as a trained detector's are
    return out


def _pairs(found):
    return [(d.index, round(d.score, 4), tuple(round(v, 2) for v in d.box)) for d in found.detections]


@pytest.mark.parametrize("transpose", [False, True])
def test_the_quantised_path_finds_what_the_float_path_finds(transpose):
    out = _yolo_output()
    out[0, :4] /= 64.0  # normalised boxes: one tensor in [0, 1], as an int8 YOLO export that works
    scale = 1 / 255
    q = np.clip(np.round(out / scale), 0, 255).astype(np.uint8)
    if transpose:
        out, q = out.transpose(0, 2, 1), q.transpose(0, 2, 1).copy()
    labels = [str(i) for i in range(10)]
    quantised = detector(labels, Outputs([q.shape], [(scale, 0)]))([q])
    floating = detector(labels, Outputs([q.shape]))([real(q, (scale, 0))])
    assert len(quantised) > 10
    assert _pairs(quantised) == _pairs(floating)


def test_objectness_scores_are_objectness_times_class_probability():
    out = np.zeros((1, 20, 7), np.float32)
    out[0, :, :4] = [32, 32, 8, 8]
    out[0, 3, 4:] = [0.9, 0.2, 0.8]  # objectness 0.9, class 1: 0.72
    out[0, 5, 4:] = [0.2, 0.9, 0.9]  # objectness under the threshold: never a candidate
    out[0, 9, 4:] = [0.5, 0.6, 0.1]  # 0.3
    out[0, 9, :4] = [10, 10, 8, 8]
    found = detector(["a", "b"], Outputs([out.shape]))([out])
    assert [(d.index, round(d.score, 4)) for d in found.detections] == [(1, 0.72), (0, 0.3)]


def test_ssd_background_column_and_logits():
    anchors = [[0.5, 0.5, 0.25, 0.25]] * 4
    rel = np.zeros((1, 4, 4), np.float32)
    logits = np.full((1, 4, 3), -8.0, np.float32)
    logits[0, 0] = [8.0, -8.0, -8.0]  # background wins: nothing
    logits[0, 2] = [-8.0, -8.0, 3.0]  # class "b" (column 2: background first)
    found = detector(["a", "b"], Outputs([rel.shape, logits.shape]), anchors=anchors)([rel, logits])
    assert [(d.label, round(d.score, 4)) for d in found.detections] == [("b", round(1 / (1 + np.exp(-3.0)), 4))]
    np.testing.assert_allclose(found.top.box, [24, 24, 40, 40])
    soft = detector(["a", "b"], Outputs([rel.shape, logits.shape]), anchors=anchors,
                    score_activation="softmax")([rel, logits])
    assert soft.top.label == "b" and soft.top.score == pytest.approx(np.exp(3) / (np.exp(3) + 2 * np.exp(-8)))
    last = detector(["a", "b"], Outputs([rel.shape, logits.shape]), anchors=anchors, background_class=2)
    # background last: columns 0 and 1 are a and b, so box 0's 8.0 is an "a" and box 2's 3.0 is background
    assert [d.label for d in last([rel, logits]).detections] == ["a"]


def test_decoded_boxes_format_is_read_from_the_boxes():
    boxes = np.zeros((1, 10, 4), np.float32)
    scores = np.zeros((1, 10, 2), np.float32)
    scores[0, 4, 0] = 0.9
    boxes[0, 4] = [0.5, 0.5, 0.25, 0.5]  # cx, cy, w, h normalised: x2 < x1 as corners
    found = detector(["a", "b"], Outputs([boxes.shape, scores.shape]))([boxes, scores])
    np.testing.assert_allclose(found.top.box, [24, 16, 40, 48])
    boxes[0, 4] = [10, 12, 30, 40]  # corners in pixels
    found = detector(["a", "b"], Outputs([boxes.shape, scores.shape]))([boxes, scores])
    np.testing.assert_allclose(found.top.box, [10, 12, 30, 40])
    found = detector(["a", "b"], Outputs([boxes.shape, scores.shape]), box_format="cxcywh")([boxes, scores])
    np.testing.assert_allclose(found.top.box, [0, 0, 25, 32])  # clipped to the 64 x 64 input


def test_postprocess_outputs_in_any_order_and_count():
    boxes = np.zeros((1, 5, 4), np.float32)
    boxes[0, :2] = [[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.75, 1.0]]
    classes = np.float32([[1, 0, 1, 1, 1]])
    scores = np.float32([[0.9, 0.6, 0.8, 0.7, 0.6]])
    count = np.float32([2])
    # the TF2 converter's order: classes, count, boxes, scores
    shapes = [classes.shape, count.shape, boxes.shape, scores.shape]
    found = detector(["a", "b"], Outputs(shapes))([classes, count, boxes, scores])
    assert [(d.label, round(d.score, 2)) for d in found.detections] == [("b", 0.9), ("a", 0.6)]
    np.testing.assert_allclose(found.detections[0].box, [12.8, 6.4, 25.6, 19.2], rtol=1e-5)
    swapped = detector(["a", "b"], Outputs([boxes.shape, scores.shape, classes.shape, count.shape]))
    assert _pairs(swapped([boxes, scores, classes, count])) == _pairs(found)


# ---------------------------------------------------------------------------------------------
# NMS


def test_max_detections_does_not_cut_the_candidates():
    """OpenCV's top_k drops candidates before suppressing: a lone box after 200 duplicates must stay."""
    boxes = np.float32([[10, 10, 60, 60]] * 200 + [[300, 300, 350, 350]])
    scores = np.linspace(0.9, 0.5, 201).astype(np.float32)
    kept = nms(boxes, scores, np.zeros(201, np.int64), 0.5, max_detections=5)
    assert kept.tolist() == [0, 200]


def _full_nms(boxes, scores, classes, iou):
    import cv2

    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
    kept = np.asarray(cv2.dnn.NMSBoxesBatched(xywh, scores, classes.astype(np.int32), 0.0, iou)).reshape(-1)
    return kept[np.argsort(-scores[kept], kind="stable")]


@pytest.mark.parametrize("n, spread, limit", [(1500, 600, 100), (2000, 60, 100), (300, 200, 10), (50, 600, 300)])
def test_nms_rounds_keep_what_one_full_run_keeps(n, spread, limit):
    rng = np.random.default_rng(n)
    xy = rng.random((n, 2)) * spread
    boxes = np.concatenate([xy, xy + rng.random((n, 2)) * 60 + 5], axis=1).astype(np.float32)
    scores = rng.random(n).astype(np.float32)
    classes = rng.integers(0, 10, n)
    expected = _full_nms(boxes, scores, classes, 0.45)[:limit]
    np.testing.assert_array_equal(nms(boxes, scores, classes, 0.45, limit), expected)


def test_class_aware_and_agnostic():
    boxes = np.float32([[0, 0, 10, 10], [1, 1, 10, 10]])
    scores = np.float32([0.9, 0.8])
    assert nms(boxes, scores, np.array([0, 1]), 0.5, 10).tolist() == [0, 1]
    assert nms(boxes, scores, np.array([0, 1]), 0.5, 10, class_agnostic=True).tolist() == [0]


def test_quantised_ssd_logits_decode_as_their_real_values():
    """int8 logits: the threshold goes through the logit and the quantisation; the result is the float one."""
    rng = np.random.default_rng(3)
    anchors = generate(check_ssd_anchors({**BLAZEFACE, "fixed_anchor_size": False}))
    rel = (rng.normal(0, 1, (1, 896, 4))).astype(np.float32)
    logits = rng.normal(-5, 2.5, (1, 896, 3)).astype(np.float32)
    scale, zero_point = 0.08, 10
    q = np.clip(np.round(logits / scale) + zero_point, -128, 127).astype(np.int8)
    qb_scale = 0.03
    qb = np.clip(np.round(rel / qb_scale), -128, 127).astype(np.int8)
    shapes = [rel.shape, logits.shape]
    spec = InputSpec.from_dict({"shape": [1, 128, 128, 3], "dtype": "float32"})
    quant = [(qb_scale, 0), (scale, zero_point)]
    quantised = detector(["a", "b"], Outputs(shapes, quant, spec), anchors=anchors.tolist())
    floating = detector(["a", "b"], Outputs(shapes, None, spec), anchors=anchors.tolist())
    found = quantised([qb, q])
    assert len(found) > 3
    assert _pairs(found) == _pairs(floating([real(qb, (qb_scale, 0)), real(q, (scale, zero_point))]))
