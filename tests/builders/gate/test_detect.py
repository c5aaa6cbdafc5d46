"""``edgekit build --task detect``: a tiny Keras detector made here, built for the cpu target
(fp32 + int8), gated on mAP against a COCO / YOLO eval set; a variant that loses mAP in int8
fails with exit 3, names where, and leaves no bundle.

The detector has hand-set weights, so what it finds is known: the 64x64 input is a 4x4 grid
of 16 px cells, each cell one candidate box (YOLOv8 layout ``[1, 4 + 2, 16]``), and a cell's
score for class ``red`` / ``green`` is the mean of that colour channel over the cell. The
images are 128x96 frames (stretched to the input, so boxes map back through a real resize)
with coloured rectangles on cells: the float model finds every one exactly (mAP 1.0).

The broken variant is the field's real failure (ultralytics/yolov5#10164): boxes in pixels
(up to 56) concatenated with scores in [0, 1] in one output, quantised per tensor: one int8
step is ~0.22, so a dim object (score 0.1) rounds to 0 and is lost.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgekit.cli import main

SIZE, GRID, CELL = 64, 4, 16
FW, FH = 128, 96  # frame: a cell is 32x24 px
LABELS = ["red", "green"]


def make_detector(path: Path, pixel_boxes: bool = False) -> Path:
    """Save the hand-weighted grid detector (see the module doc) as a .keras file."""
    import keras
    from keras import layers

    inp = keras.Input((SIZE, SIZE, 3))
    pooled = layers.AveragePooling2D(CELL)(inp)  # [4, 4, 3]: mean colour per cell
    scores_conv = layers.Conv2D(2, 1, use_bias=False, name="scores")
    scores = layers.Permute((2, 1))(layers.Reshape((GRID * GRID, 2))(scores_conv(pooled)))  # [2, 16]
    boxes_dense = layers.Dense(4 * GRID * GRID, name="boxes")  # zero kernel: the bias is the boxes
    boxes = layers.Reshape((4, GRID * GRID))(boxes_dense(layers.Flatten()(pooled)))  # [4, 16]
    model = keras.Model(inp, layers.Concatenate(axis=1, name="det")([boxes, scores]))
    pick = np.zeros((1, 1, 3, 2), np.float32)
    pick[0, 0, 0, 0] = pick[0, 0, 1, 1] = 1.0  # input is RGB / 255: red -> class 0, green -> class 1
    scores_conv.set_weights([pick])
    cells = np.arange(GRID * GRID)
    cxcywh = np.stack([(cells % GRID + 0.5) * CELL, (cells // GRID + 0.5) * CELL,
                       np.full(cells.size, CELL), np.full(cells.size, CELL)]).astype(np.float32)
    if not pixel_boxes:
        cxcywh /= SIZE  # normalised boxes: one range with the scores, int8 keeps both
    boxes_dense.set_weights([np.zeros((GRID * GRID * 3, 4 * GRID * GRID), np.float32), cxcywh.reshape(-1)])
    model.save(path)
    return path


def make_images(folder: Path, n: int, seed: int, fmt: str | None = "coco", dim: bool = False) -> Path:
    """``n`` frames with three coloured cells each; annotations as COCO, YOLO or none (calibration).
    ``dim``: half the objects at brightness 25/255 (score ~0.1)."""
    import cv2

    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for i in range(n):
        img = np.zeros((FH, FW, 3), np.uint8)
        rows = []
        for cell in rng.choice(GRID * GRID, size=3, replace=False):
            r, c = divmod(int(cell), GRID)
            cls = int(rng.integers(2))
            x, y, w, h = c * FW // GRID, r * FH // GRID, FW // GRID, FH // GRID
            img[y : y + h, x : x + w, 2 - cls] = 25 if dim and rng.random() < 0.5 else 255  # BGR
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": cls + 1, "bbox": [x, y, w, h]})
            rows.append(f"{cls} {(x + w / 2) / FW} {(y + h / 2) / FH} {w / FW} {h / FH}")
        cv2.imwrite(str(folder / "images" / f"{i:03d}.png"), img)
        images.append({"id": i + 1, "file_name": f"{i:03d}.png", "width": FW, "height": FH})
        if fmt == "yolo":
            (folder / "labels").mkdir(exist_ok=True)
            (folder / "labels" / f"{i:03d}.txt").write_text("\n".join(rows) + "\n")
    if fmt == "coco":
        cats = [{"id": k + 1, "name": name} for k, name in enumerate(LABELS)]
        (folder / "annotations.json").write_text(json.dumps({"images": images, "annotations": anns,
                                                             "categories": cats}))
    elif fmt == "yolo":
        (folder / "classes.txt").write_text("\n".join(LABELS) + "\n")
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("detect")
    return {
        "model": make_detector(root / "grid.keras"),
        "pixel_model": make_detector(root / "grid_px.keras", pixel_boxes=True),
        "calib": make_images(root / "calib", 24, 2, fmt=None) / "images",
        "coco": make_images(root / "coco", 12, 1),
        "yolo": make_images(root / "yolo", 12, 3, fmt="yolo"),
        "dim": make_images(root / "dim", 12, 1, dim=True),
    }


def build(capsys, data, out: Path, *extra, model: str = "model") -> tuple[int, str, str]:
    code = main(["build", "--model", str(data[model]), "--target", "cpu", "--calib", str(data["calib"]),
                 "--out", str(out), "--variants", "fp32,int8", *extra])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "edgekit.json").read_text())


@pytest.mark.slow
def test_build_detect_gates_on_map(tmp_path, capsys, data):
    code, out, err = build(capsys, data, tmp_path, "--eval", str(data["coco"]), "--task", "detect")
    assert code == 0, err
    m = manifest(tmp_path / "grid-cpu")
    assert m["task"] == "detect" and (tmp_path / "grid-cpu" / "labels.txt").read_text().split() == LABELS
    v = m["verification"]
    assert v["metric"] == "map" and v["gated"] and v["passed"] and v["layout"] == "yolo"
    assert v["dataset"]["eval_images"] == 12
    for name in ("fp32", "int8"):
        ev = v["models"][name]["eval"]
        # the float model finds every object exactly; int8 (boxes and scores share [0, 1]) too
        assert ev["metric"] == "map" and ev["original"] == 1.0 and ev["converted"] == 1.0 and ev["ratio"] == 1.0
        assert ev["map50"] == {"original": 1.0, "converted": 1.0, "ratio": 1.0}
        assert set(ev["per_class"]) == set(LABELS) and ev["per_class"]["red"]["converted"] == 1.0
        assert ev["objects"] == 36 and ev["passed"]
        assert v["models"][name]["holdout"]["metric"] == "map_agreement"
    assert [e["task_options"] for e in m["models"]] == [{"layout": "yolo"}] * 2
    log = (tmp_path / "grid-cpu" / "build.log").read_text()
    assert "int8 on 12 eval images: mAP@[.5:.95] original 1.0000 converted 1.0000 ratio 1.0000; " \
           "mAP@.5 original 1.0000 converted 1.0000 ratio 1.0000" in log
    assert "orig mAP" in out and "PASS" in out


@pytest.mark.slow
def test_the_device_pipeline_scores_the_bundle_as_the_build_did(tmp_path, capsys, data):
    """The same eval set through edgekit bench's accuracy mode (the device's pipeline, the
    bundle's own task_options) gives the build's mAP: the gate measured what the device runs."""
    from edgekit.bench.accuracy import evaluate

    assert build(capsys, data, tmp_path, "--eval", str(data["coco"]))[0] == 0  # task detect by default
    results = evaluate([str(tmp_path / "grid-cpu")], data["coco"], variants="all")
    built = manifest(tmp_path / "grid-cpu")["verification"]["models"]
    assert [r.metric for r in results] == ["mAP", "mAP"]
    assert [r.accuracy for r in results] == [built[n]["eval"]["converted"] for n in ("fp32", "int8")]


@pytest.mark.slow
def test_yolo_labels_are_an_eval_set_and_choose_the_task(tmp_path, capsys, data):
    code, _, err = build(capsys, data, tmp_path, "--eval", str(data["yolo"]), "--variants", "int8")
    assert code == 0, err
    m = manifest(tmp_path / "grid-cpu")
    assert m["task"] == "detect" and m["verification"]["models"]["int8"]["eval"]["ratio"] == 1.0


@pytest.mark.slow
def test_int8_that_loses_dim_objects_fails_with_exit_3_naming_where(tmp_path, capsys, data):
    code, _, err = build(capsys, data, tmp_path, "--eval", str(data["dim"]), "--task", "detect",
                         "--json", "--no-recover", model="pixel_model")  # recovery's 16x8 passes it
    assert code == 3
    assert [m["name"] for m in manifest(tmp_path / "grid_px-cpu")["models"]] == ["fp32"]  # int8 left out
    assert (tmp_path / "grid_px-cpu.rejected").is_dir()
    line = next(ln for ln in err.splitlines() if ln.startswith("edgekit build: error:"))
    assert "int8 mAP@[.5:.95]" in line and "vs original 1.0000" in line and "< 0.99" in line
    assert "worst int8 layers" in line and "normalise the boxes" in line  # the quantisation report
    v = manifest(tmp_path / "grid_px-cpu.rejected")["verification"]
    assert not v["passed"] and v["models"]["fp32"]["eval"]["passed"]
    int8 = v["models"]["int8"]
    assert int8["eval"]["converted"] < 0.9 and not int8["eval"]["passed"]
    assert int8["eval"]["per_class"]["red"]["converted"] < 1.0
    assert int8["quantization"]["worst_layers"]


@pytest.mark.slow
def test_a_stricter_ratio_fails_fp32_too(tmp_path, capsys, data):
    code, _, err = build(capsys, data, tmp_path, "--eval", str(data["coco"]), "--variants", "fp32",
                         "--min-map-ratio", "1.01")
    assert code == 3 and "fp32 mAP@[.5:.95] 1.0000 vs original 1.0000: ratio 1.0 < 1.01" in err
    assert "lower --min-map-ratio" in err and not (tmp_path / "grid-cpu").exists()


@pytest.mark.slow
def test_without_eval_held_back_images_gate_the_detections_fidelity_not_a_map_ratio(tmp_path, capsys, data):
    code, _, err = build(capsys, data, tmp_path, "--task", "detect", "--labels", str(data["yolo"] / "classes.txt"),
                         "--variants", "int8")
    assert code == 0, err
    v = manifest(tmp_path / "grid-cpu")["verification"]
    assert v["metric"] == "map_agreement_heldback" and v["gated"] and "held to the original's" in v["note"]
    hold = v["models"]["int8"]["holdout"]
    assert hold["metric"] == "map_agreement" and hold["agreement"] == 1.0  # reported
    assert hold["passed"] and hold["fidelity"]["detections"]["agreement"] == 1.0 and "ratio" not in hold


@pytest.mark.parametrize("extra,message", [
    # 3 labels: [6, 16] is 4 + 2 classes, no layout fits; every layout is named with the shapes
    (("--task", "detect", "--labels", "{labels3}"), "match no detection layout with 3 classes (tried postprocess"),
    (("--task", "detect", "--eval", "{bad_eval}"), "not there: 000.png"),
    (("--task", "classify", "-T", "score_threshold=0.3"), "--task-option applies to --task detect"),
    (("--task", "detect", "-T", "outputs=[0]"), "outputs is set by edgekit build"),
    (("--task", "detect", "--min-map-ratio", "0"), "--min-map-ratio 0.0 makes no sense"),
])
def test_bad_detect_builds_are_one_line_without_bundle(tmp_path, capsys, data, extra, message):
    labels3 = tmp_path / "three.txt"
    labels3.write_text("a\nb\nc\n")
    bad_eval = tmp_path / "bad_eval"
    bad_eval.mkdir()
    (bad_eval / "annotations.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "000.png"}], "categories": [{"id": 1, "name": "red"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5]}]}))
    argv = [a.format(labels3=labels3, bad_eval=bad_eval) for a in extra]
    code, _, err = build(capsys, data, tmp_path / "dist", *argv, "--variants", "fp32")
    errors = [ln for ln in err.splitlines() if ln.startswith("edgekit build: error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0], err
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_task_options_name_the_runtime_outputs_when_the_converter_reordered_them():
    """A two-output detector whose converted model lists scores before boxes: the bundle says
    which runtime output is which, and the device's head decodes it as the original."""
    from edgekit.builders.gate.detect import DetectGate
    from edgekit.builders.sources.model import SourceModel, make_outputs
    from edgekit.detect.head import Detector, detect_config
    from edgekit.imaging.image import InputSpec

    source = SourceModel(Path("two.keras"), "keras", (64, 64, 3), None,
                         outputs=make_outputs(["boxes", "scores"], [(1, 5, 4), (1, 5, 3)]))
    spec = InputSpec(shape=(1, 64, 64, 3))
    gate = DetectGate.for_model(source, ["a", "b", "c"], spec, {"iou_threshold": 0.5}, None)
    assert gate.layout == "decoded"
    assert gate.task_options([{"name": "boxes"}, {"name": "scores"}]) == {"layout": "decoded", "iou_threshold": 0.5}
    swapped = gate.task_options([{"name": "scores"}, {"name": "boxes"}])
    assert swapped == {"layout": "decoded", "iou_threshold": 0.5, "outputs": [1, 0]}

    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 0.5, (1, 5, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + 0.3], axis=2)  # xyxy, normalised
    scores = rng.uniform(0, 1, (1, 5, 3)).astype(np.float32)
    original = Detector(detect_config(spec, 3, {}), "decoded", ["a", "b", "c"], spec)([boxes, scores])
    options = {k: v for k, v in swapped.items() if k != "layout"}
    device = Detector(detect_config(spec, 3, options), "decoded", ["a", "b", "c"], spec)([scores, boxes])
    assert len(original) and device == original


def test_labels_that_are_not_all_the_model_classes_say_so():
    from edgekit.builders.gate.detect import DetectGate
    from edgekit.builders.sources.model import SourceModel, make_outputs
    from edgekit.errors import ModelError
    from edgekit.imaging.image import InputSpec

    source = SourceModel(Path("coco.onnx"), "onnx", (64, 64, 3), None, outputs=make_outputs(["y"], [(1, 84, 8400)]))
    with pytest.raises(ModelError) as e:
        DetectGate.for_model(source, ["person", "car"], InputSpec(shape=(1, 64, 64, 3)), {}, None)
    assert "[1, 84, 8400]" in e.value.message and "with 2 classes" in e.value.message
    assert "are all the model's classes" in e.value.hint
    assert DetectGate.for_model(source, [f"c{i}" for i in range(80)], InputSpec(shape=(1, 64, 64, 3)), {},
                                None).layout == "yolo"
