"""A converted detector's figures that look better or worse than they are get a warning
(edgekit/builders/context.py, detect.py): mAP above the original, low held-back agreement."""

from __future__ import annotations

from edgekit.builders.context import _detect_fidelity


def test_a_gain_over_the_original_is_flagged_not_celebrated():
    warning = _detect_fidelity("int8", "eval", {"ratio": 1.16, "suspicious_gain": True})
    assert warning.startswith("int8: mAP 1.16x the original's") and "does not improve" in warning
    assert _detect_fidelity("int8", "eval", {"ratio": 1.02}) is None


def test_low_held_back_agreement_is_named_whatever_the_ratio():
    warning = _detect_fidelity("int8", "holdout", {"agreement": 0.51})
    assert "0.51" in warning and "lost resolution" in warning
    assert _detect_fidelity("int8", "holdout", {"agreement": 0.93}) is None
    assert _detect_fidelity("int8", "eval", {"agreement": 0.5}) is None  # the eval set is judged by its ratio


def test_the_map_result_marks_a_gain_past_the_margin():
    from types import SimpleNamespace

    from edgekit.builders.gate import detect

    gate = SimpleNamespace(evaluation=object(), original_scores=lambda d: {"map": 0.5, "map50": 0.8, "per_class": {},
                                                                          "per_class50": {}},
                           score=lambda d, f: {"map": 0.58, "map50": 0.9, "per_class": {}, "per_class50": {}})
    res = detect._map_result(gate, "eval", [], 0.99)
    assert res["ratio"] == 1.16 and res["suspicious_gain"] and "passed" not in res  # detect_result decides
    gate.score = lambda d, f: {"map": 0.51, "map50": 0.8, "per_class": {}, "per_class50": {}}
    assert "suspicious_gain" not in detect._map_result(gate, "eval", [], 0.99)
