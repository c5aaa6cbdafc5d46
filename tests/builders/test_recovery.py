"""Recovery's attempts (edgekit/builders/recovery.py), without a build: the calibration count the
calibration check recommended is tried first and its row says so, and one recovery path per
target kind: cpu and rpi keep layers in float, the Edge TPU only recalibrates (full integer),
jetson builds no int8 (n/a). The slow builds of each path: tests/builders/test_recovery_builds.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.builders import recovery
from edgekit.builders.calib_stability import Gate, skip_reason, unstable_line
from edgekit.builders.calibration import ImageSet
from edgekit.target import load_target


def _images(n: int) -> ImageSet:
    return ImageSet(None, np.arange(n), "sha", n, 0)


def _ctx(held: int = 30, pool: int = 120, used: int = 60, evalset: bool = True, task: str = "detect"):
    """A build's images as recovery reads them: ``held`` held back first, then the ``pool``, whose
    first ``used`` the converter calibrated on."""
    return SimpleNamespace(calib_all=_images(held + pool), calib=_images(pool), converter_calib=_images(used),
                           evalset=object() if evalset else None, task=task,
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
    assert floats == (["3 worst layers in float", "10 worst layers in float", recovery.SIXTEEN_BY_EIGHT_LABEL]
                      if float_layers else [])
    assert labels[-1] == "calibration on all 120 images"
    assert all(a.quantiser in ("int8", "logged") and not a.denied for a in attempts if a.label not in floats)
    assert [a.quantiser for a in attempts if "16x8" in a.label] == (["16x8"] if float_layers else [])
    # without a recommendation: the same, less that attempt
    plain = [a.label for a in recovery._attempts(_ctx(), load_target(target), b"", _first(None))]
    assert plain == [recovery.LOGGED_RANGES_LABEL, *floats, "calibration on all 120 images"]


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
    lines = recovery.table_lines("edgetpu", rows)
    assert len(lines) == 3 and all(line.startswith("[edgetpu] int8 recovery: ") for line in lines)
    assert lines[0].split(": ", 1)[1].split() == ["attempt", "ratio", "p50", "ms", "TPU", "ops", "kept"]
    assert "0.9527" in lines[1] and "4.34" in lines[1] and "227/263" in lines[1] and not lines[1].endswith("yes")
    assert lines[2].rstrip().endswith("-  yes") and "0.9432" in lines[2]
