"""Layout regions (builders/graph/transposes.py) and grouped convolutions made depthwise
(builders/graph/grouped.py), on small float TFLite graphs shaped as onnx2tf leaves an NCHW export
whose Add it "rescued" into NCHW (PP-OCRv4's text detector): the ops after a convolution run in
NCHW between TRANSPOSEs, a depthwise convolution after one comes out as a grouped CONV_2D. The
right answer is the original graph's outputs, which every rewritten graph must give."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.builders.graph import edit, grouped, transposes
from edgekit.builders.graph.rewrite import rewrite_checked
from edgekit.tflite.edgetpu_rules import check_graph
from edgekit.tflite.graph import read_graph

H, W, C = 6, 10, 4  # all different: a shape or constant permuted the wrong way shows
P, BACK = [0, 3, 1, 2], [0, 2, 3, 1]


def _weights(seed: int = 0):
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.4):
        return tf.constant(rng.normal(0, scale, shape).astype(np.float32))

    return {"c1": w(3, 3, 3, C), "c2": w(1, 1, 3, C), "out": w(1, 1, 2 * C, 3), "dw": w(3, 3, 1, C),
            "dw2": w(3, 3, 1, 2 * C), "grouped": w(3, 3, 2, C), "scale": tf.constant([0.9]),
            "bias": w(1, C, 1, 1, scale=0.2)}


def _nchw_tflite(reshape: bool = False, depthwise: bool = True) -> bytes:
    """``x [1, 6, 10, 3]`` -> conv -> TRANSPOSE to NCHW -> hard swish, ``* [1]``, ``+ [1, C, 1, 1]``,
    a residual with a second transposed conv, PAD, a squeeze-excite MEAN over H, W, CONCATENATION
    on channels -> TRANSPOSE back -> conv; a second output through a depthwise conv of the NCHW
    tensor transposed back (``depthwise``). ``reshape``: another output RESHAPEs an NCHW tensor (a
    consumer that needs its layout)."""
    import tensorflow as tf

    k = _weights()

    @tf.function(input_signature=[tf.TensorSpec([1, H, W, 3], tf.float32)])
    def f(x):
        a = tf.transpose(tf.nn.conv2d(x, k["c1"], 1, "SAME"), P)
        a = a * tf.nn.relu6(a + 3) / 6 * k["scale"] + k["bias"]
        r = a + tf.transpose(tf.nn.conv2d(x, k["c2"], 1, "SAME"), P)
        r = tf.pad(r, [[0, 0], [0, 0], [1, 0], [0, 2]])
        r = r * tf.sigmoid(tf.reduce_mean(r, [2, 3], keepdims=True))
        y = tf.transpose(tf.concat([r, tf.pad(a, [[0, 0], [0, 0], [1, 0], [0, 2]])], 1), BACK)
        outputs = [tf.nn.conv2d(y, k["out"], 1, "SAME")]
        if depthwise:
            outputs.append(tf.nn.conv2d(tf.transpose(r, BACK), k["dw"], 1, "SAME"))
        if reshape:
            outputs.append(tf.reshape(a, [1, C, H * W]))
        return outputs

    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def _grouped_tflite() -> bytes:
    """Three grouped convolutions as TensorFlow's converter writes them (CONV_2D, filter
    ``[out, 3, 3, in / groups]``): one and two filters a channel (depthwise), and two channels a
    group (not depthwise)."""
    import tensorflow as tf

    k = _weights(1)

    @tf.function(input_signature=[tf.TensorSpec([1, H, W, C], tf.float32)])
    def f(x):
        return [tf.nn.relu6(tf.nn.conv2d(x, k["dw"], 1, "SAME")), tf.nn.conv2d(x, k["dw2"], 2, "VALID"),
                tf.nn.conv2d(x, k["grouped"], 1, "SAME")]

    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def _ops(blob: bytes) -> list[str]:
    _, fb = edit.load_schema()
    model = edit.read(blob)
    return [fb.opcode_to_name(model, op.opcodeIndex) for op in model.subgraphs[0].operators]


def _edited(blob: bytes, rewrite) -> tuple[bytes, int]:
    model = edit.read(blob)
    count = rewrite(model)
    return edit.write(edit.pruned(model)), count


def _outputs(blob: bytes, x: np.ndarray) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=blob)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]


def _images(n: int = 4, channels: int = 3, seed: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1, (1, H, W, channels)).astype(np.float32) for _ in range(n)]


def _same(a: bytes, b: bytes, channels: int = 3) -> None:
    for x in _images(channels=channels):
        for got, ref in zip(_outputs(b, x), _outputs(a, x), strict=True):
            assert got.shape == ref.shape
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def nchw() -> bytes:
    return _nchw_tflite()


def test_every_transpose_of_a_layout_region_goes_with_the_same_outputs(nchw):
    assert _ops(nchw).count("TRANSPOSE") == 4  # two entries, two exits
    got, count = _edited(nchw, transposes.drop_layout_regions)
    assert count == 4 and "TRANSPOSE" not in _ops(got)
    # the ops between kept: the broadcast [1, C, 1, 1] bias, the paddings, the MEAN's axes and the
    # concatenation's axis now in NHWC
    assert {"PAD", "MEAN", "CONCATENATION", "HARD_SWISH"} <= set(_ops(got))
    _same(nchw, got)


def test_a_region_with_an_op_that_needs_its_layout_is_left_as_it_is():
    blob = _nchw_tflite(reshape=True)
    got, count = _edited(blob, transposes.drop_layout_regions)
    assert count == 0 and _ops(got) == _ops(blob)
    _same(blob, got)


def test_a_depthwise_convolution_written_as_a_grouped_conv_2d_becomes_depthwise():
    blob = _grouped_tflite()
    assert _ops(blob).count("CONV_2D") == 3
    got, count = _edited(blob, grouped.depthwise_convolutions)
    assert count == 2  # one and two filters a channel; the two-channel groups stay CONV_2D
    assert _ops(got).count("DEPTHWISE_CONV_2D") == 2 and _ops(got).count("CONV_2D") == 1
    _same(blob, got, channels=C)


def test_the_edge_tpu_maps_the_whole_int8_graph_after_the_rewrites(tmp_path):
    """The point of it: the original's first TRANSPOSE cuts the Edge TPU graph; rewritten, every
    op is predicted on the TPU, and the log says the cut before and after."""
    from edgekit.builders.int8.quantize import quantize_int8

    class Log:
        lines: list[str] = []

        def info(self, msg):
            self.lines.append(msg)

        warn = info

    # without the depthwise output, whose TRANSPOSE and DEPTHWISE_CONV_2D TensorFlow's quantiser leaves in float
    nchw, images = _nchw_tflite(depthwise=False), [x[0] for x in _images(16, seed=5)]
    rewritten, done = rewrite_checked(nchw, images, Log(), "edgetpu")
    assert [(r.op, r.count) for r in done if r.op == "TRANSPOSE"] == [("TRANSPOSE", 3)]
    assert "was 1/" in Log.lines[-1]  # the first TRANSPOSE was op 1
    reports = []
    for name, blob in (("before", nchw), ("after", rewritten)):
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(quantize_int8(blob, images, "uint8"))
        reports.append(check_graph(read_graph(path)))
    before, after = reports
    assert before.cut is not None and before.cut.opcode == "TRANSPOSE" and before.op_share < 0.3
    assert after.cut is None and after.tpu_ops == after.total_ops
