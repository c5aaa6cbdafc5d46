"""Rewrites of a float TFLite graph for the Edge TPU before int8 (edgekit/builders/graph/layout.py,
tflite_yolo.py, wired in tflite_rewrite.accelerator_rewrites): each one checked numerically against
the original graph, and the detect head decoding the rewritten output. The graph is the shape of an
onnx2tf-converted YOLOv8 export, made small with TensorFlow's converter: a C2f-style concatenation
done in NCHW between transposes, and a head whose ``[1, 4 + nc, N]`` output holds pixel boxes beside
sigmoid scores."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.builders.graph import edit as tflite_edit
from edgekit.builders.graph import layout as tflite_layout
from edgekit.builders.graph import yolo as tflite_yolo
from edgekit.builders.graph.rewrite import accelerator_rewrites, rewrite_checked
from edgekit.tflite.edgetpu_ops import SUPPORTED_OPS
from tests.helpers.yolo_graph import images, yolo_tflite

SIZE, NC = 64, 2


@pytest.fixture(scope="module")
def yolo_like() -> bytes:
    """``x [1, 64, 64, 3]`` -> conv, SiLU, a C2f-style split/concat in NCHW, conv -> two heads:
    pixel boxes decoded as YOLOv8 does (anchors and distances in cells, x each anchor's stride) and
    sigmoid scores, concatenated into ``[1, 4 + 2, 4096]``."""
    return yolo_tflite(SIZE, NC, c2f=True)


def _images(n: int = 6, seed: int = 1) -> list[np.ndarray]:
    return images(n, SIZE, seed)


def _run(blob: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=blob)
    interp.allocate_tensors()
    inp = interp.get_input_details()[0]
    if inp["dtype"] != np.float32:  # an int8 model (uint8 I/O)
        scale, zero = inp["quantization"]
        x = np.clip(np.round(x / scale + zero), 0, 255).astype(inp["dtype"])
    interp.set_tensor(inp["index"], x)
    interp.invoke()
    out = interp.get_output_details()[0]
    y = np.array(interp.get_tensor(out["index"]), np.float32)
    scale, zero = out["quantization"]
    return (y - zero) * scale if scale else y


def _ops(blob: bytes) -> list[str]:
    _, fb = tflite_edit.load_schema()
    model = tflite_edit.read(blob)
    return [fb.opcode_to_name(model, op.opcodeIndex) for op in model.subgraphs[0].operators]


def _edited(blob: bytes, edit) -> bytes:
    model = tflite_edit.read(blob)
    edit(model)
    return tflite_edit.write(tflite_edit.pruned(model))


def test_transposes_around_a_concatenation_go_with_the_same_outputs(yolo_like):
    assert _ops(yolo_like).count("TRANSPOSE") == 5
    got = _edited(yolo_like, lambda m: tflite_layout.drop_transpose_pairs(m) == 3 or pytest.fail("not 3"))
    assert _ops(got).count("TRANSPOSE") == 2  # the head's own layout transposes stay
    for x in _images():
        np.testing.assert_array_equal(_run(got, x), _run(yolo_like, x))


def test_mapped_ops_are_ordered_first_with_the_same_outputs(yolo_like):
    found = {}

    def edit(model):
        tflite_layout.drop_transpose_pairs(model)
        found["cut"] = tflite_layout.defer_unmapped(model, lambda name: name in SUPPORTED_OPS)

    got = _edited(yolo_like, edit)
    before, after = found["cut"]
    ops = _ops(got)
    assert after > before and ops.index("TRANSPOSE") == after
    assert ops[:after].count("CONV_2D") == 4  # both heads' convolutions before the first layout op
    for x in _images():
        np.testing.assert_array_equal(_run(got, x), _run(yolo_like, x))


def test_pixel_boxes_are_normalised_in_the_graph_and_the_scores_kept(yolo_like):
    model = tflite_edit.read(yolo_like)
    assert tflite_yolo.normalise_boxes(model) == (1, NC)
    got = tflite_edit.write(tflite_edit.pruned(model))
    ops = _ops(got)
    # the scale went up the decode: the stride MUL is gone, one MUL scales the distances
    assert ops.count("MUL") == _ops(yolo_like).count("MUL")  # the strides' MUL out, the scale's in
    assert ops[ops.index("SUB") - 2:ops.index("SUB")] == ["MUL", "STRIDED_SLICE"], ops
    factor = tflite_yolo.undo((1, 4 + NC, SIZE * SIZE), 1, (SIZE, SIZE))
    for x in _images():
        ref, new = _run(yolo_like, x), _run(got, x)
        assert np.abs(ref[0, :4]).max() > 1.5 and np.abs(new[0, :4]).max() < 1.5  # pixels, then input sizes
        np.testing.assert_allclose(new * factor, ref, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(new[0, 4:], ref[0, 4:])


def test_normalised_boxes_decode_to_the_same_detections(yolo_like):
    from edgekit.detect import yolo
    from edgekit.detect.head import detect_config
    from edgekit.imaging.image import InputSpec

    rewritten, done, _ = accelerator_rewrites(yolo_like, yolo_like, _images(2))
    assert [r.op for r in done] == ["TRANSPOSE", "YOLO pixel boxes", "op order"]
    spec = InputSpec(shape=(1, SIZE, SIZE, 3))
    config = detect_config(spec, NC, {"score_threshold": 0.3})
    for x in _images():
        ref = yolo.candidates([_run(yolo_like, x)], config, [None])
        got = yolo.candidates([_run(rewritten, x)], config, [None])
        assert len(ref.scores) > 0
        # the same once clipped to the input, as the head maps every box (corners clamped in the graph)
        np.testing.assert_allclose(np.clip(got.boxes, 0, SIZE), np.clip(ref.boxes, 0, SIZE), atol=1e-4 * SIZE)
        assert got.boxes.min() >= 0 and got.boxes.max() <= SIZE
        np.testing.assert_array_equal(got.scores, ref.scores)


def test_int8_keeps_the_scores_and_maps_more_ops_after_the_rewrites(yolo_like, tmp_path):
    """The point of it: one int8 scale for pixels beside [0, 1] scores leaves the scores a few
    levels; normalised, they keep 1/255 steps; and the Edge TPU's cut comes later."""
    from edgekit.builders.int8.quantize import quantize_int8
    from edgekit.tflite.edgetpu_rules import check_graph
    from edgekit.tflite.graph import read_graph

    class Log:
        lines: list[str] = []

        def info(self, msg):
            self.lines.append(msg)

        warn = info

    images = _images(24, seed=3)
    rewritten, done = rewrite_checked(yolo_like, [x[0] for x in images], Log(), "edgetpu")
    assert done and "YOLO pixel boxes x1" in Log.lines[-1]
    shares = []
    errors = []
    for blob in (yolo_like, rewritten):
        int8 = quantize_int8(blob, [x[0] for x in images], "uint8")
        ref = np.stack([_run(yolo_like, x)[0, 4:] for x in _images(4, seed=9)])
        got = np.stack([_run(int8, x)[0, 4:] for x in _images(4, seed=9)])
        errors.append(float(np.abs(got - ref).max()))
        path = tmp_path / f"model_{len(shares)}.tflite"
        path.write_bytes(int8)
        shares.append(check_graph(read_graph(path)).op_share)
    assert errors[0] > 0.05 and errors[1] < 0.02, errors  # 0.09 and 0.004 when written
    assert shares[1] > shares[0], shares


def test_a_graph_without_a_yolo_output_is_left_as_it_is(yolo_like):
    from edgekit.detect import yolo

    model = tflite_edit.read(yolo_like)
    sg = model.subgraphs[0]
    cat = sg.operators[-1]
    cat.inputs = list(cat.inputs)[::-1]  # scores first: not cx, cy, w, h then scores
    assert tflite_yolo.yolo_output(model) is None
    assert tflite_yolo.NORMALISED_LIMIT == yolo.NORMALISED_LIMIT  # what box_units=auto takes as normalised
