"""robot.train: every data layout, every architecture, mixed precision and distillation (tiny, 1 epoch)."""

from __future__ import annotations

import csv
import json
import shutil

import cv2
import numpy as np
import pytest

from robot import datasets, train
from tests.conftest import EVAL

CLASSES = ("bag", "sneaker", "trouser")


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("signs")
    for cls in CLASSES:
        (root / cls).mkdir()
        for f in sorted((EVAL / cls).glob("*.png"))[:12]:
            shutil.copy(f, root / cls / f.name)
    (root / "bag" / "broken.png").write_text("not an image")
    return root


def run(tmp_path, data, arch="edge", *extra):
    out = tmp_path / f"{arch}.keras"
    argv = ["--data", str(data), "--arch", arch, "--epochs", "1", "--input-size", "32", "--batch-size", "8",
            "--out", str(out), *extra]
    summary = train.train(train.build_parser().parse_args(argv))
    assert out.is_file() and summary["params"] > 0
    return out, summary


@pytest.mark.parametrize("arch", ["anki", "edge", "resnet"])
def test_each_architecture_trains_and_writes_what_build_takes(tmp_path, image_folder, arch):
    out, summary = run(tmp_path, image_folder, arch)
    assert (tmp_path / f"{arch}.labels.txt").read_text().split() == list(CLASSES)
    pre = json.loads((tmp_path / f"{arch}.preprocess.json").read_text())
    assert pre["colour"] == "gray" and pre["crop"] == [200, 200]
    assert summary["classes"] == 3 and summary["train"] + summary["val"] == 36  # the broken file was skipped


def test_anki_seed_cnn_has_the_seed_size():
    from robot.models import build_model

    assert 17_000_000 < build_model("anki", (200, 200, 1), 27).count_params() < 17_500_000


def test_mixed_precision_and_distillation(tmp_path, image_folder):
    teacher, _ = run(tmp_path, image_folder, "resnet")
    student, summary = run(tmp_path / "s", image_folder, "edge", "--distill-from", str(teacher), "--mixed-precision")
    import keras

    model = keras.models.load_model(student)
    assert model.output.dtype == "float32"  # softmax kept in float32 under mixed precision
    assert keras.mixed_precision.global_policy().name == "float32"  # policy restored afterwards


def test_kaggle_vector_layout(tmp_path):
    for i, name in enumerate(["a_0", "a_1", "b_0", "background_0", "background_1", "notes"]):
        img = np.full((60, 80), 40 * i, np.uint8)
        cv2.imwrite(str(tmp_path / f"{name}.png"), img)
    frames, labels, classes, skipped = datasets.load_kaggle_vector(tmp_path)
    assert len(classes) == 27 and classes[26] == "background"
    assert sorted(labels.tolist()) == [0, 0, 1, 26, 26]


def test_sign_language_mnist_csv(tmp_path):
    path = tmp_path / "sign_mnist.csv"
    rng = np.random.default_rng(0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label"] + [f"pixel{i}" for i in range(1, 785)])
        for label in (0, 1, 2, 24):
            w.writerow([label, *rng.integers(0, 256, 784).tolist()])
    frames, labels, classes, _ = datasets.load_any(path)
    assert frames[0].shape == (28, 28) and labels.tolist() == [0, 1, 2, 24] and classes[24] == "y"
    bad = tmp_path / "other.csv"
    bad.write_text("a,b\n1,2\n")
    from edgekit.errors import CalibrationError

    with pytest.raises(CalibrationError, match="Sign-Language-MNIST"):
        datasets.load_any(bad)


def test_background_class_is_added_last_from_package_photos(tmp_path, image_folder, monkeypatch):
    from robot import background

    monkeypatch.setattr(background, "WALLPAPERS", tmp_path / "no-wallpapers")  # the 4096-pixel webps are slow
    out, summary = run(tmp_path, image_folder, "edge", "--background", "12")
    assert (tmp_path / "edge.labels.txt").read_text().split() == [*CLASSES, "background"]
    assert summary["classes"] == 4 and summary["train"] + summary["val"] == 36 + 12


def test_background_images_are_scenes_and_clutter_and_the_held_out_photos_are_others():
    from robot import background

    rng = np.random.default_rng(0)
    photos = {"flat": np.full((300, 400), 90, np.uint8), "noise": rng.integers(0, 256, (300, 400), np.uint8)}
    imgs = background.background_images(40, photos, rng, size=64)
    assert len(imgs) == 40 and all(i.shape == (64, 64) and i.dtype == np.uint8 for i in imgs)
    assert len({i.tobytes() for i in imgs}) == 40  # every crop differs (position, scale, jitter)
    held_out = background.heldout_photos()
    assert len(held_out) >= 10 and all(name.startswith("skimage:") for name in held_out)
    frame = background.hold_up(background.camera_frame(photos["noise"], rng), np.full((28, 28), 200, np.uint8))
    assert frame.shape == (360, 640) and (frame[80:280, 220:420] == 200).all()
