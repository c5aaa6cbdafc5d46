"""The cascade gate (``edgekit bench DET --then SECOND --eval DIR``, issue 35) on real ONNX models: the
tiny two-box detector of tests/helpers (a cat on a bright left half, a dog on a bright right half)
feeding a colour classifier (each region's strongest channel) or a constant landmark model, each as a
two-variant bundle whose second variant is the same model (no loss) or a different one (a loss whose
size the test knows)."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from edgekit.bundle import BundleWriter
from edgekit.imaging.image import InputSpec
from tests.helpers.detector_model import FRAME_H, FRAME_W, LABELS, SPEC, onnx_detector
from tests.helpers.faults import assert_refused, edgekit
from tests.helpers.real_models import channel_share_onnx, mean_linear_onnx

pytest.importorskip("onnxruntime")

COLOUR = InputSpec(shape=(1, 16, 16, 3), layout="NHWC", colour="rgb")
POINTS = [4.0, 4.0, 0.0, 12.0, 8.0, 0.0]  # two landmarks (x, y, z) in 16x16 input pixels
SHIFT = 2.0  # the second landmark variant's points, this many input pixels right: 2/16 box widths


def _bundle(dest, name, task, variants, labels=None, task_options=None):
    """A hand-written bundle (as edgekit build writes one) of ``variants``: ``{name: (model file, InputSpec,
    output shape)}``, the first the default."""
    with BundleWriter(dest) as w:
        models = []
        for variant, (path, spec, shape) in variants.items():
            (w.dir / f"{variant}.onnx").write_bytes(path.read_bytes())
            models.append({"name": variant, "file": f"{variant}.onnx", "format": "onnx", "precision": "fp32",
                           "input": spec.to_dict(), "outputs": [{"shape": list(shape), "dtype": "float32"}],
                           "task_options": dict(task_options or {})})
        manifest = {"name": name, "target": "cpu", "task": task, "default_model": next(iter(variants)),
                    "models": models,
                    "runtime": {"adapter": "edgekit.runtime.onnxrt:OnnxRuntime", "options": {"providers": ["cpu"]}}}
        if labels:
            (w.dir / "labels.txt").write_text("\n".join(labels) + "\n")
            manifest["labels"] = "labels.txt"
        w.commit(manifest)
    return dest


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cascade_eval")
    det = onnx_detector(root / "det.onnx")
    detector = _bundle(root / "twobox-cpu", "twobox", "detect",
                       {v: (det, SPEC, (1, 6, 2)) for v in ("fp32", "int8")}, LABELS,
                       {"layout": "yolo", "score_threshold": 0.3})
    colour = channel_share_onnx(root / "colour.onnx", COLOUR.shape)
    same = _bundle(root / "colour-cpu", "colour", "classify",
                   {v: (colour, COLOUR, (1, 3)) for v in ("fp32", "int8")}, ["red", "green", "blue"])
    bgr = InputSpec(**{**COLOUR.__dict__, "colour": "bgr"})  # red and blue swapped: every sub-label wrong
    swapped = _bundle(root / "swapped-cpu", "swapped", "classify",
                      {"fp32": (colour, COLOUR, (1, 3)), "int8": (colour, bgr, (1, 3))}, ["red", "green", "blue"])
    lm_options = {"landmarks": {"num_landmarks": 2, "input_image_width": 16, "input_image_height": 16}}
    points = mean_linear_onnx(root / "points.onnx", COLOUR.shape, [0.0] * 6, POINTS, softmax=False)
    moved = [v + SHIFT * (i % 3 == 0) for i, v in enumerate(POINTS)]
    shifted = mean_linear_onnx(root / "shifted.onnx", COLOUR.shape, [0.0] * 6, moved, softmax=False)
    landmarks = _bundle(root / "points-cpu", "points", "landmarks",
                        {"fp32": (points, COLOUR, (1, 6)), "int8": (shifted, COLOUR, (1, 6))},
                        task_options=lm_options)
    frames = root / "frames" / "nested"
    frames.mkdir(parents=True)
    red, blue = (60, 60, 250), (250, 60, 60)  # BGR
    for name, (left, right) in {"a.png": (red, blue), "b.png": (blue, red)}.items():
        frame = np.zeros((FRAME_H, FRAME_W, 3), np.uint8)
        frame[:, : FRAME_W // 2], frame[:, FRAME_W // 2:] = left, right
        cv2.imwrite(str(frames / name), frame)
    return {"detector": detector, "same": same, "swapped": swapped, "landmarks": landmarks,
            "frames": frames.parent, "root": root}


def _eval(models, second, **kwargs):
    from edgekit.bench.cascade_eval import evaluate_cascade

    return evaluate_cascade(str(models["detector"]), str(models[second]), models["frames"], "all",
                            detector_options={"num_threads": 1}, **kwargs)


def test_identical_pairs_agree_fully(models):
    result = _eval(models, "same")
    assert [p.name for p in result.pairs] == ["fp32 x fp32", "fp32 x int8", "int8 x fp32", "int8 x int8"]
    assert result.reference == "fp32 x fp32" and result.images == 2 and not result.failed
    for p in result.pairs:
        assert (p.detection_agreement, p.sub_label_agreement, p.matched, p.reference_detections) == (1.0, 1.0, 4, 4)
    assert result.pairs[-1].verdict.endswith("no stage loses)")
    lm = _eval_landmarks_same(models)
    assert all(p.landmark_p90 == 0.0 and p.presence_agreement == 1.0 for p in lm.pairs)


def _eval_landmarks_same(models):
    """The landmark bundle's fp32 against itself: every pair fp32 x fp32."""
    from edgekit.bench.cascade_eval import evaluate_cascade

    return evaluate_cascade(str(models["detector"]), f"{models['landmarks']}:fp32", models["frames"], "all")


def test_a_different_second_model_lowers_sub_label_agreement_and_is_named(models):
    result = _eval(models, "swapped")
    by_name = {p.name: p for p in result.pairs}
    assert by_name["int8 x fp32"].sub_label_agreement == 1.0  # the detector variant alone loses nothing
    worst = by_name["int8 x int8"]
    assert worst.sub_label_agreement == 0.0 and worst.detection_agreement == 1.0 and not worst.passed
    assert "the classifier loses" in worst.verdict and "sub-labels agree 0.0% < 95%" in worst.verdict
    assert {p.name for p in result.failed} == {"fp32 x int8", "int8 x int8"}


def test_landmark_error_in_box_widths_and_the_gate_exit_code(models, capsys):
    argv = ["bench", models["detector"], "--then", models["landmarks"], "--variants", "all",
            "--eval", models["frames"], "--threads", "1"]
    out = edgekit(capsys, *argv, "--json")
    assert out.code == 3, out.text
    report = json.loads(out.out)["cascade"]
    pairs = {p["pair"]: p for p in report["pairs"]}
    assert pairs["fp32 x int8"]["landmark_p90"] == pytest.approx(SHIFT / 16, abs=1e-4)  # the box is the region
    assert pairs["int8 x fp32"]["landmark_p90"] == 0.0 and report["passed"] is False
    assert "the landmark model loses" in pairs["int8 x int8"]["verdict"]
    assert "cascade gate: fp32 x int8: landmarks 0.125 box widths p90 > 0.05" in out.err
    loose = edgekit(capsys, *argv, "--max-cascade-error", "0.2")
    assert loose.code == 0, loose.text
    assert "reference pair: fp32 x fp32" in loose.out and "int8 x int8" in loose.out


def test_refusals_are_one_line_exit_2(models, capsys):
    frames, root = models["frames"], models["root"]
    assert_refused(edgekit(capsys, "bench", models["same"], "--then", models["same"], "--eval", frames),
                   "--then needs a detector first")
    empty = root / "empty"
    empty.mkdir()
    assert_refused(edgekit(capsys, "bench", models["detector"], "--then", models["same"], "--eval", empty),
                   "holds no images")
    broken = root / "broken"
    broken.mkdir()
    (broken / "x.png").write_bytes(b"not a png")
    assert_refused(edgekit(capsys, "bench", models["detector"], "--then", models["same"], "--eval", broken),
                   "unreadable image", "x.png")
