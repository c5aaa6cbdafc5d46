"""A cascade of two real models through the command line and the benchmark: the tiny ONNX detector of
tests/helpers (a cat on a bright left half, a dog on a bright right half) feeding a real ONNX classifier
that names each region's strongest colour, run by ONNX Runtime."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from tests.helpers.detector_model import FRAME_H, FRAME_W, detector_bundle
from tests.helpers.faults import assert_refused, edgekit
from tests.helpers.real_models import channel_share_onnx

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cascade")
    bundle = detector_bundle(root / "twobox-cpu")
    colour = channel_share_onnx(root / "colour.onnx", (1, 16, 16, 3))
    (root / "colour.txt").write_text("red\ngreen\nblue\n")
    frames = root / "frames"
    frames.mkdir()
    red, blue = (60, 60, 250), (250, 60, 60)  # BGR
    for name, (left, right) in {"a.png": (red, blue), "b.png": (blue, red)}.items():
        frame = np.zeros((FRAME_H, FRAME_W, 3), np.uint8)
        frame[:, : FRAME_W // 2], frame[:, FRAME_W // 2:] = left, right
        cv2.imwrite(str(frames / name), frame)
    return bundle, colour, root / "colour.txt", frames


def test_run_then_gives_each_detection_its_sub_label(models, capsys):
    bundle, colour, labels, frames = models
    out = edgekit(capsys, "run", bundle, "--then", colour, "--then-task", "classify", "--then-labels", labels,
                  "--camera", f"folder:{frames}", "--json", "--warmup", "0")
    assert out.code == 0, out.err
    lines = [json.loads(x) for x in out.out.splitlines() if x.startswith('{"frame"')]
    seen = [{d["label"]: d["sub_label"] for d in line["detections"]} for line in lines]
    assert seen == [{"cat": "red", "dog": "blue"}, {"cat": "blue", "dog": "red"}]
    assert all("region" in d and d["sub_label_score"] > 0.6 for line in lines for d in line["detections"])
    assert {"second_stage", "second_stage@k=2", "second_inference"} <= set(lines[0]["ms"])


def test_bench_then_times_the_second_stage_of_every_variant(models):
    from edgekit.bench.runner import BenchConfig, run_bench

    bundle, colour, labels, _frames = models
    config = BenchConfig(min_duration_s=0.0, min_count=5, repeats=1, warmup=1, frames=4, then=str(colour),
                         then_options={"task": "classify", "labels": str(labels)})
    report = run_bench([str(bundle)], config)
    samples = report.variants[0].runs[0].samples_ms
    assert len(samples["second_stage"]) >= 5 and len(samples["second_inference"]) >= 5


def test_then_after_a_classifier_and_roi_without_then_are_refused(models, capsys):
    bundle, colour, labels, frames = models
    assert_refused(edgekit(capsys, "run", colour, "--then", colour, "--camera", f"folder:{frames}"),
                   "--then needs a detector first")
    assert_refused(edgekit(capsys, "run", bundle, "--roi", "{}", "--camera", f"folder:{frames}"),
                   "--roi without --then")
    assert_refused(edgekit(capsys, "run", bundle, "--then", colour, "--roi", '{"scale": 2}',
                           "--camera", f"folder:{frames}"), "--roi has no option 'scale'")
