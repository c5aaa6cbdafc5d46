"""Recovery's attempts (edgekit/builders/int8/recovery.py), without a build: the calibration count the
calibration check recommended is tried first and its row says so, and one recovery path per
target kind: cpu and rpi keep layers in float, the Edge TPU only recalibrates (full integer),
jetson builds no int8 (n/a). The slow builds of each path: tests/builders/int8/test_recovery_builds.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.builders.int8 import recovery, recovery_table
from edgekit.builders.int8.stability import Gate, skip_reason, unstable_line
from edgekit.builders.sources.images import ImageSet
from edgekit.target import load_target


def _images(n: int) -> ImageSet:
    return ImageSet(None, np.arange(n), "sha", n, 0)


class _Log:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, line: str) -> None:
        self.lines.append(line)


def _ctx(held: int = 30, pool: int = 120, used: int = 60, evalset: bool = True, task: str = "detect",
         recover_16x8: bool = False):
    """A build's images as recovery reads them: ``held`` held back first, then the ``pool``, whose
    first ``used`` the converter calibrated on."""
    return SimpleNamespace(calib_all=_images(held + pool), calib=_images(pool), converter_calib=_images(used),
                           evalset=object() if evalset else None, task=task, log=_Log(),
                           request=SimpleNamespace(recover_16x8=recover_16x8),
                           options_for=lambda target: target.build_options({}))


def _first(recommended: int | None, recommendation: str = "--calib-steps 120"):
    record = {"checked": True, "stable": recommended is None, "recommendation": recommendation,
              **({"recommended_images": recommended} if recommended else {})}
    return SimpleNamespace(verification={"eval": {"passed": False}, "calibration_stability": record})


def test_the_recommended_count_is_tried_from_the_drawn_images_and_says_so():
    label, images = recovery.recommended_attempt(_ctx(used=60), _first(120))
    assert label == "calibration on 120 images (the count the calibration check recommended)"
    assert list(images.index) == list(range(120))
    # the converter saw the whole pool: the held-back images join in (an eval set is what the gate judges)
    label, images = recovery.recommended_attempt(_ctx(used=120), _first(240, "--calib-count 300 --calib-steps 240"))
    assert label == ("calibration on 150 images, 30 held-back among them (all there are of the 240 the calibration "
                     "check recommended)")
    assert len(images) == 150
    label, images = recovery.recommended_attempt(_ctx(used=100), _first(140))
    assert label.startswith("calibration on 140 images, 20 held-back among them (the count") and len(images) == 140
    assert list(images.index[:10]) == list(range(10, 20))  # the last of the held back, then the whole pool
    assert recovery.recommended_attempt(_ctx(), _first(None)) is None  # stable: nothing recommended
    # raw without --eval: the held-back images are what the gate judges, none more to calibrate on
    assert recovery.recommended_attempt(_ctx(used=120, evalset=False, task="raw"), _first(240)) is None


@pytest.mark.parametrize(("target", "float_layers"), [("cpu", True), ("rpi", True), ("edgetpu", False)])
def test_one_recovery_path_per_target_kind(monkeypatch, target, float_layers):
    monkeypatch.setattr(recovery, "worst_layers", lambda blob, ctx: [f"layer{i}" for i in range(12)])
    attempts = list(recovery._attempts(_ctx(), load_target(target), b"", _first(100)))
    labels = [a.label for a in attempts]
    # TensorFlow's wider ranges first (full integer, same images), then the recommended count
    assert labels[:2] == [recovery.LOGGED_RANGES_LABEL,
                          "calibration on 100 images (the count the calibration check recommended)"]
    assert attempts[0].quantiser == "logged" and attempts[0].denied is None
    floats = [a.label for a in attempts if a.denied or a.quantiser == "16x8"]
    assert floats == (["3 worst layers in float", "10 worst layers in float"] if float_layers else [])
    assert labels[-1] == "calibration on all 120 images"
    assert all(a.quantiser in ("int8", "logged") and not a.denied for a in attempts if a.label not in floats)
    # without a recommendation: the same, less that attempt
    plain = [a.label for a in recovery._attempts(_ctx(), load_target(target), b"", _first(None))]
    assert plain == [recovery.LOGGED_RANGES_LABEL, *floats, "calibration on all 120 images"]


@pytest.mark.parametrize("target", ["cpu", "rpi"])
def test_xnnpack_targets_skip_16x8_in_one_line_unless_asked(monkeypatch, target):
    """No XNNPACK kernel runs int16 activations (MediaPipe's palm detector 1514 ms in 16x8 against fp32's
    20.8 ms): on cpu and rpi the attempt is left out, said once with the flag that asks for it."""
    import dataclasses

    monkeypatch.setattr(recovery, "worst_layers", lambda blob, ctx: [f"layer{i}" for i in range(12)])
    ctx = _ctx()
    skipped = [a.quantiser for a in recovery._attempts(ctx, load_target(target), b"", _first(None))]
    assert "16x8" not in skipped and skipped.count("int8") == 3  # 3 and 10 layers in float, all images
    (line,) = [ln for ln in ctx.log.lines if "16x8" in ln]
    assert line == (f"[{target}] int8 recovery: 16x8 (int16 activations) not tried: XNNPACK has no kernel for it, "
                    "so it runs 18-73x slower than fp32 there (--recover-16x8 tries it anyway)")
    asked = _ctx(recover_16x8=True)
    labels = [a.label for a in recovery._attempts(asked, load_target(target), b"", _first(None))]
    assert recovery.SIXTEEN_BY_EIGHT_LABEL in labels and asked.log.lines == []
    plain_kernels = dataclasses.replace(load_target(target), runtime_options={"delegate": "none"})
    other = _ctx()
    labels = [a.label for a in recovery._attempts(other, plain_kernels, b"", _first(None))]
    assert labels[-2] == recovery.SIXTEEN_BY_EIGHT_LABEL and other.log.lines == []  # no XNNPACK: tried


def test_jetson_builds_no_int8_so_recovery_does_not_apply():
    from edgekit.builders import onnx

    jetson = load_target("jetson")
    assert jetson.builder == "edgekit.builders.onnx:build" and "int8" not in onnx.VARIANTS


def test_a_model_that_missed_another_figure_is_checked_whatever_its_ratio():
    far = Gate("mAP ratio", "--min-map-ratio", 0.99, 1.0)
    some = (np.arange(3), "disjoint")
    assert "above the gate" in skip_reason(far, some)
    assert skip_reason(Gate("mAP ratio", "--min-map-ratio", 0.99, 1.0, missed=True), some) is None
    record = {"figures": [0.98, 0.9995], "seeds": [0, 1], "images": [150, 150], "sample": "disjoint",
              "spread": 0.0195, "passed": [False, True], "recommendation": "--calib-steps 300"}
    line = unstable_line(record, Gate("top-1 ratio", "--min-accuracy-ratio", 0.99, 0.98), tried=True)
    assert line.endswith("(--calib-steps 300; recovery tries it next, within its time budget) and compare two "
                         "--seed builds")


def test_the_recovery_table_has_a_line_per_attempt_with_its_cost():
    rows = [{"label": "as built", "figure_name": "ratio", "figure": 0.9527, "p50_ms": 4.34, "tpu_ops": "227/263",
             "kept": False},
            {"label": "calibration on all 150 images", "figure_name": "ratio", "figure": 0.9432, "p50_ms": None,
             "tpu_ops": None, "kept": True}]
    lines = recovery_table.table_lines("edgetpu", rows)
    assert len(lines) == 3 and all(line.startswith("[edgetpu] int8 recovery: ") for line in lines)
    assert lines[0].split(": ", 1)[1].split() == ["attempt", "ratio", "p50", "ms", "TPU", "ops", "kept"]
    assert "0.9527" in lines[1] and "4.34" in lines[1] and "227/263" in lines[1] and not lines[1].endswith("yes")
    assert lines[2].rstrip().endswith("-  yes") and "0.9432" in lines[2]


# --- each row names the figure the gate failed on (builders/gate/figures.py) ----------------------

REQUEST = SimpleNamespace(min_accuracy_ratio=0.99, min_top1_agreement=0.97, min_map_ratio=0.99, max_map_gain=0.05,
                          min_detect_agreement=0.9, min_score_levels=20, min_score_cosine=0.95, min_cosine=0.98)


def _attempt(**results) -> SimpleNamespace:
    """An attempt's model as recovery reads it: its verification and conversion time."""
    return SimpleNamespace(verification=results, convert_seconds=1.0)


def _classified(agreement: float, ratio: float = 1.016) -> dict:
    """A labelled classifier's eval result, as builders/gate/verify.py classify_gate leaves it."""
    res = {"ratio": ratio, "original": 0.95, "converted": round(0.95 * ratio, 4), "agreement": agreement,
           "cosine": 0.99, "passed": agreement >= 0.97}
    if agreement < 0.97:
        res["gate_failures"] = {"--min-top1-agreement": f"top-1 the same as the original's on {agreement} ..."}
    return res


def test_a_classifier_row_names_the_top1_agreement_it_missed():
    rows = [recovery._row("as built", _attempt(eval=_classified(0.94)), {"p50_ms": 0.346}, "classify", REQUEST),
            recovery._row(recovery.LOGGED_RANGES_LABEL, _attempt(eval=_classified(0.9512, 1.0)), None, "classify",
                          REQUEST),
            recovery._row("3 worst layers in float", _attempt(eval=_classified(0.98, 1.0)), None, "classify", REQUEST)]
    first = rows[0]
    assert (first["figure_name"], first["figure"], first["passed"]) == ("top-1 ratio", 1.016, False)
    assert first["missed"] == [{"figure": "top-1 agreement", "value": 0.94, "limit": 0.97,
                                "flag": "--min-top1-agreement", "higher": True}]
    assert first["figures"] == {"top-1 ratio": 1.016, "top-1 agreement": 0.94}
    assert recovery_table.missed_text(first) == "missed (top-1 agreement 0.94 < 0.97)"
    rows[2]["kept"] = True
    header, *lines = recovery_table.table_lines("cpu", rows)
    assert "top-1 ratio  top-1 agreement  p50 ms" in header  # the header names the agreement
    assert "0.94 < 0.97" in lines[0] and "0.346" in lines[0] and "0.9512 <" in lines[1] and "0.98" in lines[2]
    assert lines[2].endswith("yes") and "<" not in lines[2]


def test_a_detector_without_eval_is_tabled_by_its_agreement():
    def holdout(agreement: float, cosine: float, levels: int = 40) -> dict:
        res = {"metric": "map_agreement", "agreement": 0.66, "cosine": cosine, "passed": agreement >= 0.9,
               "fidelity": {"detections": {"threshold": 0.5, "agreement": agreement, "matched": 40, "original": 45,
                                           "converted": 44},
                            "score_levels": {"original": 80, "converted": levels},
                            "score_cosine": {"output": "scores", "cosine": cosine}}}
        if agreement < 0.9:
            res["gate_failures"] = {"--min-detect-agreement": "detections ... agree ..."}
        if levels < 20:
            res["passed"] = False
            res.setdefault("gate_failures", {})["--min-score-levels"] = "levels ..."
        return res

    first = recovery._row("as built", _attempt(holdout=holdout(0.8989, 0.99)), None, "detect", REQUEST)
    better = recovery._row("x", _attempt(holdout=holdout(0.95, 0.97, levels=12)), None, "detect", REQUEST)
    assert (first["figure_name"], first["figure"]) == ("detection agreement", 0.8989)  # not the worst cosine
    assert recovery._figure(_attempt(holdout=holdout(0.95, 0.97)), "detect") == 0.95
    assert [m["figure"] for m in better["missed"]] == ["score levels"] and better["missed"][0]["limit"] == 20
    header, *lines = recovery_table.table_lines("cpu", [first, better])
    assert "detection agreement  score levels" in header
    assert "0.8989 < 0.9" in lines[0] and "40" in lines[0] and "0.95" in lines[1] and "12 < 20" in lines[1]


def test_other_gates_name_their_figures():
    gain = {"ratio": 1.07, "passed": False, "gate_failures": {"--max-map-gain": "..."}}
    assert recovery_table.missed_text(recovery._row("a", _attempt(eval=gain), None, "detect", REQUEST)) == \
        "missed (mAP gain 1.07 > 1.05)"
    raw = recovery._row("a", _attempt(holdout={"cosine": 0.97, "passed": False}), None, "raw", REQUEST)
    assert (raw["figure_name"], raw["missed"][0]["figure"], raw["missed"][0]["limit"]) == ("worst cosine",
                                                                                          "worst cosine", 0.98)
    assert "0.97 < 0.98" in recovery_table.table_lines("cpu", [raw])[1]
    px = {"landmark_error_px": {"mean": 1.3, "p95": 2.0}, "passed": False,
          "landmark_gate": {"max_mean_px": 0.96, "max_p95_px": 2.4, "min_presence_agreement": 0.97},
          "gate_failures": {"--max-landmark-error": "landmark error 1.3 px mean > 0.96 px"}}
    assert recovery_table.missed_text(recovery._row("a", _attempt(eval=px), None, "landmarks", REQUEST)) == \
        "missed (px mean 1.3 > 0.96)"
    iou = {"mask_iou": {"mean": 0.8, "p5": 0.75}, "passed": False,
           "mask_gate": {"min_mean_iou": 0.9, "min_p5_iou": 0.7},
           "gate_failures": {"--min-mask-iou": "mask IoU 0.800 mean < 0.9"}}
    row = recovery._row("a", _attempt(eval=iou), None, "segment", REQUEST)
    assert (row["figure_name"], recovery_table.missed_text(row)) == ("IoU mean", "missed (IoU mean 0.8 < 0.9)")
    other = {"depth_error": 0.8, "passed": False, "gate_failures": {"--max-depth-error": "depth error 0.8 > 0.5"}}
    row = recovery._row("a", _attempt(eval=other, holdout={"cosine": 0.99}), None, "depth", REQUEST)
    assert recovery_table.missed_text(row) == "missed (depth error 0.8 > 0.5)"  # an unknown gate: its line


def test_the_time_budget_is_three_first_attempts_at_least_30_s_unless_one_is_asked_for():
    ctx = _ctx()
    assert (recovery.time_budget(ctx, 5.0), recovery.time_budget(ctx, 40.0)) == (30.0, 120.0)
    ctx.request.recovery_budget = 600
    assert recovery.time_budget(ctx, 40.0) == 600.0
