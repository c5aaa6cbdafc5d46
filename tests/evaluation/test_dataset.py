"""Detection eval sets (COCO JSON, YOLO txt) and mAP with pycocotools: what loads, every bad
input refused with one line, and mAP figures that can be checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgekit.detect.boxes import Detection, Detections
from edgekit.errors import CalibrationError, UsageError
from edgekit.evaluation.dataset import is_detection_set, load_detection_set
from edgekit.evaluation.evaluate import agreement_map, coco_map
from edgekit.imaging.image import read_image

W, H = 120, 100


def write_png(path: Path, w: int = W, h: int = H) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(path)


def coco_set(root: Path, **changes) -> Path:
    """Two images (120x100), a cat on the first, a dog and a cat on the second; COCO category
    ids 7 (cat) and 9 (dog), as a real export's ids need not start at 1."""
    for name in ("a.png", "b.png"):
        write_png(root / "images" / name)
    data = {
        "images": [{"id": 10, "file_name": "a.png", "width": W, "height": H},
                   {"id": 20, "file_name": "b.png", "width": W, "height": H}],
        "categories": [{"id": 7, "name": "cat"}, {"id": 9, "name": "dog"}],
        "annotations": [{"id": 1, "image_id": 10, "category_id": 7, "bbox": [10, 10, 30, 40]},
                        {"id": 2, "image_id": 20, "category_id": 9, "bbox": [50, 20, 60, 70]},
                        {"id": 3, "image_id": 20, "category_id": 7, "bbox": [0, 0, 20, 20]}],
    }
    data.update(changes)
    (root / "annotations.json").write_text(json.dumps(data))
    return root


def yolo_set(root: Path, lines: dict[str, str] | None = None, names: str | None = "cat\ndog\n") -> Path:
    for name in ("a.png", "b.png"):
        write_png(root / "images" / name)
    (root / "labels").mkdir(parents=True, exist_ok=True)
    # a: cat centred at (25, 30) in 120x100, 30x40 -> normalised
    for stem, text in (lines or {"a": "0 0.208333 0.3 0.25 0.4\n", "b": "1 0.666667 0.55 0.5 0.7\n"}).items():
        (root / "labels" / f"{stem}.txt").write_text(text)
    if names is not None:
        (root / "classes.txt").write_text(names)
    return root


def det(index: int, box, score: float = 0.9, label: str = "") -> Detection:
    return Detection(index, label, score, tuple(float(v) for v in box))


# --- loading ---------------------------------------------------------------------------------


def test_coco_set_loads_with_model_order_labels(tmp_path):
    s = load_detection_set(coco_set(tmp_path), labels=["dog", "cat"])
    assert s.format == "coco" and s.labels == ("dog", "cat") and s.annotation_count == 3
    assert [(im.id, im.width, im.height, im.path.name) for im in s.images] == [(10, W, H, "a.png"), (20, W, H, "b.png")]
    # category ids follow the model's labels: cat is class 1 -> COCO id 2, whatever the file called it
    cats = {a["id"]: a["category_id"] for a in s.annotations}
    assert cats == {1: 2, 2: 1, 3: 2}
    gt = s.coco_gt()
    assert sorted(gt.getImgIds()) == [10, 20] and len(gt.getAnnIds()) == 3
    assert [c["name"] for c in gt.loadCats(gt.getCatIds())] == ["dog", "cat"]


def test_coco_labels_default_to_the_categories_in_id_order_and_a_json_path_works(tmp_path):
    root = coco_set(tmp_path)
    s = load_detection_set(root / "annotations.json")
    assert s.labels == ("cat", "dog") and s.annotations[0]["category_id"] == 1
    assert is_detection_set(root) and is_detection_set(root / "annotations.json")


def test_instances_json_and_images_beside_it(tmp_path):
    coco_set(tmp_path)
    (tmp_path / "annotations.json").rename(tmp_path / "instances_val.json")
    for p in (tmp_path / "images").iterdir():
        p.rename(tmp_path / p.name)
    s = load_detection_set(tmp_path)
    assert s.images[0].path == tmp_path / "a.png"


def test_yolo_set_converts_to_pixels(tmp_path):
    s = load_detection_set(yolo_set(tmp_path))
    assert s.format == "yolo" and s.labels == ("cat", "dog") and s.annotation_count == 2
    a = s.annotations[0]
    assert a["category_id"] == 1 and a["bbox"] == pytest.approx([10, 10, 30, 40], abs=1e-3)
    assert is_detection_set(tmp_path) and not is_detection_set(tmp_path / "images")


def test_yolo_names_from_data_yaml_or_labels_and_images_without_labels_are_negatives(tmp_path):
    root = yolo_set(tmp_path, lines={"a": "1 0.5 0.5 0.2 0.2\n"}, names=None)
    (root / "data.yaml").write_text("names:\n  0: cat\n  1: dog\n")
    s = load_detection_set(root)
    assert s.labels == ("cat", "dog") and len(s.images) == 2 and s.annotation_count == 1
    (root / "data.yaml").unlink()
    assert load_detection_set(root, labels=["a", "b"]).labels == ("a", "b")


def test_a_rounding_excess_at_the_edge_is_clipped(tmp_path):
    # 1 % of the side (at least 1 px) past the edge is tolerated and clipped off
    s = load_detection_set(coco_set(tmp_path, annotations=[
        {"id": 1, "image_id": 10, "category_id": 7, "bbox": [-0.8, 50, 121.5, 50.9]}]))
    assert s.clipped == 1 and s.annotations[0]["bbox"] == pytest.approx([0, 50, W, 50])


# --- bad input: one line each -----------------------------------------------------------------

BAD_COCO = [
    ({"images": [{"id": 10, "file_name": "missing.png"}]}, "not there: missing.png"),
    ({"annotations": []}, "holds no annotations"),
    ({"annotations": [{"id": 1, "image_id": 99, "category_id": 7, "bbox": [1, 1, 2, 2]}]}, "image id 99"),
    ({"annotations": [{"id": 1, "image_id": 10, "category_id": 3, "bbox": [1, 1, 2, 2]}]},
     "category_id 3, outside the categories"),
    ({"annotations": [{"id": 1, "image_id": 10, "category_id": 7, "bbox": [100, 10, 40, 20]}]},
     "lies outside its image"),
    ({"annotations": [{"id": 1, "image_id": 10, "category_id": 7, "bbox": [10, 10, 0, 20]}]}, "has no area"),
    ({"annotations": [{"id": 1, "image_id": 10, "category_id": 7, "bbox": [10, 10, 5]}]}, "is not 4 numbers"),
    ({"images": [{"id": 10, "file_name": "a.png", "width": 640, "height": 480}]}, "annotated as 640x480"),
    ({"images": [{"id": 10, "file_name": "../a.png"}]}, "points outside the data set"),
    ({"images": [{"id": 10, "file_name": "a.png"}, {"id": 10, "file_name": "b.png"}]}, "appears twice"),
    ({"categories": []}, "has no categories"),
    ({"annotations": None}, "'annotations' is missing"),
]


@pytest.mark.parametrize("changes,message", BAD_COCO)
def test_bad_coco_sets_are_one_line(tmp_path, changes, message):
    with pytest.raises(UsageError) as e:
        load_detection_set(coco_set(tmp_path, **changes))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_categories_outside_the_labels(tmp_path):
    with pytest.raises(UsageError, match=r"categories 'dog' are not among the model's labels \(cat, bird\)"):
        load_detection_set(coco_set(tmp_path), labels=["cat", "bird"])


@pytest.mark.parametrize("text,message", [("", "is empty"), ("{not json", "is not valid JSON (line 1"),
                                          ("[1, 2]", "not a COCO annotations object")])
def test_unreadable_json(tmp_path, text, message):
    coco_set(tmp_path)
    (tmp_path / "annotations.json").write_text(text)
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        load_detection_set(tmp_path)


@pytest.mark.parametrize("lines,message", [
    ({"a": "0 0.5 0.5 0.2\n"}, "is not 5 numbers"),
    ({"a": "0 0.1 0.1 0.2 0.2 0.3 0.3 0.1 0.1\n"}, "a segmentation polygon?"),
    ({"a": "cat 0.5 0.5 0.2 0.2\n"}, "is not 5 numbers"),
    ({"a": "2 0.5 0.5 0.2 0.2\n"}, "class 2 is outside the labels (0 to 1)"),
    ({"a": "0.5 0.5 0.5 0.2 0.2\n"}, "class 0.5 is outside the labels"),
    ({"a": "0 0.95 0.5 0.2 0.2\n"}, "lies outside its image"),
    ({"a": "\n\n"}, "holds no annotations"),
    ({"a": "0 0.5 0.5 0.2 0.2\n", "zzz": "0 0.5 0.5 0.2 0.2\n"}, "name no image"),
])
def test_bad_yolo_sets_are_one_line(tmp_path, lines, message):
    with pytest.raises(UsageError) as e:
        load_detection_set(yolo_set(tmp_path, lines=lines))
    assert message in str(e.value) and "\n" not in str(e.value)
    if ":" in message or "numbers" in message:
        assert "a.txt:1" in str(e.value)  # the file and line


def test_yolo_without_class_names(tmp_path):
    with pytest.raises(UsageError, match="no class names"):
        load_detection_set(yolo_set(tmp_path, names=None))


def test_no_annotations_at_all(tmp_path):
    write_png(tmp_path / "x.png")
    with pytest.raises(UsageError, match="holds no detection annotations"):
        load_detection_set(tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        load_detection_set(tmp_path / "nope")


def test_an_unreadable_image_is_refused(tmp_path):
    coco_set(tmp_path)
    (tmp_path / "images" / "a.png").write_bytes(b"not a png")
    with pytest.raises(UsageError, match="a.png is not a readable image"):
        load_detection_set(tmp_path)


# --- mAP --------------------------------------------------------------------------------------


def perfect(s) -> dict[int, Detections]:
    out: dict[int, list[Detection]] = {im.id: [] for im in s.images}
    for a in s.annotations:
        x, y, w, h = a["bbox"]
        out[a["image_id"]].append(det(a["category_id"] - 1, (x, y, x + w, y + h)))
    return {i: Detections(tuple(d)) for i, d in out.items()}


def test_perfect_detections_score_one(tmp_path, capsys):
    s = load_detection_set(coco_set(tmp_path), labels=["cat", "dog"])
    scores = coco_map(s, perfect(s))
    assert scores["map"] == 1.0 and scores["map50"] == 1.0
    assert scores["per_class"] == {"cat": 1.0, "dog": 1.0} and scores["images"] == 2
    assert capsys.readouterr().out == ""  # COCOeval's prints do not reach stdout


def test_one_missed_object(tmp_path):
    # the dog (the only one of its class) is missed: dog AP 0, cat AP 1 -> mAP 0.5
    s = load_detection_set(coco_set(tmp_path), labels=["cat", "dog"])
    found = perfect(s)
    found[20] = Detections(tuple(d for d in found[20].detections if d.index == 0))
    scores = coco_map(s, found)
    assert scores["map"] == pytest.approx(0.5) and scores["per_class"] == {"cat": 1.0, "dog": 0.0}
    # one of two cats missed instead: recall 1/2 at precision 1 -> cat AP 0.5 (101-point
    # interpolation: recall 0..0.5 has precision 1, 51 of 101 points) -> mAP (0.5049 + 1) / 2
    found = perfect(s)
    found[10] = Detections(())
    scores = coco_map(s, found)
    assert scores["per_class"]["cat"] == pytest.approx(51 / 101, abs=1e-6)
    assert scores["map"] == pytest.approx((51 / 101 + 1) / 2, abs=1e-6)


def test_a_shifted_box_counts_only_at_the_iou_thresholds_it_reaches(tmp_path):
    s = load_detection_set(coco_set(tmp_path, annotations=[
        {"id": 1, "image_id": 10, "category_id": 7, "bbox": [0, 0, 40, 40]}]), labels=["cat", "dog"])
    # shifted by 10 px: intersection 30x40 = 1200, union 2000, IoU 0.6 -> a hit at .50, .55 and
    # .60 (IoU >= threshold), a miss at the 7 stricter thresholds -> mAP 3/10
    scores = coco_map(s, {10: Detections((det(0, (10, 0, 50, 40)),)), 20: Detections(())})
    assert scores["map50"] == 1.0 and scores["map"] == pytest.approx(0.3)


def test_only_the_images_scored_count_and_an_empty_result_scores_zero(tmp_path):
    s = load_detection_set(coco_set(tmp_path), labels=["cat", "dog"])
    only_a = coco_map(s, {10: perfect(s)[10]})
    assert only_a["images"] == 1 and only_a["map"] == 1.0 and only_a["per_class"] == {"cat": 1.0}
    assert coco_map(s, {10: Detections(()), 20: Detections(())})["map"] == 0.0
    with pytest.raises(CalibrationError, match="none of the 0 images"):
        coco_map(s, {})


def test_agreement_with_oneself_is_one_and_nothing_to_agree_on_is_none():
    ref = [Detections((det(0, (0, 0, 10, 10), 0.9), det(1, (20, 20, 40, 40), 0.1)), (64, 64)),
           Detections((det(1, (5, 5, 30, 30), 0.8),), (64, 64))]
    assert agreement_map(ref, ref, ["a", "b"])["map"] == 1.0
    # only detections scoring >= 0.25 are ground truth: the 0.1 one is not, and missing it costs nothing
    assert agreement_map(ref, [ref[0], Detections(())], ["a", "b"])["map"] == pytest.approx(0.5)
    assert agreement_map([Detections(())], [Detections(())], ["a"]) is None


def test_box_sizes_read_from_headers_match_the_decoded_image(tmp_path):
    s = load_detection_set(yolo_set(tmp_path))
    for im in s.images:
        assert read_image(im.path).shape[:2] == (im.height, im.width)
