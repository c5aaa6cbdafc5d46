"""A clamp edgekit puts in the graph before int8 (an SSD's score logits to +-16) gives its range to
every tensor above it through RESHAPE and CONCATENATION (builders/graph/clamps.py); the
quantisation report and recovery's layer ranking compare those tensors with the float values
clipped as the clamp clips them, so the clamp's own cut is never named as a layer's error.

The model (tests/helpers/ssd_graph.py) has a known right answer: its second classifier's logits
lie near -250, all below the clamp, so int8 of the clamped graph loses nothing there (every value
is -16 in float clipped and in int8); against the unclamped float it reads an error of hundreds
of int8 steps."""

from __future__ import annotations

import pytest

from tests.helpers.ssd_graph import ANCHORS, images, output_position, ssd_tflite


@pytest.fixture(scope="module")
def clamped():
    """``(float graph with its scores clamped to +-16, clamped_ranges of it, the saturated conv's name)``."""
    from edgekit.builders.graph.clamps import clamped_ranges
    from edgekit.builders.graph.rewrite import clamp_outputs

    blob = ssd_tflite()
    graph = clamp_outputs(blob, [output_position(blob, ANCHORS)], 16.0)
    ranges = clamped_ranges(graph)
    return graph, ranges, _coarse_classifier(graph)


def _coarse_classifier(blob: bytes) -> str:
    """The CONV_2D output of the 4x4 map's classifier: the tensor [1, 4, 4, 1] produced by a CONV_2D."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=blob)
    shapes = {t["index"]: (t["name"], list(t["shape"])) for t in interp.get_tensor_details()}
    (name,) = [shapes[o][0] for op in interp._get_ops_details() if op["op_name"] == "CONV_2D"
               for o in op["outputs"] if shapes[o][1] == [1, 4, 4, 1]]
    return name


def test_the_clamp_range_reaches_the_conv_through_reshape_and_concatenation(clamped):
    from ai_edge_litert.interpreter import Interpreter

    graph, ranges, conv = clamped
    scores = Interpreter(model_content=graph).get_output_details()[output_position(graph, ANCHORS)]["name"]
    assert ranges[conv] == (-16.0, 16.0)
    assert ranges[f"{scores}/unclamped"] == ranges[f"{scores}/clamp_min"] == (-16.0, 16.0)
    # the 2 classifier convs, their 2 reshapes, the concatenation and the clamp's inner tensor: nothing else
    assert len(ranges) == 6 and set(ranges.values()) == {(-16.0, 16.0)}
    assert scores not in ranges  # the clamped output itself holds clamped values


def test_the_report_judges_the_saturated_conv_within_its_clamp(clamped):
    from edgekit.builders.int8.quantize import quantize_int8
    from edgekit.builders.int8.report import IDEAL_RMSE_OVER_SCALE, layer_errors, report_lines

    graph, ranges, conv = clamped
    data = images()
    debug = quantize_int8(graph, data, numeric_verify=True)
    unaware, _ = layer_errors(debug, data, debug_images=8)
    assert unaware[0]["tensor"] == conv and unaware[0]["rmse_over_scale"] > 100  # what the report said before
    worst, n = layer_errors(debug, data, debug_images=8, clamped=ranges)
    assert n == 8 and conv not in [w["tensor"] for w in worst[:1]]
    by_name = {w["tensor"]: w for w in layer_errors(debug, data, debug_images=8, worst=50, clamped=ranges)[0]}
    assert by_name[conv]["rmse_over_scale"] < 2 * IDEAL_RMSE_OVER_SCALE and by_name[conv]["clamp"] == [-16.0, 16.0]
    assert "mean_abs_error" not in by_name[conv]  # the unclamped difference's statistics are not kept
    assert all(w["rmse_over_scale"] < 4 for w in worst)
    (line,) = [line for line in report_lines({"images": 8, "worst_layers": [by_name[conv]]}) if "CONV_2D" in line]
    assert line.endswith("(against the float values clipped to its clamp [-16, 16])")


def test_recovery_keeps_in_float_what_int8_lost_not_what_the_clamp_cut(clamped):
    from edgekit.builders.int8.quantize import quantize_int8
    from edgekit.builders.int8.recovery import _tensors, ranked_layers, streamed_ranking

    graph, ranges, conv = clamped
    data = images()
    xs = [x[None] for x in data[:4]]
    quantized = quantize_int8(graph, data)
    reference, got = _tensors(graph, xs), _tensors(quantized, xs)
    assert ranked_layers(reference, got, {})[0] == conv  # the clamp's cut, ranked first before
    ranked = ranked_layers(reference, got, ranges)
    assert conv in ranked and ranked.index(conv) >= len(ranked) // 2
    # what the build runs: the same ranking, an image at a time (only one image's tensors held)
    assert streamed_ranking(graph, quantized, xs, ranges) == ranked
    assert streamed_ranking(graph, quantized, xs, {})[0] == conv


def test_a_one_sided_or_non_constant_minimum_is_no_clamp():
    import tensorflow as tf

    from edgekit.builders.graph.clamps import clamped_ranges

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32), tf.TensorSpec([1, 4], tf.float32)])
    def f(x, y):
        low = tf.reshape(tf.maximum(x * 2.0, 0.5), [1, 2, 2])  # MAXIMUM against 0.5: a low bound only
        return {"a": low, "b": tf.minimum(x + 1.0, y)}  # MINIMUM of two activations: no clamp

    blob = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()
    ranges = clamped_ranges(blob)
    assert list(ranges.values()) == [(0.5, float("inf"))]  # the MUL's output; RESHAPE comes after the clamp
