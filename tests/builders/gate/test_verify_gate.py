"""The accuracy gate: every variant of a bundle must reach --min-accuracy-ratio, at the boundary too.

The end-to-end tests build the demo model for real (TensorFlow's converter, LiteRT verification);
a non-default variant is broken for real by calibrating int8 on black images only, so its scores
collapse while the fp32 default keeps the original's top-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from edgekit.builders.build import build
from edgekit.builders.publish import verification_summary
from edgekit.errors import VerificationFailed
from tests.conftest import CALIB, DEMO_MODEL, EVAL

# --- verification_summary: the manifest's gate over every variant (no TensorFlow) --------------------


@dataclass
class _Images:
    images: list
    sha256: str = "e" * 64

    def __len__(self) -> int:
        return len(self.images)


@dataclass
class _Request:
    min_cosine: float = 0.98


@dataclass
class _Ctx:
    """What verification_summary reads from a BuildContext (its contract, nothing more)."""

    evalset: _Images | None = field(default_factory=lambda: _Images(["a.png", "b.png"]))
    holdout: _Images = field(default_factory=lambda: _Images(["h.png"]))
    task: str = "classify"
    min_ratio: float = 0.99
    request: _Request = field(default_factory=_Request)
    detect: object = None  # a detector's gate: its layout


def _res(ratio, passed, **more):
    return {"eval": {"ratio": ratio, "original": 0.9, "converted": round(0.9 * ratio, 4) if ratio else 0.0,
                     "passed": passed, **more}}


def test_a_failing_non_default_variant_fails_the_gate():
    per_variant = {"fp32": _res(1.0, True), "fp16": _res(1.0, True), "int8": _res(0.9, False)}
    s = verification_summary(per_variant, "fp32", _Ctx())
    assert s["passed"] is False and s["reason"] == "int8 ratio 0.9 < 0.99"
    assert s["ratio"] == 1.0 and s["gated"] is True  # the headline numbers stay the default's
    s = verification_summary({"fp32": _res(0.5, False), "int8": _res(1.0, True)}, "int8", _Ctx())
    assert s["passed"] is False and s["reason"] == "fp32 ratio 0.5 < 0.99" and s["ratio"] == 1.0
    s = verification_summary({"fp32": _res(0.5, False), "int8": _res(0.9, False)}, "fp32", _Ctx())
    assert s["reason"] == "fp32 ratio 0.5 < 0.99; int8 ratio 0.9 < 0.99"


def test_every_variant_passing_passes_and_the_summary_names_the_data():
    s = verification_summary({"fp32": _res(1.0, True), "int8": _res(0.995, True)}, "int8", _Ctx())
    assert (s["passed"], s["reason"], s["ratio"], s["metric"]) == (True, None, 0.995, "top1")
    assert s["dataset"] == {"eval_images": 2, "eval_sha256": "e" * 64, "heldback_images": 1}
    assert s["min_ratio"] == 0.99 and "min_cosine" not in s


def test_zero_scoring_original_is_named_not_divided():
    s = verification_summary({"fp32": {"eval": {"ratio": None, "passed": False}}}, "fp32", _Ctx())
    assert s["reason"] == "fp32: the original model scores 0 on the eval set (wrong labels or preprocessing?)"


def test_without_eval_the_held_back_agreement_is_reported_not_gated():
    per_variant = {"fp32": {"holdout": {"agreement": 0.5}}, "int8": {"holdout": {"agreement": 0.1}}}
    s = verification_summary(per_variant, "fp32", _Ctx(evalset=None))
    assert (s["passed"], s["gated"], s["metric"], s["agreement"]) == (True, False, "top1_agreement_heldback", 0.5)
    assert s["dataset"]["eval_images"] == 0 and "not gated" in s["note"]


def test_without_eval_only_a_broken_conversion_fails_a_classifier():
    ctx = _Ctx(evalset=None, task="classify", detect=None)
    sound = {"holdout": {"agreement": 0.7, "cosine": 0.93, "worst_output": "scores", "n": 12}}
    broken = {"holdout": {"agreement": 0.0, "cosine": 0.12, "worst_output": "scores", "n": 12}}
    s = verification_summary({"fp32": sound, "int8": sound}, "fp32", ctx)
    assert s["passed"] is True and s["gated"] is False and "cosine >= 0.5" in s["note"]
    s = verification_summary({"fp32": sound, "int8": broken}, "fp32", ctx)
    assert s["passed"] is False and s["gated"] is False
    assert s["reason"] == ("int8 output scores cosine 0.12 on 12 held-back images < 0.5: the conversion broke "
                           "the model (no --eval: only this is gated)")
    nothing = verification_summary({"fp32": {"holdout": {"cosine": None}}}, "fp32", ctx)
    assert nothing["passed"] is True  # no held-back images: nothing to judge on


def test_raw_task_gates_every_variant_on_cosine_even_without_eval():
    ctx = _Ctx(evalset=None, task="raw")
    bad = {"holdout": {"cosine": 0.5, "worst_output": "boxes", "passed": False}}
    s = verification_summary({"fp32": {"holdout": {"cosine": 1.0, "passed": True}}, "int8": bad}, "fp32", ctx)
    assert s["gated"] and s["passed"] is False and s["metric"] == "cosine_worst_output"
    assert s["reason"] == "int8 output boxes cosine 0.5 < 0.98" and s["min_cosine"] == 0.98
    s = verification_summary({"fp32": {}}, "fp32", _Ctx(evalset=None, holdout=_Images([]), task="raw"))
    assert s["gated"] is False and s["passed"] is True  # nothing to measure on


def test_the_headline_numbers_are_the_default_variants_and_every_variant_is_kept():
    fields = {"original": 0.9, "converted": 0.89, "ratio": 0.9889, "agreement": 0.97, "sqnr_db": 31.5,
              "max_abs_diff": 0.12, "cosine": 0.999, "worst_output": "scores", "passed": False}
    per_variant = {"fp32": _res(1.0, True), "int8": {"eval": fields}}
    s = verification_summary(per_variant, "int8", _Ctx())
    assert {k: s[k] for k in fields if k != "passed"} == {k: v for k, v in fields.items() if k != "passed"}
    assert s["models"] is per_variant and s["passed"] is False


def test_a_variant_that_was_never_measured_fails_the_gate():
    s = verification_summary({"fp32": _res(1.0, True), "int8": {}}, "fp32", _Ctx())
    assert s["passed"] is False and s["reason"].startswith("int8: the original model scores 0")


def test_an_ungated_summary_has_no_reason():
    s = verification_summary({"fp32": {}}, "fp32", _Ctx(evalset=None))
    assert s["reason"] is None and s["note"] == ("no --eval: agreement on held-back calibration images, not gated, "
                                                 "beyond cosine >= 0.5")


@dataclass
class _Layout:
    layout: str = "yolo"


def _map_res(ratio, passed, original=0.4):
    return {"eval": {"ratio": ratio, "original": original, "converted": round(original * (ratio or 0), 4),
                     "map50": 0.6, "per_class": {"star": 0.5}, "passed": passed}}


def test_a_detector_summary_carries_map50_per_class_and_the_layout():
    ctx = _Ctx(task="detect", detect=_Layout("yolo"))
    s = verification_summary({"fp32": _map_res(1.0, True), "int8": _map_res(0.995, True)}, "int8", ctx)
    assert (s["metric"], s["passed"], s["ratio"], s["map50"], s["layout"]) == ("map", True, 0.995, 0.6, "yolo")
    assert s["per_class"] == {"star": 0.5}
    classify = verification_summary({"fp32": _res(1.0, True)}, "fp32", _Ctx())
    assert not {"map50", "per_class", "layout"} & set(classify)  # a classifier's summary has none of them


def test_a_detector_missing_the_map_gate_says_both_maps_and_the_ratio():
    ctx = _Ctx(task="detect", detect=_Layout())
    s = verification_summary({"fp32": _map_res(1.0, True), "int8": _map_res(0.95, False)}, "fp32", ctx)
    assert s["passed"] is False
    assert s["reason"] == "int8 mAP@[.5:.95] 0.3800 vs original 0.4000: ratio 0.95 < 0.99"
    s = verification_summary({"fp32": {"eval": {"ratio": None, "passed": False}}}, "fp32", ctx)
    assert s["reason"] == ("fp32: the original model scores mAP 0 on the eval set "
                           "(wrong labels, preprocessing or detect layout?)")


def test_a_detector_without_eval_is_gated_on_its_held_back_fidelity():
    ctx = _Ctx(evalset=None, task="detect", detect=_Layout())
    s = verification_summary({"fp32": {"holdout": {"agreement": 0.9, "passed": True}}}, "fp32", ctx)
    assert (s["metric"], s["gated"], s["passed"]) == ("map_agreement_heldback", True, True)
    assert s["note"].startswith("no --eval: each model's detections on the held-back calibration images held to "
                                "the original's")
    why = "5 distinct scores < 20 (the original has 60; --min-score-levels 20)"
    lost = {"agreement": 0.4, "passed": False, "gate_failures": {"--min-score-levels": why}}
    s = verification_summary({"fp32": {"holdout": {"agreement": 1.0, "passed": True}}, "int8": {"holdout": lost}},
                             "fp32", ctx)
    assert s["passed"] is False and s["reason"] == f"int8 {why}"


# --- the real build ---------------------------------------------------------------------------------


@pytest.mark.slow  # one TFLite conversion + verification, ~4 s on 2 cores
def test_a_ratio_exactly_at_the_minimum_passes(tmp_path):
    """fp32 TFLite reproduces the Keras top-1 exactly (ratio 1.0): --min-accuracy-ratio 1.0 must pass."""
    [r] = build(DEMO_MODEL, ["cpu"], [CALIB], out=tmp_path, eval_dir=EVAL, quiet=True, variants=["fp32"],
                min_accuracy_ratio=1.0)
    v = r.manifest["verification"]
    assert r.passed and v["ratio"] == 1.0 and v["passed"] is True and v["models"]["fp32"]["eval"]["passed"]
    assert (r.bundle / "edgekit.json").is_file()


@pytest.mark.slow  # two conversions (fp32, int8) + verification, ~7 s on 2 cores
def test_a_broken_non_default_variant_fails_the_build_but_the_default_is_written(tmp_path):
    """int8 calibrated on black images only scores ~10 % while the fp32 default keeps 100 % of the
    original: fp32 is published without int8, int8 is kept as .rejected, and the build still fails."""
    import cv2

    from edgekit.bundle import load_bundle

    black = tmp_path / "black"
    black.mkdir()
    for i in range(4):
        cv2.imwrite(str(black / f"{i}.png"), np.zeros((32, 32), np.uint8))
    gate_line = r"cpu: int8 top-1 [\d.]+ vs original [\d.]+: ratio 0\.\d+ < 0\.5"
    with pytest.raises(VerificationFailed, match=gate_line) as err:
        build(DEMO_MODEL, ["cpu"], [black], out=tmp_path / "dist", eval_dir=EVAL, quiet=True,
              variants=["fp32", "int8"], min_accuracy_ratio=0.5)
    [r] = err.value.results
    assert r.partial and r.passed is False and r.rejected == ("int8",) and r.bundle == tmp_path / "dist" / "demo-cpu"
    published = load_bundle(r.bundle)  # it loads as any passing bundle: every model in it passed
    assert [m.name for m in published.models] == ["fp32"] and published.manifest["default_model"] == "fp32"
    v = published.manifest["verification"]
    assert v["passed"] is True and v["ratio"] == 1.0 and list(v["models"]) == ["fp32"]
    assert v["rejected"]["int8"]["kept_in"] == "demo-cpu.rejected" and v["rejected"]["int8"]["reason"] == r.error
    evidence = load_bundle(tmp_path / "dist" / "demo-cpu.rejected", allow_rejected=True)  # hashes checked
    assert [m.name for m in evidence.models] == ["int8"] and evidence.manifest["default_model"] == "int8"
    v = evidence.manifest["verification"]
    assert v["passed"] is False and v["models"]["fp32"]["eval"]["passed"] is True  # every variant's numbers
    assert v["models"]["int8"]["eval"]["passed"] is False and v["published"] == {"bundle": "demo-cpu",
                                                                                 "models": ["fp32"]}
