"""Publish modes (every / change / interval) with a fake clock: which results become messages."""

from __future__ import annotations

import pytest

from edgekit.serve.mqtt.policy import NOTHING, PublishPolicy, state_text


def result(*pairs: tuple[str, float]) -> dict:
    return {"top": [{"label": label, "score": score} for label, score in pairs]}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def published(policy: PublishPolicy, results: list[dict], step_s: float = 1 / 15) -> list[int]:
    """Indexes of the results the policy publishes, one result every ``step_s``."""
    out = []
    for i, r in enumerate(results):
        if isinstance(policy.clock, Clock):
            policy.clock.t = i * step_s
        if policy.decide(r)[0]:
            out.append(i)
    return out


def test_every_publishes_each_result():
    p = PublishPolicy(mode="every")
    assert published(p, [result(("cat", 0.9))] * 10) == list(range(10)) and p.suppressed == 0


def test_change_publishes_the_first_result_and_then_confirmed_changes_only():
    p = PublishPolicy(mode="change", confirm_frames=2)
    seq = [result(("cat", 0.9))] * 5 + [result(("dog", 0.8))] * 5 + [result(("dog", 0.2))] * 3
    # cat at 0, dog confirmed on its 2nd frame (6), nothing (below min_score) confirmed at 11
    assert published(p, seq) == [0, 6, 11]
    assert p.state == NOTHING and p.changes == 3 and p.suppressed == len(seq) - 3


def test_change_ignores_a_one_frame_flicker():
    p = PublishPolicy(mode="change", confirm_frames=2)
    seq = [result(("cat", 0.9))] * 3 + [result(("dog", 0.9))] + [result(("cat", 0.9))] * 3
    assert published(p, seq) == [0]


def test_hysteresis_keeps_a_label_whose_score_wobbles_around_min_score():
    p = PublishPolicy(mode="change", min_score=0.5, hysteresis=0.1, confirm_frames=1)
    scores = [0.55, 0.48, 0.52, 0.45, 0.51, 0.41]  # stays >= 0.4 until the last one
    seq = [result(("cat", s), ("dog", 1 - s - 0.05)) for s in scores]
    assert published(p, seq) == [0, 5]
    assert p.state == "dog"


def test_a_rival_must_beat_the_current_label_by_the_hysteresis():
    p = PublishPolicy(mode="change", min_score=0.3, hysteresis=0.1, confirm_frames=1)
    seq = [result(("cat", 0.6), ("dog", 0.3)), result(("dog", 0.48), ("cat", 0.45)),
           result(("dog", 0.6), ("cat", 0.35))]
    assert published(p, seq) == [0, 2] and p.state == "dog"


def test_interval_publishes_at_most_once_per_period():
    p = PublishPolicy(mode="interval", min_interval_s=1.0, clock=Clock())
    seq = [result(("cat", 0.9))] * 60  # 4 s at 15 fps
    assert published(p, seq) == [0, 15, 30, 45]


def test_detections_state_is_the_set_of_labels():
    p = PublishPolicy(mode="change", confirm_frames=1)
    a = {"detections": [{"label": "person", "score": 0.9}, {"label": "car", "score": 0.7}]}
    b = {"detections": [{"label": "car", "score": 0.8}, {"label": "person", "score": 0.85}]}
    c = {"detections": [{"label": "car", "score": 0.8}]}
    assert published(p, [a, b, c]) == [0, 2]
    assert state_text(p.state) == "car" and state_text(frozenset({"b", "a"})) == "a,b"
    assert state_text(NOTHING) == "none"


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="publish mode"):
        PublishPolicy(mode="sometimes")
