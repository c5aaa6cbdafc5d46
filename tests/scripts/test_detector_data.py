"""The bundled demo detector: its committed data (eval/detect, calib/detect), the generator that
made them (scripts/detector_data.py) and the committed model (models/detector.{keras,onnx}).

The model checks decode with edgekit's real detect head and score with pycocotools; floors are
what the committed model measured, less a margin (see each test).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgekit.evaluation.dataset import load_detection_set
from edgekit.evaluation.evaluate import coco_map
from edgekit.heads.table import make_decoder
from edgekit.imaging.image import Preprocessor, read_image
from scripts import detector_data as data

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "eval" / "detect"
CALIB = ROOT / "calib" / "detect"
MODELS = ROOT / "models"
LABELS = list(data.CLASSES)
# measured on the committed model: float mAP@[.5:.95] on all 100 eval images (scripts/train_detector.py
# prints it; the same for Keras and ONNX), recall at IoU 0.5 and score 0.3 on the first 20 (47 of 68)
MEASURED_MAP = 0.384
MEASURED_RECALL = 0.69


@pytest.fixture(scope="module")
def annotations() -> dict:
    return json.loads((EVAL / "annotations.json").read_text())


def test_committed_eval_set_loads_with_consistent_ids(annotations):
    dataset = load_detection_set(EVAL, labels=LABELS)
    assert len(dataset.images) == len(annotations["images"]) >= 80
    assert dataset.annotation_count == len(annotations["annotations"]) >= 3 * len(dataset.images)
    image_ids = [im["id"] for im in annotations["images"]]
    assert len(set(image_ids)) == len(image_ids)
    ann_ids = [a["id"] for a in annotations["annotations"]]
    assert len(set(ann_ids)) == len(ann_ids)
    assert {a["image_id"] for a in annotations["annotations"]} <= set(image_ids)
    assert [(c["id"], c["name"]) for c in annotations["categories"]] == list(enumerate(LABELS, start=1))
    assert {a["category_id"] for a in annotations["annotations"]} == set(range(1, len(LABELS) + 1))


def test_committed_boxes_lie_inside_their_images(annotations):
    sizes = {}
    for im in annotations["images"]:
        frame = read_image(EVAL / im["file_name"])
        assert frame.shape[:2] == (im["height"], im["width"]), im["file_name"]
        sizes[im["id"]] = (im["width"], im["height"])
    for a in annotations["annotations"]:
        x, y, w, h = a["bbox"]
        width, height = sizes[a["image_id"]]
        assert w >= 10 and h >= 10, a
        assert x >= 0 and y >= 0 and x + w <= width and y + h <= height, a
        assert 0 < a["area"] <= w * h
    # letterbox both ways: landscape, portrait and square scenes
    shapes = {(w > h) - (w < h) for w, h in sizes.values()}
    assert shapes == {-1, 0, 1}


def test_committed_sets_stay_small():
    calib = sorted(CALIB.glob("*.jpg"))
    assert len(calib) >= 100
    total = sum(p.stat().st_size for p in [*calib, *EVAL.iterdir()])
    assert total < 3.5e6


def test_generator_is_deterministic_and_made_the_committed_boxes(annotations):
    first = list(data.scenes(data.EVAL_SEED, 3, data.EVAL_PHOTOS))
    again = list(data.scenes(data.EVAL_SEED, 3, data.EVAL_PHOTOS))
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a.image, b.image)
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.classes, b.classes)
    other = next(data.scenes(data.EVAL_SEED + 1, 1, data.EVAL_PHOTOS))
    assert not np.array_equal(other.image, first[0].image)  # another seed, another scene
    # the committed annotations are this generator's output (the JPEGs only add compression)
    for image_id, sc in enumerate(first, start=1):
        committed = [a for a in annotations["annotations"] if a["image_id"] == image_id]
        assert [a["bbox"] for a in committed] == sc.boxes.tolist()
        assert [a["category_id"] - 1 for a in committed] == sc.classes.tolist()
        stored = read_image(EVAL / f"{image_id - 1:03d}.jpg")
        assert np.abs(_coarse(stored) - _coarse(sc.image)).mean() < 4  # JPEG 75 (chroma halved) loses detail only


def _coarse(img: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.resize(img, None, fx=0.25, fy=0.25, interpolation=cv2.INTER_AREA).astype(np.float32)


def test_generator_scene_invariants():
    for sc in data.scenes(7, 12, data.TRAIN_PHOTOS):
        h, w = sc.image.shape[:2]
        assert sc.image.dtype == np.uint8 and sc.image.shape[2] == 3 and (w, h) in data.SIZES
        assert len(sc.boxes) == len(sc.classes) == len(sc.areas)
        assert np.all(sc.boxes[:, :2] >= 0) and np.all(sc.boxes[:, 0] + sc.boxes[:, 2] <= w)
        assert np.all(sc.boxes[:, 1] + sc.boxes[:, 3] <= h)
        assert np.all((sc.classes >= 0) & (sc.classes < len(LABELS)))
        # visible area: at least 1 - MAX_HIDDEN of a shape (less the anti-aliased rim) is left
        assert np.all(sc.areas <= sc.boxes[:, 2] * sc.boxes[:, 3])


def test_committed_sidecars_describe_a_letterboxed_rgb_detector():
    assert (MODELS / "detector.labels.txt").read_text().split() == LABELS
    pre = json.loads((MODELS / "detector.preprocess.json").read_text())
    assert pre["resize"] == "letterbox" and pre["colour"] == "rgb"
    for name in ("detector.keras", "detector.onnx"):
        assert (MODELS / name).stat().st_size < 2e6


@pytest.fixture(scope="module")
def onnx_runtime():
    pytest.importorskip("onnxruntime")
    from scripts.train_detector import onnx_runtime as open_onnx

    rt = open_onnx(MODELS / "detector.onnx")
    yield rt
    rt.close()


def _detect(runtime, images: list[dict], **options) -> dict:
    prep = Preprocessor(runtime.input_spec)
    decode = make_decoder("detect", LABELS, runtime, **options)
    assert decode.layout == "yolo"
    out = {}
    for im in images:
        frame = read_image(EVAL / im["file_name"])
        out[im["id"]] = decode(runtime.infer(prep(frame)), frame_shape=frame.shape)
    return out


def test_onnx_model_has_the_yolov8_layout_with_normalised_boxes(onnx_runtime, annotations):
    (detail,) = onnx_runtime.output_details()
    assert list(detail["shape"])[1:] == [4 + len(LABELS), 500]  # channels first, like an Ultralytics export
    assert onnx_runtime.input_spec.layout == "NCHW"
    prep = Preprocessor(onnx_runtime.input_spec)
    out = onnx_runtime.infer(prep(read_image(EVAL / annotations["images"][0]["file_name"])))[0]
    # boxes and scores share one range, so per-tensor int8 keeps both (ultralytics/yolov5#10164)
    assert out.min() > -0.2 and out.max() < 1.1
    assert out[0, 4:].min() >= 0 and out[0, 4:].max() <= 1


def test_onnx_model_finds_the_objects(onnx_runtime, annotations):
    images = annotations["images"][:20]
    found = _detect(onnx_runtime, images, score_threshold=0.3)
    hit = total = 0
    for im in images:
        dets = found[im["id"]].detections
        for a in (a for a in annotations["annotations"] if a["image_id"] == im["id"]):
            x, y, w, h = a["bbox"]
            total += 1
            hit += any(d.index == a["category_id"] - 1 and _iou(d.box, (x, y, x + w, y + h)) >= 0.5 for d in dets)
    assert hit / total >= MEASURED_RECALL - 0.05


@pytest.mark.slow
def test_onnx_model_map_on_the_eval_set(onnx_runtime, annotations):
    dataset = load_detection_set(EVAL, labels=LABELS)
    found = _detect(onnx_runtime, annotations["images"], score_threshold=0.001, max_detections=100)
    assert coco_map(dataset, found)["map"] >= MEASURED_MAP - 0.03


def _iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


@pytest.mark.slow
def test_keras_model_matches_its_onnx_twin(onnx_runtime, annotations):
    keras = pytest.importorskip("keras")
    from scripts.train_detector import KerasRuntime

    model = keras.models.load_model(MODELS / "detector.keras", compile=False)
    assert model.output_shape == (None, 4 + len(LABELS), 500)
    rt = KerasRuntime(model)
    prep = Preprocessor(rt.input_spec)
    for im in annotations["images"][:4]:
        frame = read_image(EVAL / im["file_name"])
        k = rt.infer(prep(frame))[0]
        o = onnx_runtime.infer(Preprocessor(onnx_runtime.input_spec)(frame))[0]
        assert np.abs(k - o).max() < 1e-3


@pytest.mark.slow
def test_int8_edgetpu_build_keeps_map_and_maps_every_op(tmp_path):
    """The real build of the committed Keras model: the int8 mAP gate (99 % of float) passes and
    the offline Edge TPU check predicts every op on the TPU (decode included: no Transpose)."""
    pytest.importorskip("tensorflow")
    from edgekit import build

    (result,) = build(MODELS / "detector.keras", "edgetpu", [CALIB], tmp_path, eval_dir=EVAL, task="detect",
                      quiet=True)
    assert result.passed, result.error
    ver = result.manifest["verification"]
    assert ver["metric"] == "map" and ver["ratio"] >= 0.99
    assert ver["converted"] >= MEASURED_MAP - 0.05
    offline = result.manifest["edgetpu"]["offline"]
    assert offline["cut"] is None and offline["tpu_ops"] == offline["total_ops"]
