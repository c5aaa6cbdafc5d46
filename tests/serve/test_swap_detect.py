"""A detector bundle can be hot-swapped: the warm-up check compares the best box's class, not a
class-score vector's width (a YOLO output is [1, 4 + nc, N], never one value per label)."""

from __future__ import annotations

import time

from edgekit.camera import Frame
from edgekit.model import open_model
from edgekit.pipeline import Pipeline
from edgekit.serve.swap import Loaded, warm_up
from tests.helpers.detector_model import detector_bundle, scene


def _loaded(bundle) -> Loaded:
    m = open_model(bundle)
    return Loaded(Pipeline(m.runtime, m.labels, task=m.task, task_options=m.task_options), {}, {}, m.labels)


def _recent(pairs):
    return [(Frame(scene(left, right, seed=i), time.perf_counter_ns(), i), top) for i, (left, right, top) in
            enumerate(pairs)]


def test_a_healthy_detector_passes_the_warm_up(tmp_path):
    candidate = _loaded(detector_bundle(tmp_path / "det", spare=5))  # N = 7 candidates, 2 classes
    try:
        # the running model saw a cat (class 0) on the left, a dog (1) on the right, nothing on a dark frame
        recent = _recent([(True, False, 0), (False, True, 1), (False, False, None)])
        assert warm_up(candidate, recent, min_agreement=1.0) == ""
    finally:
        candidate.close()


def test_a_detector_that_disagrees_with_the_running_one_is_refused(tmp_path):
    candidate = _loaded(detector_bundle(tmp_path / "det", spare=5))  # N = 7 candidates, 2 classes
    try:
        recent = _recent([(True, False, 1), (False, True, 0)])  # the running model said the opposite
        assert "agrees with the running model on 0% of 2 frames" in warm_up(candidate, recent, min_agreement=0.5)
    finally:
        candidate.close()
