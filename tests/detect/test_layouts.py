"""The detect head on real models: small TF graphs converted by TensorFlow's TFLite converter and
run by LiteRT, one per output layout the head decodes.

Every model is the same tiny "detector": the 64 x 64 input is average-pooled into an 8 x 8 grid
of cells (N = 64 boxes, one per cell); class 0 scores a cell's red, class 1 its blue, and each
cell's box is the cell itself (YOLO layouts, decoded boxes) or the cell's anchor moved by fixed
regressors (SSD). A red square filling one cell must therefore come back as class 0 with that
cell's box, decoded from each layout, through int8 outputs, and through the pipeline's
letterbox onto the frame. The in-graph NMS model is built as the TF Object Detection API's
TFLite export builds it: a ``tf.function`` annotated ``experimental_implements`` with the
``TFLite_Detection_PostProcess`` attributes, which the converter fuses into the custom op.
"""

from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest

from edgekit.detect.head import detector
from edgekit.imaging.image import InputSpec

SIDE, CELL, NC = 64, 8, 2
GRID = SIDE // CELL
N = GRID * GRID
ROW, COL = 3, 5  # the cell the red square fills
CELL_BOX = [COL * CELL, ROW * CELL, (COL + 1) * CELL, (ROW + 1) * CELL]  # xyxy input pixels: 40, 24, 48, 32
REGRESS = [2.0, -2.0, 5 * math.log(2.0), 0.0]  # ty, tx, th, tw: shift down, shift left, double the height
SSD_ANCHORS = {"num_layers": 1, "min_scale": 0.125, "max_scale": 0.125, "input_size_height": SIDE,
               "input_size_width": SIDE, "strides": [CELL], "aspect_ratios": [1.0],
               "interpolated_scale_aspect_ratio": 0.0}
# the anchor of (ROW, COL) is cy 0.4375, cx 0.6875, h = w = 0.125; REGRESS with scales 10, 10, 5, 5 makes
# cy 0.4625, cx 0.6625, h 0.25, w 0.125: y 0.3375..0.5875, x 0.6..0.725 of the input
SSD_BOX = [0.6 * SIDE, 0.3375 * SIDE, 0.725 * SIDE, 0.5875 * SIDE]
POSTPROCESS_ATTRS = {"max_detections": ("i", 10), "max_classes_per_detection": ("i", 1),
                     "detections_per_class": ("i", 100), "use_regular_nms": ("b", "false"),
                     "nms_score_threshold": ("f", "0.300000"), "nms_iou_threshold": ("f", "0.600000"),
                     "y_scale": ("f", "10.000000"), "x_scale": ("f", "10.000000"),
                     "h_scale": ("f", "5.000000"), "w_scale": ("f", "5.000000"), "num_classes": ("i", NC)}


def _implements() -> str:
    """The ``experimental_implements`` string the TF OD API's export_tflite_graph_lib_tf2 writes."""
    attrs = " ".join(f'attr {{ key: "{k}" value {{ {t}: {v} }} }}' for k, (t, v) in POSTPROCESS_ATTRS.items())
    return f'name: "TFLite_Detection_PostProcess" {attrs}'


def _grid_constants():
    rows, cols = np.meshgrid(np.arange(GRID), np.arange(GRID), indexing="ij")
    cx, cy = ((cols + 0.5) * CELL).reshape(-1), ((rows + 0.5) * CELL).reshape(-1)
    cxcywh = np.stack([cx, cy, np.full(N, CELL), np.full(N, CELL)], axis=1).astype(np.float32)
    anchors = np.stack([cy / SIDE, cx / SIDE, np.full(N, 0.125), np.full(N, 0.125)], axis=1).astype(np.float32)
    return cxcywh[None], anchors


def _module(kind: str):
    """A tf.Module whose ``__call__`` gives ``kind``'s outputs for a [1, 64, 64, 3] float input in [0, 1]."""
    import tensorflow as tf

    cxcywh, anchors = _grid_constants()

    class Grid(tf.Module):
        @tf.function(experimental_implements=_implements())
        def postprocess(self, boxes, scores, anchor_table):
            # what the export writes: placeholders the converter replaces by the fused op
            return (tf.constant(0.0, name="boxes"), tf.constant(0.0, name="classes"),
                    tf.constant(0.0, name="scores"), tf.constant(0.0, name="num_detections"))

        @tf.function(input_signature=[tf.TensorSpec([1, SIDE, SIDE, 3], tf.float32)])
        def __call__(self, x):
            pooled = tf.nn.avg_pool2d(x, CELL, CELL, "VALID")  # [1, 8, 8, 3]
            cls = tf.reshape(tf.stack([pooled[..., 0], pooled[..., 2]], axis=-1), [1, N, NC])
            zero = 0.0 * cls[..., :1]  # keeps the box outputs computed tensors, not constants
            box = tf.constant(cxcywh) + zero
            if kind == "yolo_cf":
                return tf.transpose(tf.concat([box, cls], -1), [0, 2, 1])
            if kind == "yolo_cl_norm":
                return tf.concat([box / SIDE, cls], -1)
            if kind == "yolo_objectness":
                top = tf.reduce_max(cls, -1, keepdims=True)
                return tf.concat([box, top, cls / (tf.reduce_sum(cls, -1, keepdims=True) + 1e-3)], -1)
            if kind == "decoded":
                xyxy = tf.concat([box[..., :2] - CELL / 2, box[..., :2] + CELL / 2], -1)
                return {"boxes": xyxy, "scores": cls}
            regress = tf.constant(np.tile(np.float32(REGRESS), (1, N, 1))) + zero
            background = 6.0 - 12.0 * tf.reduce_max(cls, -1, keepdims=True)
            logits = tf.concat([background, 12.0 * cls - 6.0], -1)  # [1, N, 1 + NC]
            if kind == "ssd":
                return {"regressors": regress, "scores": logits}
            return self.postprocess(regress, tf.sigmoid(logits), tf.constant(anchors))

    return Grid()


def _squares(count: int, seed: int = 0):
    """Calibration images: dark noise with a red or blue square filling a random cell."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        img = rng.random((1, SIDE, SIDE, 3), dtype=np.float32) * 0.1
        r, c, ch = rng.integers(0, GRID), rng.integers(0, GRID), rng.choice([0, 2])
        img[0, r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL, ch] = 1.0
        yield [img]


def _convert(kind: str, int8: bool) -> bytes:
    import tensorflow as tf

    module = _module(kind)
    with tempfile.TemporaryDirectory() as saved:
        tf.saved_model.save(module, saved, signatures=module.__call__.get_concrete_function())
        converter = tf.lite.TFLiteConverter.from_saved_model(saved)
        converter.allow_custom_ops = True  # TFLite_Detection_PostProcess: LiteRT has it built in
        if int8:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = lambda: _squares(16)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            converter.inference_input_type = tf.uint8
            converter.inference_output_type = tf.uint8
        return converter.convert()


MODELS = [("yolo_cf", False), ("yolo_cl_norm", False), ("yolo_objectness", False), ("decoded", False),
          ("ssd", False), ("postprocess", False), ("yolo_cl_norm", True), ("decoded", True)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{(kind, int8): path}: every model converted once for the module (about 20 s in all)."""
    directory = tmp_path_factory.mktemp("detect_models")
    paths = {}
    for kind, int8 in MODELS:
        path = directory / f"{kind}{'_int8' if int8 else ''}.tflite"
        path.write_bytes(_convert(kind, int8))
        paths[(kind, int8)] = path
    return paths


def _open(path, **spec):
    from edgekit.runtime.litert import LiteRTRuntime

    base = LiteRTRuntime(path)
    shape = list(base.input_spec.shape)
    quant = {"dtype": base.input_spec.dtype, "scale": base.input_spec.scale, "zero_point": base.input_spec.zero_point}
    base.close()
    return LiteRTRuntime(path, input_spec=InputSpec.from_dict({"shape": shape, **quant, **spec}))


def _input_with_square(runtime, row=ROW, col=COL, channel=0) -> np.ndarray:
    img = np.zeros((SIDE, SIDE, 3), np.uint8)
    img[row * CELL:(row + 1) * CELL, col * CELL:(col + 1) * CELL, channel] = 255
    from edgekit.imaging.image import Preprocessor

    return Preprocessor(runtime.input_spec)(img[..., ::-1].copy())  # frames are BGR


CASES = [  # kind, int8, layout expected, options, box expected (input pixels)
    ("yolo_cf", False, "yolo", {}, CELL_BOX),
    ("yolo_cl_norm", False, "yolo", {}, CELL_BOX),
    ("yolo_objectness", False, "yolo_objectness", {}, CELL_BOX),
    ("decoded", False, "decoded", {}, CELL_BOX),
    ("ssd", False, "ssd", {"ssd_anchors": SSD_ANCHORS}, SSD_BOX),
    ("postprocess", False, "postprocess", {}, SSD_BOX),
    ("yolo_cl_norm", True, "yolo", {}, CELL_BOX),
    ("decoded", True, "decoded", {"box_format": "xyxy"}, CELL_BOX),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind, int8, layout, options, box", CASES, ids=[f"{c[0]}{'-int8' * c[1]}" for c in CASES])
def test_each_layout_finds_the_square_where_it_is(models, kind, int8, layout, options, box):
    with _open(models[(kind, int8)]) as runtime:
        decode = detector(["red", "blue"], runtime, **options)
        assert decode.layout == layout
        found = decode(runtime.infer(_input_with_square(runtime)))
    assert len(found) == 1, str(found)
    top = found.top
    assert (top.label, top.index) == ("red", 0)
    assert top.score > 0.9
    tolerance = 0.6 if int8 else 1e-3  # int8 boxes: a quantisation step of 64 px / 255
    np.testing.assert_allclose(top.box, box, atol=tolerance)


@pytest.mark.slow
def test_the_converter_fuses_the_annotated_function_into_the_postprocess_op(models):
    with _open(models[("postprocess", False)]) as runtime:
        ops = {op["op_name"] for op in runtime.ops_details()}
        shapes = sorted(tuple(d["shape"]) for d in runtime.output_details())
    assert "TFLite_Detection_PostProcess" in ops
    assert shapes == [(1,), (1, 10), (1, 10), (1, 10, 4)]


@pytest.mark.slow
def test_the_op_and_the_ssd_decoder_agree_on_every_box(models):
    """Two squares of different classes: the fused op's boxes equal the head's own SSD decode."""
    img = np.zeros((SIDE, SIDE, 3), np.uint8)
    img[8:16, 48:56, 2] = 255  # blue (BGR) at cell (1, 6)
    img[40:48, 0:8, 0] = 255  # red at cell (5, 0)
    results = {}
    for kind, options in (("postprocess", {}), ("ssd", {"ssd_anchors": SSD_ANCHORS})):
        with _open(models[(kind, False)]) as runtime:
            from edgekit.imaging.image import Preprocessor

            tensor = Preprocessor(runtime.input_spec)(img)
            results[kind] = detector(["red", "blue"], runtime, **options)(runtime.infer(tensor))
    fused, ours = results["postprocess"], results["ssd"]
    assert sorted(d.label for d in fused.detections) == ["blue", "red"]
    for a, b in zip(sorted(fused.detections, key=lambda d: d.label), sorted(ours.detections, key=lambda d: d.label)):
        assert a.label == b.label
        np.testing.assert_allclose(a.box, b.box, atol=1e-3)
        assert a.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.slow
def test_int8_outputs_are_dequantised(models):
    with _open(models[("decoded", True)]) as runtime:
        assert all(q is not None for q in runtime.output_quantization)
        raw = runtime.infer(_input_with_square(runtime, 6, 1, channel=2))
        assert all(r.dtype == np.uint8 for r in raw)
        found = detector(["red", "blue"], runtime, box_format="xyxy")(raw)
    assert found.top.label == "blue"
    assert 0.9 < found.top.score <= 1.01  # a real score, not a raw uint8 count
    np.testing.assert_allclose(found.top.box, [8, 48, 16, 56], atol=0.6)


@pytest.mark.slow
@pytest.mark.parametrize("kind, options", [("yolo_cf", {}), ("ssd", {"ssd_anchors": SSD_ANCHORS})])
def test_the_pipeline_puts_the_box_on_the_object_in_the_frame(models, kind, options):
    """A 640 x 480 frame letterboxed into 64 x 64 (scale 0.1, 8 rows of padding above and below):
    the square drawn at x 400..480, y 160..240 fills cell (3, 5) of the input."""
    from edgekit.camera import Frame
    from edgekit.pipeline import Pipeline

    frame = np.zeros((480, 640, 3), np.uint8)
    frame[160:240, 400:480, 2] = 255  # red, BGR
    with _open(models[(kind, False)], resize="letterbox", interpolation="area") as runtime:
        pipeline = Pipeline(runtime, ["red", "blue"], warmup=0, task="detect", task_options=options)
        result = pipeline.step(Frame(frame, 0, 0))
    found = result.result
    assert found.size == (640, 480)
    assert found.top.label == "red"
    expected = CELL_BOX if kind == "yolo_cf" else SSD_BOX
    x1, y1, x2, y2 = expected  # input pixels -> frame pixels: / 0.1, minus the 8 rows of padding
    np.testing.assert_allclose(found.top.box, [x1 * 10, (y1 - 8) * 10, x2 * 10, (y2 - 8) * 10], atol=1.0)
    assert {"decode", "nms"} <= set(result.timings_ms)
