"""``python -m robot.signs --task detect``: the loopback FakeVector streams scenes, the real SDK
client receives them, a real ONNX detector finds the objects, the boxes appear on the robot's
face and the top label is said when it changes."""

from __future__ import annotations

import io
import json

import cv2
import numpy as np
import pytest

from edgekit.model import open_model
from edgekit.outputs.overlay import colour_for
from robot.openset import Debouncer
from robot.signs import main
from tests.helpers.detector_model import detector_bundle, scene

pytest.importorskip("anki_vector", reason="needs wirepod_vector_sdk (pip install 'edgekit-vision[vector]')")

from edgekit.vector.camera import VectorSource  # noqa: E402
from edgekit.vector.fake import FakeVector  # noqa: E402

# nothing, a cat (left half bright), nothing, a dog (right half bright); on 640x360 camera frames the
# letterbox leaves 36 of the 64 input rows to the scene: the scores are about 0.49
SEQUENCE = [(False, False)] * 4 + [(True, False)] * 8 + [(False, False)] * 4 + [(False, True)] * 8


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return detector_bundle(tmp_path_factory.mktemp("det") / "twobox-cpu")


def _has_colour(image: np.ndarray, bgr: tuple[int, int, int], columns: slice) -> bool:
    """Whether a face image (RGB, through RGB565) has pixels of the class colour in ``columns``."""
    rgb = np.array(bgr[::-1], int)
    close = np.abs(image[:, columns].astype(int) - rgb).max(axis=-1) <= 8
    return int(close.sum()) >= 20


def test_boxes_are_drawn_on_the_face_and_each_new_label_is_said_once(bundle):
    from robot.boxes import run_boxes

    frames = [scene(left, right, seed=i) for i, (left, right) in enumerate(SEQUENCE)]
    # a live camera drops what a busy consumer cannot take (the newest frame wins): each scene is held
    # for 1.2 s, so a consumer slowed to 5 fps by a loaded machine still sees it --agree times
    with open_model(bundle) as model, FakeVector(frames, fps=20, hold=3, loop=False) as fake, \
            VectorSource(fake.serial, config_home=fake.home, connect_timeout_s=2,
                         prepare=model.runtime.input_spec) as cam:
        report = run_boxes(
            cam, model.runtime, model.labels, task_options=model.task_options,
            say=lambda text: cam.say(text, wait=False),
            show=lambda image: cam.show(image, duration_s=0.5, wait=False),
            debouncer=Debouncer(agree=2, min_confidence=0.4), face_every_s=0.0, warmup=2,
            until=lambda frame: fake.exhausted.is_set() and frame.index >= fake.frame_count,
        )
        said, shown = list(fake.said), list(fake.shown)
    assert report.said == ["cat", "dog"] and said == ["cat", "dog"]  # quiet while nothing is seen
    assert report.errors == [] and report.failure is None
    assert len(shown) == report.metrics["face_shown"] >= 6  # at least a few frames of each scene
    assert all(image.shape == (96, 184, 3) for image in shown)
    # a cat box on the left half of the screen, a dog box on the right, and frames with no box
    assert any(_has_colour(image, colour_for(0), slice(0, 92)) for image in shown)
    assert any(_has_colour(image, colour_for(1), slice(92, 184)) for image in shown)
    assert any(not _has_colour(image, colour_for(0), slice(None)) and not _has_colour(image, colour_for(1), slice(None))
               for image in shown)
    stages = report.metrics["stages"]
    assert stages["decode"]["count"] > 0 and stages["nms"]["count"] > 0 and stages["face"]["count"] == len(shown)


def test_cli_task_detect_with_a_real_bundle(bundle, tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, (left, right) in enumerate(SEQUENCE[::4]):
        cv2.imwrite(str(folder / f"{i:03d}.png"), scene(left, right, seed=i))
    out = io.StringIO()
    # each scene 1.2 s (12 frames at 10 fps): a consumer slowed by a loaded machine still sees it --agree times
    rc = main(["--task", "detect", "--bundle", str(bundle), "--fake", str(folder), "--fps", "10", "--hold", "6",
               "--agree", "2", "--min-confidence", "0.4", "--no-speech", "--json", str(tmp_path / "report.json")],
              out=out)
    text = out.getvalue()
    assert rc == 0, text
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["said"] == ["cat", "dog"]  # announced (shown only: --no-speech)
    assert "detector twobox-cpu:fp32" in text and "said (2): cat dog" in text
    assert "face:" in text and "frames with boxes shown" in text
    for stage in ("decode", "nms", "face"):
        assert any(line.startswith(stage) for line in text.splitlines()), stage


def test_a_detector_bundle_without_task_detect_is_one_line(bundle, tmp_path, capsys):
    folder = tmp_path / "frames"
    folder.mkdir()
    cv2.imwrite(str(folder / "0.png"), scene(True, False))
    rc = main(["--bundle", str(bundle), "--fake", str(folder)])
    err = capsys.readouterr().err
    assert rc == 2 and "is a detect model" in err and "--task detect" in err and "Traceback" not in err
    rc = main(["--task", "detect", "--bundle", str(bundle), "--fake", str(folder), "--truth", "t.csv"])
    assert rc == 2 and "--truth" in capsys.readouterr().err
