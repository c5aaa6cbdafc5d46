"""The sign demo on frames it never saw: unseen Fashion-MNIST test items held in the centre
window over unseen photos, the committed demo model built for the CPU, thresholds fitted on
the other half of the evaluation set, and the acceptance summary of ``robot.signs --truth``.

Items: eval/fashion's odd-numbered test images (the thresholds are fitted on the even ones;
no test image is ever trained on). Scenes: fresh camera-like crops of scikit-image's sample
photos (the background class is trained on other photos). The sequence is the one a new
user tried: ~2 s per item, ~1.3 s of plain scene between, 15 fps.

The fake-robot test checks the demo, not the classifier: its 5 items are drawn at random
among those the bundle's model names right on their own (a held item the model gets wrong
cannot be said right by any debouncer). The classifier's share is measured by the offline
test: 230 items drawn from all of them, at least 80 % said exactly once (84 % measured).
"""

from __future__ import annotations

import csv
import io
import json
import shutil

import cv2
import numpy as np
import pytest

from edgekit.camera import Frame
from robot import thresholds
from robot.acceptance import score_run
from robot.background import camera_frame, heldout_photos, hold_up
from robot.openset import read_thresholds
from robot.signs import Debouncer, background_index, main, run_demo
from tests.conftest import EVAL

FPS, HELD, PLAIN = 15, 30, 20  # 2 s held, 1.3 s of plain scene between


@pytest.fixture(scope="module")
def fitted(demo_bundles, tmp_path_factory):
    """The cpu bundle and thresholds fitted on the even half of eval/fashion (items and scenes)."""
    half = tmp_path_factory.mktemp("fit")
    for folder in sorted(p for p in EVAL.iterdir() if p.is_dir()):
        (half / folder.name).mkdir()
        files = sorted(folder.glob("*.png"))
        for f in files if folder.name == "background" else files[::2]:
            shutil.copy(f, half / folder.name / f.name)
    out = half / "thresholds.json"
    bundle = demo_bundles["cpu"].bundle
    assert thresholds.main(["--bundle", str(bundle), "--eval", str(half), "--out", str(out)]) == 0
    return bundle, out


def held_out_items(n: int, seed: int, runtime=None, labels=()) -> list[tuple[str, np.ndarray]]:
    """``n`` (label, 28x28 image) drawn from eval/fashion's odd-numbered test items; with a
    ``runtime``, only among those it names right at a score of at least 0.8."""
    rng = np.random.default_rng(seed)
    pool = [(f.parent.name, cv2.imread(str(f), cv2.IMREAD_GRAYSCALE)) for folder in sorted(EVAL.iterdir())
            if folder.name != "background" for f in sorted(folder.glob("*.png"))[1::2]]
    if runtime is not None:
        scores = thresholds.score_frames(runtime, labels, [item for _, item in pool])
        pool = [p for p, s in zip(pool, scores, strict=True) if labels[int(s.argmax())] == p[0] and s.max() >= 0.8]
    picks = rng.choice(len(pool), n, replace=False)
    return [pool[i] for i in picks]


def sequence(items, seed: int, lead: int = PLAIN):
    """(frames, per-frame truth): plain scene, then each item held over a fresh scene, plain between."""
    rng = np.random.default_rng(seed)
    photos = list(heldout_photos().values())
    frames, truth = [], []

    def scene():
        return camera_frame(photos[rng.integers(len(photos))], rng)

    for j, (label, item) in enumerate(items):
        plain = scene()
        frames += [plain] * (lead if j == 0 else PLAIN)
        truth += [""] * (lead if j == 0 else PLAIN)
        frames += [hold_up(scene(), item)] * HELD
        truth += [label] * HELD
    plain = scene()
    frames += [plain] * PLAIN
    truth += [""] * PLAIN
    return frames, truth


@pytest.mark.slow
def test_fake_robot_says_each_unseen_item_once_and_nothing_over_plain_scenes(fitted, tmp_path):
    from edgekit.model import open_model

    bundle, fitted_file = fitted
    with open_model(bundle) as model:
        items = held_out_items(5, seed=3, runtime=model.runtime, labels=model.labels)
    frames, truth = sequence(items, seed=4)
    folder = tmp_path / "seq"
    folder.mkdir()
    with open(folder / "truth.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file", "label"])
        for k, (frame, label) in enumerate(zip(frames, truth, strict=True)):
            cv2.imwrite(str(folder / f"{k:04d}.png"), frame)
            w.writerow([f"{k:04d}.png", label])
    out = io.StringIO()
    rc = main(["--bundle", str(bundle), "--fake", str(folder), "--hold", "1", "--fps", str(FPS), "--truth",
               str(folder / "truth.csv"), "--thresholds", str(fitted_file), "--json", str(tmp_path / "r.json")],
              out=out)
    text = out.getvalue()
    assert rc == 0, text
    acc = json.loads((tmp_path / "r.json").read_text())["acceptance"]
    assert [r["said"] for r in acc["items"]] == [1] * 5, text  # each held item exactly once
    assert acc["false"] == [], text
    assert all(r["latency_s"] < 1.0 for r in acc["items"]), text
    assert "acceptance (--truth):" in text and "per minute" in text and "confusion" in text


@pytest.mark.slow
def test_false_announcements_over_five_minutes_of_plain_scene(fitted):
    """Offline (the same loop, frames handed over directly, 15 fps clock): 231 fresh plain scenes
    of 1.3 s (5 minutes) around 230 held items; at most 1 false announcement is allowed."""
    from edgekit.model import open_model

    bundle, fitted_file = fitted
    items = held_out_items(230, seed=5)
    frames, truth = sequence(items, seed=6)
    with open_model(bundle) as model:
        labels = list(model.labels)
        bg = background_index(labels)
        margin = read_thresholds(fitted_file)["min_margin"]
        source = [Frame(f, int(k * 1e9 / FPS), k + 1) for k, f in enumerate(frames)]
        report = run_demo(iter(source), model.runtime, labels, debouncer=Debouncer(3, 0.8, bg, 0.5, margin))
    # announcements are stamped on the clock of the frames here: latency is in frames / fps
    for a in report.announcements:
        a.t_ns = a.t_capture_ns
    acc = score_run(report.announcements, truth, FPS, labels[bg])
    plain_min = acc["background_s"] / 60
    assert plain_min >= 5.0
    assert acc["false_on_background"] <= plain_min / 5, acc["false"]
    hit = sum(1 for r in acc["items"] if r["said"] == 1) / len(items)
    assert hit >= 0.8 and acc["repeated"] == 0, (hit, acc["confusion"])
