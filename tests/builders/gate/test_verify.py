"""A converted classifier's top-1 agreement with the original (edgekit/builders/gate/verify.py): reported
beside top-1 on the eval set, and gated (--min-top1-agreement) when the original is accurate.

The demo classifier's int8 as measured (models/demo.keras, calib/fashion + calib/frames,
eval/fashion, cpu): original top-1 0.9345, converted 0.9345, ratio 1.0, agreement 0.9982 on 550
images: it passes."""

from __future__ import annotations

import numpy as np

from edgekit.builders.gate.verify import ACCURATE_ORIGINAL, Comparison, classify_gate, compare


def test_agreement_is_reported_beside_top1():
    ref = np.eye(3)[[0, 1, 2, 0, 1, 2, 0, 1, 2, 0]]
    conv = np.eye(3)[[0, 1, 2, 0, 1, 2, 0, 1, 2, 1]]  # the last answer changed (from right to wrong)
    res = compare(ref, conv, labels=np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0]))
    assert (res["original"], res["converted"], res["ratio"], res["agreement"]) == (1.0, 0.9, 0.9, 0.9)


def test_an_accurate_original_gates_agreement_a_weak_one_only_the_ratio():
    demo = {"original": 0.9345, "converted": 0.9345, "ratio": 1.0, "agreement": 0.9982}
    assert classify_gate(demo, 0.99, 0.97) == {"passed": True}
    # as many answers broken as mended: the ratio passes, agreement 0.9 does not
    swapped = dict(demo, agreement=0.9)
    res = classify_gate(swapped, 0.99, 0.97)
    assert res["passed"] is False and list(res["gate_failures"]) == ["--min-top1-agreement"]
    assert res["gate_failures"]["--min-top1-agreement"] == (
        "top-1 the same as the original's on 0.9000 of the eval images < 0.97, the original being accurate "
        f"(0.9345 >= {ACCURATE_ORIGINAL}) (--min-top1-agreement)")
    both = classify_gate(dict(swapped, converted=0.9, ratio=0.9631), 0.99, 0.97)
    assert list(both["gate_failures"]) == ["--min-accuracy-ratio", "--min-top1-agreement"]
    assert both["gate_failures"]["--min-accuracy-ratio"].endswith("ratio 0.9631 < 0.99 (--min-accuracy-ratio)")
    weak = {"original": 0.6, "converted": 0.6, "ratio": 1.0, "agreement": 0.8}  # its own errors move about
    assert classify_gate(weak, 0.99, 0.97) == {"passed": True}
    # only the ratio failing keeps the ratio's own reason (builders/publish.py), no gate_failures
    assert classify_gate(dict(demo, ratio=0.95), 0.99, 0.97) == {"passed": False}
    assert classify_gate(dict(demo, ratio=None), 0.99, 0.97) == {"passed": False}
    assert classify_gate(swapped, 0.99, 0.0) == {"passed": True}  # 0 turns it off
    assert Comparison.gate(swapped, 0.99, 0.97) == res


def test_an_ungated_weak_int8_is_warned_about_unless_a_gate_judged_its_held_back_images():
    from edgekit.builders.gate.verify import WEAK_AGREEMENT, weak_ungated_warning

    weak = {"holdout": {"agreement": WEAK_AGREEMENT / 2}}
    assert "not gated: give --eval" in weak_ungated_warning(weak)
    assert weak_ungated_warning({"holdout": {"agreement": WEAK_AGREEMENT}}) is None
    assert weak_ungated_warning({**weak, "eval": {}}) is None  # an eval set gates it
    assert weak_ungated_warning({"holdout": {"agreement": 0.1, "passed": False}}) is None  # a detector's fidelity gate


def test_each_output_gets_its_mean_absolute_error_in_its_own_units():
    """``--task raw`` keeps cosine and adds what a user can read: how far off each output is, in its units
    (recorded per output and for the worst one, printed in the log line and the table, not gated)."""
    from edgekit.builders.context import _summary

    ref = [np.array([[100.0, 200.0], [300.0, 400.0]]), np.array([[0.5], [0.25]])]
    conv = [ref[0] + [[2.0, -2.0], [0.0, 4.0]], ref[1] + [[0.01], [-0.03]]]
    res = compare(ref, conv, names=["boxes", "score"], class_output=None)
    assert res["outputs"]["boxes"]["mean_abs_diff"] == 2.0 and res["outputs"]["score"]["mean_abs_diff"] == 0.02
    assert res["worst_output"] == "score" and res["mean_abs_diff"] == 0.02  # the worst output's, at the top
    assert "boxes: cosine" in _summary(res) and "MAE 2; score: cosine" in _summary(res)
