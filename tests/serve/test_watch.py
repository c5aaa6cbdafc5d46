"""serve/watch.py: a hot-swap candidate is warmed up through the frame loop serving uses."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from edgekit.camera import Frame
from edgekit.imaging.image import InputSpec
from edgekit.metrics import PipelineMetrics
from edgekit.pipeline import Pipeline
from edgekit.runtime.fake import FakeRuntime
from edgekit.serve.watch import warm_up

SPEC = InputSpec(shape=(1, 8, 8, 1), colour="gray")
LABELS = ["dark", "bright"]


def candidate(fn, metrics: PipelineMetrics | None = None):
    """A Loaded-like candidate whose pipeline records into ``metrics`` (the daemon's /stats sink)."""
    pipeline = Pipeline(FakeRuntime(fn, SPEC), LABELS, max_corrupt=None, metrics=metrics)
    return SimpleNamespace(pipeline=pipeline, labels=LABELS)


def brightness(x: np.ndarray) -> list[np.ndarray]:
    p = float(x.mean() > 0.5)
    return [np.array([[1 - p, p]], dtype=np.float32)]


def recent(values, running_top):
    pairs = enumerate(zip(values, running_top))
    return [(Frame(np.full((16, 16, 3), v, np.uint8), 0, i), top) for i, (v, top) in pairs]


def test_warm_up_runs_every_recent_frame_through_a_pipeline(monkeypatch):
    stepped = []
    original = Pipeline.step

    def step(self, frame, capture_wait_ns=0):
        stepped.append(frame.index)
        return original(self, frame, capture_wait_ns)

    monkeypatch.setattr(Pipeline, "step", step)
    shared = PipelineMetrics(warmup=0, window=100)
    assert warm_up(candidate(brightness, shared), recent([0, 255, 255], [0, 1, 1]), 0.9) == ""
    assert stepped == [0, 1, 2]
    # the daemon's /stats sink, which the candidate's pipeline records into, saw no warm-up frame
    assert "inference" not in shared.stages or not shared.stages["inference"].recent()


def test_disagreement_with_the_running_model_is_measured_on_the_decoded_results():
    why = warm_up(candidate(brightness), recent([0, 255, 255, 0], [1, 0, 1, 0]), 0.9)
    assert why == "it agrees with the running model on 50% of 4 frames (min 90%)"


def test_non_finite_outputs_and_a_wrong_class_count_are_refused_before_decoding():
    nan = candidate(lambda x: [np.array([[np.nan, 1.0]], dtype=np.float32)])
    assert warm_up(nan, recent([0], [None]), 0.0) == "it gives non-finite outputs (NaN/inf)"
    three = candidate(lambda x: [np.array([[0.2, 0.3, 0.5]], dtype=np.float32)])
    assert warm_up(three, recent([0], [None]), 0.0) == "its output has 3 classes for 2 labels"
