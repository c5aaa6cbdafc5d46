"""Every gate's boundary, pinned without a build (issue 37): a figure equal to its limit passes and one a
hair on the wrong side fails, for the top-1 ratio and agreement, the mAP ratio, the detection agreement,
the score cosine, the mAP gain and the raw task's cosine (the mask IoU and landmark px limits are pinned in
test_segment.py and test_landmarks.py). A ``>=`` turned ``>``, or a detect gate that passes whatever its
ratio, fails one of these fast tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgekit.builders.gate.detect import detect_result
from edgekit.builders.gate.fidelity import MIN_GATED_DETECTIONS, FidelityGate, failures
from edgekit.builders.gate.verify import ACCURATE_ORIGINAL, Comparison, classify_gate

HAIR = 1e-9
LIMIT = 0.99


@pytest.mark.parametrize(("ratio", "passed"), [(LIMIT, True), (LIMIT - HAIR, False), (1.3, True), (None, False)])
def test_top1_ratio_at_its_limit_passes_and_a_hair_under_fails(ratio, passed):
    res = {"ratio": ratio, "original": 0.5, "converted": 0.5, "agreement": 0.1}  # an inaccurate original: ratio only
    assert classify_gate(res, LIMIT, 0.97)["passed"] is passed


@pytest.mark.parametrize(("original", "agreement", "passed"), [
    (0.95, 0.97, True), (0.95, 0.97 - HAIR, False),  # an accurate original: its agreement is held to the limit
    (ACCURATE_ORIGINAL, 0.5, False),  # accurate from ACCURATE_ORIGINAL on, inclusive
    (ACCURATE_ORIGINAL - HAIR, 0.5, True),  # under it, the original's own errors make disagreement expected
])
def test_top1_agreement_at_its_limit_passes_and_a_hair_under_fails(original, agreement, passed):
    res = {"ratio": 1.0, "original": original, "converted": original, "agreement": agreement}
    verdict = classify_gate(res, LIMIT, 0.97)
    assert verdict["passed"] is passed
    if not passed:
        assert "--min-top1-agreement" in verdict["gate_failures"]


def _fidelity(agreement: float = 1.0, cosine: float = 1.0, levels: int = 100) -> dict:
    return {"detections": {"threshold": 0.5, "agreement": agreement, "matched": 0, "original": MIN_GATED_DETECTIONS,
                           "converted": MIN_GATED_DETECTIONS},
            "score_levels": {"original": 500, "converted": levels},
            "score_cosine": {"output": "scores", "cosine": cosine}}


def _map(ratio: float) -> dict:
    return {"ratio": ratio, "original": 0.4, "converted": 0.4 * ratio}


@pytest.mark.parametrize(("figures", "mapped", "flag"), [
    (_fidelity(), _map(LIMIT - HAIR), "--min-map-ratio"),
    (_fidelity(agreement=FidelityGate.of(None).min_agreement - HAIR), _map(1.0), "--min-detect-agreement"),
    (_fidelity(cosine=FidelityGate.of(None).min_score_cosine - HAIR), _map(1.0), "--min-score-cosine"),
    (_fidelity(levels=FidelityGate.of(None).min_levels - 1), _map(1.0), "--min-score-levels"),
    (_fidelity(), _map(1 + FidelityGate.of(None).max_gain + 1e-6), "--max-map-gain"),
])
def test_each_detector_figure_a_hair_past_its_limit_fails_alone(figures, mapped, flag):
    assert list(failures(figures, mapped, FidelityGate.of(None), LIMIT)) == [flag]


def test_each_detector_figure_at_its_limit_passes():
    gate = FidelityGate.of(None)
    at = _fidelity(agreement=gate.min_agreement, cosine=gate.min_score_cosine, levels=gate.min_levels)
    assert failures(at, _map(LIMIT), gate, LIMIT) == {}
    assert failures(_fidelity(), _map(1 + gate.max_gain), gate, LIMIT) == {}


class _Gate(SimpleNamespace):
    """What detect_result reads of a DetectGate: the original's and the converted variant's mAP on an eval set."""

    original_map: float = 0.4

    def original_scores(self, dataset):
        return {"map": self.original_map, "map50": 0.6, "per_class": {"a": 0.4}, "per_class50": {"a": 0.6}}

    def score(self, dataset, found):
        return {"map": 0.4 * self.ratio, "map50": 0.6, "per_class": {"a": 0.4 * self.ratio}, "per_class50": {"a": 0.6},
                "images": 10, "objects": 20}


@pytest.mark.parametrize(("ratio", "passed"), [(1.0, True), (LIMIT, True), (0.98, False), (0.5, False)])
def test_the_detect_map_gate_passes_only_at_or_above_its_ratio(ratio, passed):
    gate = _Gate(ratio=ratio, evaluation=object(), reference={}, layout="yolo", roles=(0,), output_names=["out"],
                 threshold=0.5)
    res = detect_result(gate, "eval", [], LIMIT)
    assert res["metric"] == "map" and res["ratio"] == pytest.approx(ratio, abs=1e-4)
    assert res["passed"] is passed
    assert ("--min-map-ratio" in res.get("gate_failures", {})) is not passed


def test_an_eval_set_whose_map_ratio_cannot_be_taken_fails():
    gate = _Gate(ratio=1.0, original_map=0.0, evaluation=object(), reference={}, layout="yolo", roles=(0,),
                 output_names=["out"], threshold=0.5)
    res = detect_result(gate, "eval", [], LIMIT)
    assert res["ratio"] is None and res["passed"] is False


@pytest.mark.parametrize(("cosine", "passed"), [(0.98, True), (0.98 - HAIR, False), (None, False)])
def test_the_raw_tasks_cosine_at_its_limit_passes_and_a_hair_under_fails(cosine, passed):
    assert Comparison.raw_gate({"cosine": cosine}, 0.98)["passed"] is passed
