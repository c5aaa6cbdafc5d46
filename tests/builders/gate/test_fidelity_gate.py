"""The detect gate beyond mAP (edgekit/builders/gate/fidelity.py): agreement at the bundle's
threshold, distinct score levels, the score output's cosine and a mAP gain past the noise margin
fail a converted detector, each failure one line naming its figure and flag. On arrays: no build.

The damaged case is the field's (BlazeFace): score logits spanning about [-266, 3] quantised
per tensor to int8 leave a handful of distinct scores. The passing case is the demo detector's
int8 as measured (models/detector.onnx, calib/detect, eval/detect, cpu): agreement 0.9654,
124 distinct scores (948 in float), output0 cosine 0.999915, mAP ratio 0.9911.
(Named ..._gate: tests/builders/gate/test_fidelity.py holds the warnings' tests under the bare name.)
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.builders.gate.fidelity import (
    FLAGS,
    FidelityGate,
    failures,
    figures,
    matched,
    score_levels,
    score_output,
    threshold_agreement,
)
from edgekit.detect.boxes import Detection, Detections


def _frame(*rows) -> Detections:
    """One image's detections from ``(class, score, x1, y1, x2, y2)`` rows."""
    return Detections(tuple(Detection(c, str(c), s, (x1, y1, x2, y2)) for c, s, x1, y1, x2, y2 in rows), (100, 100))


def _logit_case(quantised: bool) -> list[Detections]:
    """60 one-box images whose scores are sigmoid(logit), logits spread over [-266, 3]; ``quantised``:
    the logits through per-tensor asymmetric int8 first (scale 269/255), as the damaged int8 held them."""
    rng = np.random.default_rng(0)
    logits = np.concatenate([rng.uniform(-266, -20, 40), rng.uniform(-6, 3, 60)])
    if quantised:
        scale = (3 - -266) / 255
        zero = np.round(-128 - -266 / scale)
        logits = (np.clip(np.round(logits / scale + zero), -128, 127) - zero) * scale
    scores = 1 / (1 + np.exp(-logits))
    kept = scores[scores >= 0.001]  # as the mAP head keeps them (EVAL_OPTIONS)
    return [_frame((0, float(s), 10, 10, 50, 50)) for s in kept]


def test_per_tensor_int8_of_wide_logits_leaves_a_handful_of_scores_and_fails_the_gate():
    original, damaged = _logit_case(False), _logit_case(True)
    assert score_levels(original) >= 50 and score_levels(damaged) <= 10  # the field saw 5 from 0.0195
    fid = figures(original, damaged, 0.9, {"classificators": {"cosine": 0.915}}, "classificators")
    lines = failures(fid, {"ratio": 1.16, "original": 0.5, "converted": 0.58}, FidelityGate.of(None), 0.99)
    assert set(lines) == {"--min-score-levels", "--min-score-cosine", "--max-map-gain", "--min-detect-agreement"}
    assert fid["detections"]["agreement"] == 0.5333  # at 0.9 most of the original's detections are gone
    # at 0.5 the detections still agree (0.9434): the score levels are what fail there
    at_half = failures(figures(original, damaged, 0.5, None, None), {}, FidelityGate.of(None), 0.99)
    assert list(at_half) == ["--min-score-levels"]
    assert lines["--min-score-levels"].startswith(f"{score_levels(damaged)} distinct scores < 20 (the original has")
    assert lines["--min-score-cosine"] == "score output classificators cosine 0.915 < 0.95 (--min-score-cosine)"
    assert "ratio 1.16 > 1.05" in lines["--max-map-gain"] and lines["--max-map-gain"].endswith("(--max-map-gain 0.05)")
    assert lines["--min-detect-agreement"].endswith("< 0.9 (--min-detect-agreement)")
    for flag, line in lines.items():  # every line names the flag that governs it
        assert flag in line


def test_the_demo_detectors_int8_figures_pass_the_defaults():
    fid = {"detections": {"threshold": 0.25, "agreement": 0.9654, "matched": 404, "original": 417, "converted": 420},
           "score_levels": {"original": 948, "converted": 124},
           "score_cosine": {"output": "output0", "cosine": 0.999915}}
    assert failures(fid, {"ratio": 0.9911, "original": 0.3838, "converted": 0.3804}, FidelityGate.of(None), 0.99) == {}
    lines = failures(fid, {"ratio": 0.95, "original": 0.4, "converted": 0.38}, FidelityGate.of(None), 0.99)
    assert lines == {"--min-map-ratio": "mAP@[.5:.95] 0.3800 vs original 0.4000: ratio 0.95 < 0.99 (--min-map-ratio)"}
    off = FidelityGate(min_agreement=0, min_levels=0, min_score_cosine=0, max_gain=float("inf"))
    broken = {"detections": dict(fid["detections"], agreement=0.1), "score_levels": {"original": 948, "converted": 2},
              "score_cosine": {"output": "output0", "cosine": 0.2}}
    assert failures(broken, {"ratio": 3.0, "original": 0.1, "converted": 0.3}, off, 0.99) == {}  # 0 (inf) turns off


def test_agreement_is_taken_at_the_threshold_one_to_one_by_class_and_iou():
    ref = [_frame((0, 0.9, 0, 0, 10, 10), (1, 0.6, 20, 20, 30, 30), (0, 0.2, 50, 50, 60, 60))]
    same = [_frame((0, 0.8, 0, 0, 10, 10), (1, 0.55, 21, 21, 31, 31))]
    assert threshold_agreement(ref, same, 0.5) == {"threshold": 0.5, "agreement": 1.0, "matched": 2, "original": 2,
                                                   "converted": 2}
    swapped = [_frame((1, 0.8, 0, 0, 10, 10), (1, 0.55, 21, 21, 31, 31), (1, 0.7, 20, 20, 30, 30))]
    res = threshold_agreement(ref, swapped, 0.5)  # wrong class: unmatched; one box matches one reference only
    assert (res["matched"], res["original"], res["converted"], res["agreement"]) == (1, 2, 3, 0.4)
    assert threshold_agreement(ref, [_frame((0, 0.4, 0, 0, 10, 10))], 0.5)["agreement"] == 0.0  # under it: lost
    assert threshold_agreement([_frame()], [_frame()], 0.5) is None
    assert matched(ref[0].detections, ()) == 0


def test_agreement_on_a_handful_of_detections_is_reported_not_gated():
    from edgekit.builders.gate.fidelity import MIN_GATED_DETECTIONS, FidelityGate, failures

    def fidelity(original):
        return {"detections": {"threshold": 0.5, "agreement": 0.5, "matched": original // 2, "original": original,
                               "converted": original},
                "score_levels": {"original": 50, "converted": 50}, "score_cosine": {"output": "s", "cosine": 0.99}}

    # 2 of 4: one miss is noise
    assert failures(fidelity(MIN_GATED_DETECTIONS - 6), {}, FidelityGate.of(None), 0.99) == {}
    assert list(failures(fidelity(MIN_GATED_DETECTIONS), {}, FidelityGate.of(None), 0.99)) == ["--min-detect-agreement"]


def test_the_score_output_of_each_layout():
    assert score_output("yolo", (0,)) == 0 and score_output("ssd", (1, 0)) == 0 and score_output("ssd", (0, 1)) == 1
    assert score_output("postprocess", (3, 1, 0, 2)) == 0 and score_output("yolo", None) == 0


def test_detect_result_gates_the_eval_set_else_the_held_back_images():
    from edgekit.builders.gate import detect as detect_gate

    ref = [_frame((0, 0.9, 0, 0, 10, 10))] * 30
    mapped = {"map": 0.5, "map50": 0.8, "per_class": {}, "per_class50": {}}
    gate = SimpleNamespace(evaluation=object(), original_scores=lambda d: mapped, score=lambda d, f: mapped,
                           reference={"eval": ref, "holdout": ref}, layout="yolo", roles=(0,), output_names=["det"],
                           threshold=0.25)
    compared = {"outputs": {"det": {"cosine": 0.999}}}
    passing = detect_gate.detect_result(gate, "eval", ref, 0.99, compared)
    assert passing["passed"] and "gate_failures" not in passing
    assert passing["fidelity"]["score_cosine"] == {"output": "det", "cosine": 0.999}
    lost = [_frame()] * 30
    res = detect_gate.detect_result(gate, "eval", lost, 0.99, compared, SimpleNamespace(min_detect_agreement=0.5))
    assert not res["passed"] and list(res["gate_failures"]) == ["--min-detect-agreement", "--min-score-levels"]
    assert "< 0.5 (--min-detect-agreement)" in res["gate_failures"]["--min-detect-agreement"]
    held = detect_gate.detect_result(gate, "holdout", lost, 0.99, compared)  # beside an eval set: reported
    assert "passed" not in held and held["fidelity"]["detections"]["agreement"] == 0.0
    gate.evaluation = None  # no eval set: the held-back images are what the gate judges, on fidelity alone
    held = detect_gate.detect_result(gate, "holdout", lost, 0.99, compared)
    assert not held["passed"] and list(held["gate_failures"]) == ["--min-detect-agreement", "--min-score-levels"]
    assert detect_gate.detect_result(gate, "holdout", ref, 0.99, compared)["passed"]


def test_the_reason_and_the_fix_name_the_failed_figures_flags():
    from edgekit.builders.contract import TargetBuild
    from edgekit.builders.outcome import failed_flags, gate_fix
    from edgekit.builders.publish import _why

    res = {"ratio": 1.16, "converted": 0.58, "original": 0.5,
           "gate_failures": {"--min-score-levels": "5 distinct scores < 20 (the original has 900; ...)",
                             "--max-map-gain": "mAP@[.5:.95] ratio 1.16 > 1.05: ... (--max-map-gain 0.05)"}}
    ctx = SimpleNamespace(task="detect", min_ratio=0.99)
    assert _why("int8", res, ctx, False) == "int8 " + "; ".join(res["gate_failures"].values())
    manifest = {"task": "detect", "verification": {"gated": True, "models": {"fp32": {"eval": {"passed": True}}},
                                                   "rejected": {"int8": {"verification": {"eval": res}}}}}
    result = TargetBuild("cpu", None, False, 1.0, manifest, "why", ("int8",))
    assert failed_flags(result) == ["--min-score-levels", "--max-map-gain"]
    fix = gate_fix([result])
    assert "lower --min-score-levels" in fix and "raise --max-map-gain" in fix and "--min-map-ratio" not in fix
    plain = TargetBuild("cpu", None, False, 1.0, {"task": "detect", "verification": {"gated": True}}, "why", ("int8",))
    assert failed_flags(plain) == ["--min-map-ratio"]


def test_thresholds_are_checked_when_the_request_is_made_and_agree_everywhere():
    from edgekit.builders.build import build
    from edgekit.builders.request import BuildRequest
    from edgekit.cli import build_parser
    from edgekit.errors import UsageError

    for bad in ({"min_detect_agreement": 1.5}, {"min_score_cosine": float("nan")}, {"min_score_levels": -1},
                {"min_score_levels": 2.5}, {"max_map_gain": -0.1}, {"min_top1_agreement": 2.0}):
        with pytest.raises(UsageError) as err:
            BuildRequest(model="m", targets="cpu", calib="c", **bad)
        assert err.value.message.startswith("--")
    default, request = FidelityGate.of(None), BuildRequest(model="m", targets="cpu", calib="c")
    assert FidelityGate.of(request) == default == FidelityGate(0.9, 20, 0.95, 0.05)
    args = build_parser().parse_args(["build", "--model", "m", "--target", "cpu", "--calib", "c",
                                      "--min-score-levels", "7", "--max-map-gain", "0.2"])
    from edgekit.builders.request import given

    # the flags come from the one declaration: an unset flag is left out (the request's default holds)
    assert given(args) == {"min_score_levels": 7, "max_map_gain": 0.2}
    assert FidelityGate.of(BuildRequest(model="m", targets="cpu", calib="c", **given(args))) == \
        FidelityGate(0.9, 7, 0.95, 0.2)
    for field, flag in (("min_detect_agreement", "agreement"), ("min_score_levels", "score_levels"),
                        ("min_score_cosine", "score_cosine"), ("max_map_gain", "gain")):
        assert FLAGS[flag] == "--" + field.replace("_", "-")
    assert request.min_top1_agreement == 0.97
    with pytest.raises(UsageError, match="unknown setting 'min_detect_agreemnt'.*did you mean 'min_detect_agreement'"):
        build("m", "cpu", "c", min_detect_agreemnt=0.5)


def _wide_logit_detector(root):
    """An SSD stand-in with BlazeFace's trap, saved under ``root``: one class, 16 anchors on a 4x4
    grid of a 64x64 input, score logit = 269 x (a cell's mean red) - 266, so the logits span
    [-266, 3], regressors 0 (each box is its anchor); frames of dark noise with three cells of
    dithered red 242-255 each (logits about -11 to 3: continuous scores), COCO annotations."""
    import json

    import cv2
    import keras
    from keras import layers

    inp = keras.Input((64, 64, 3))
    pooled = layers.AveragePooling2D(16)(inp)
    conv, dense = layers.Conv2D(1, 1), layers.Dense(64)
    model = keras.Model(inp, [layers.Reshape((16, 4), name="regressors")(dense(layers.Flatten()(pooled))),
                              layers.Reshape((16, 1), name="classificators")(conv(pooled))])
    conv.set_weights([np.array([269, 0, 0], np.float32).reshape(1, 1, 3, 1), np.array([-266], np.float32)])
    dense.set_weights([np.zeros((48, 64), np.float32), np.zeros(64, np.float32)])
    model.save(root / "wide.keras")
    (root / "wide.labels.txt").write_text("red\n")
    rng = np.random.default_rng(1)
    for name, n in (("calib", 40), ("eval", 30)):
        (root / name / "images").mkdir(parents=True)
        images, anns = [], []
        for i in range(n):
            img = rng.integers(0, 160, (96, 128, 3), dtype=np.uint8)
            for cell in rng.choice(16, size=3, replace=False):
                x, y = int(cell) % 4 * 32, int(cell) // 4 * 24
                img[y : y + 24, x : x + 32] = 0
                img[y : y + 24, x : x + 32, 2] = np.floor(rng.uniform(242, 254.9) + rng.random((24, 32)))
                anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": 1, "bbox": [x, y, 32, 24],
                             "area": 768, "iscrowd": 0})
            cv2.imwrite(str(root / name / "images" / f"{i:03d}.png"), img)
            images.append({"id": i + 1, "file_name": f"{i:03d}.png", "width": 128, "height": 96})
        (root / name / "annotations.json").write_text(json.dumps(
            {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "red"}]}))
    return [[(r + 0.5) / 4, (c + 0.5) / 4, 0.25, 0.25] for r in range(4) for c in range(4)]


@pytest.mark.slow
def test_a_wide_logit_int8_fails_on_its_score_levels_in_a_build(tmp_path):
    """Measured once by hand with fp32 too: float 80 distinct scores on the eval set, int8 10 and
    mAP ratio 1.0133 (up), agreement 1.0, classificators cosine 0.999997: only the levels catch it."""
    from edgekit.builders.build import build
    from edgekit.errors import VerificationFailed

    anchors = _wide_logit_detector(tmp_path)
    with pytest.raises(VerificationFailed) as failed:
        build(tmp_path / "wide.keras", ["cpu"], [tmp_path / "calib" / "images"], out=tmp_path / "dist",
              eval_dir=tmp_path / "eval", quiet=True, task="detect", variants=["int8"], recover=False,
              preprocess={"colour": "rgb", "mean": [0.0], "std": [255.0], "resize": "stretch"},
              task_options={"layout": "ssd", "anchors": anchors})
    [r] = failed.value.results
    ev = r.manifest["verification"]["models"]["int8"]["eval"]
    assert ev["fidelity"]["score_levels"]["converted"] <= 12 < 40 <= ev["fidelity"]["score_levels"]["original"]
    assert list(ev["gate_failures"]) == ["--min-score-levels"] and ev["ratio"] >= 0.99  # mAP alone says PASS
    assert "distinct scores < 20" in r.error and "--min-score-levels 20" in r.error
    assert "lower --min-score-levels" in failed.value.hint


@pytest.mark.slow
def test_without_eval_a_detector_is_held_to_the_originals_detections_on_the_held_back_images(tmp_path):
    """No --eval, so no mAP: the same damaged int8 fails on its held-back images' score levels; the
    fp32 beside it passes (its detections are the original's)."""
    from edgekit.builders.build import build
    from edgekit.errors import VerificationFailed

    anchors = _wide_logit_detector(tmp_path)
    with pytest.raises(VerificationFailed) as failed:
        build(tmp_path / "wide.keras", ["cpu"], [tmp_path / "calib" / "images"], out=tmp_path / "dist",
              quiet=True, task="detect", variants=["fp32", "int8"], recover=False,
              preprocess={"colour": "rgb", "mean": [0.0], "std": [255.0], "resize": "stretch"},
              task_options={"layout": "ssd", "anchors": anchors})
    [r] = failed.value.results
    assert r.partial and r.rejected == ("int8",) and r.manifest["verification"]["gated"]
    held = r.manifest["verification"]["models"]["fp32"]["holdout"]
    assert held["passed"] and held["fidelity"]["detections"]["agreement"] == 1.0
    assert "distinct scores <" in r.error and "--min-score-levels" in r.error
