"""A gate's verdict as a type: what it writes into a result and what every reader gets back from one."""

from __future__ import annotations

from edgekit.builders.gate.verdict import Verdict, failed, judged_result


def test_a_verdict_round_trips_through_the_manifest_keys():
    lines = {"--min-top1-agreement": "top-1 the same as the original's on 0.94 of the eval images < 0.97"}
    verdict = Verdict.judged(lines, also=True)
    assert verdict.failed and verdict.reason == lines["--min-top1-agreement"]
    assert verdict.fields() == {"passed": False, "gate_failures": lines}
    assert Verdict.of({"ratio": 1.0, **verdict.fields()}) == verdict
    assert Verdict.judged({}, also=False).fields() == {"passed": False}  # a figure judged without a line
    assert Verdict.judged({}).fields() == {"passed": True}


def test_an_unjudged_result_is_neither_passed_nor_failed():
    assert Verdict.of({"cosine": 0.99}).passed is None and not Verdict.of({"cosine": 0.99}).failed
    assert Verdict(None).fields() == {} and Verdict.of(None).passed is None
    # failures recorded without the flag are a refusal all the same
    assert Verdict.of({"gate_failures": {"--max-map-gain": "ratio 1.16 > 1.05"}}).failed


def test_merged_verdicts_fail_when_either_fails_and_keep_both_lines():
    ratio = Verdict(True)
    fidelity = Verdict.judged({"--min-score-levels": "5 distinct scores < 20"})
    both = ratio.merged(fidelity)
    assert both.failed and list(both.failures) == ["--min-score-levels"]
    assert Verdict(None).merged(ratio) == ratio and ratio.merged(Verdict(None)) == ratio


def test_the_verification_readers_see_failures_and_the_judged_set():
    verification = {"eval": {"ratio": 0.9, "passed": False}, "holdout": {"agreement": 0.99}}
    assert failed(verification) and judged_result(verification) is verification["eval"]
    unjudged = {"holdout": {"agreement": 0.99}}
    assert not failed(unjudged) and judged_result(unjudged) is None
