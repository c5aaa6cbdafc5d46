"""``edgekit build --task landmarks``: the head's options checked before any model loads, each
variant judged by its points' distance to the original's in pixels of the model input, and
the presence agreement (builders/gate/landmarks.py).

The unit tests feed the gate figures and outputs by hand (the boundary of each limit, the
presence count); one small Keras model (N points in input pixels, a sigmoid presence score) is
built for real, with a pixel limit under what its int8 reaches, so fp32 passes and int8 fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from edgekit.builders.contract import BuiltModel, TargetBuild
from edgekit.builders.gate.landmarks import LandmarkGate, Limits, Tally, judge, log_text
from edgekit.builders.int8.recovery import _figure, _hopeless, _row
from edgekit.builders.int8.stability import gate_of, skip_reason
from edgekit.builders.outcome import gate_fix
from edgekit.builders.request import BuildRequest
from edgekit.commands.build import format_table
from edgekit.errors import UsageError
from edgekit.heads.landmarks import LandmarkConfig, LandmarkDecoder
from edgekit.imaging.image import InputSpec
from tests.conftest import CALIB
from tests.helpers.build_cli import build_cli, refused_before_loading

POINTS = 8  # the test model's landmarks
SIDE = 32  # its input, pixels

# --- the gate on figures given by hand ---------------------------------------------------------------


def _figures(mean: float, p95: float, agreement: float | None = None) -> dict:
    res = {"landmark_error_px": {"mean": mean, "p95": p95, "max": p95, "images": 20}}
    if agreement is not None:
        res.update(presence_agreement=agreement,
                   presence={"threshold": 0.5, "images": 100, "original_present": 90, "missed": 2, "extra": 1})
    return res


def test_each_limit_passes_a_figure_equal_to_it_and_fails_one_just_beyond():
    limits = Limits.of(192)
    assert (limits.mean_px, limits.p95_px, limits.min_presence_agreement) == (1.92, 4.8, 0.97)
    assert judge(_figures(1.92, 4.8, 0.97), limits) == {"passed": True}
    over_mean = judge(_figures(1.9201, 4.8, 0.97), limits)
    assert over_mean["passed"] is False and list(over_mean["gate_failures"]) == ["--max-landmark-error"]
    over_p95 = judge(_figures(1.92, 4.8001, 0.97), limits)
    assert list(over_p95["gate_failures"]) == ["--max-landmark-p95"]
    under_presence = judge(_figures(0.1, 0.2, 0.9699), limits)
    assert list(under_presence["gate_failures"]) == ["--min-presence-agreement"]


def test_a_failing_figure_is_one_line_naming_its_limit_and_where_it_comes_from():
    lines = judge(_figures(3.1, 6.0, 0.9), Limits.of(192))["gate_failures"]
    assert lines["--max-landmark-error"] == "landmark error 3.10 px mean > 1.92 px (1 % of 192)"
    assert lines["--max-landmark-p95"] == "landmark error 6.00 px p95 > 4.8 px (2.5 % of 192)"
    assert lines["--min-presence-agreement"].startswith("presence on the original's side of 0.5 on 0.9000 of the "
                                                        "100 images < 0.97 (2 of the 90 the original says present")
    given = judge(_figures(3.1, 6.0), Limits.of(192, max_mean=2.0))["gate_failures"]
    assert given["--max-landmark-error"] == "landmark error 3.10 px mean > 2 px (--max-landmark-error)"
    assert judge({"landmark_error_px": {"mean": None}}, Limits.of(8))["passed"] is False


def _decoder(presence: bool = True) -> LandmarkDecoder:
    config = LandmarkConfig.from_options({"num_landmarks": 2}, {"output": 1} if presence else None)
    spec = InputSpec.from_dict({"shape": [1, 100, 200, 3], "layout": "NHWC", "dtype": "float32"})
    return LandmarkDecoder(config, spec)


def test_presence_disagreement_is_counted_and_pixels_are_measured_where_the_original_is_present():
    # 4 images, 2 points each in input pixels (x, y, z); a 200 x 100 input
    ref = np.zeros((4, 6), np.float32)
    conv = ref.copy()
    conv[:, 0] += [3.0, 4.0, 100.0, 0.0]  # point 0 moved 3, 4, 100, 0 px in x on each image
    conv[:, 1] += [4.0, 3.0, 0.0, 0.0]  # and in y: 5 px off on images 0 and 1
    ref_score = np.float32([[0.9], [0.9], [0.1], [0.9]])  # the original: present on 0, 1, 3
    conv_score = np.float32([[0.9], [0.2], [0.6], [0.9]])  # the variant drops 1, adds 2
    tally = Tally(_decoder(), (200, 100))
    tally.add([ref[:2], ref_score[:2]], [conv[:2], conv_score[:2]])  # two chunks, as verify gives them
    tally.add([ref[2:], ref_score[2:]], [conv[2:], conv_score[2:]])
    res = tally.result()
    assert res["presence_agreement"] == 0.5
    assert res["presence"] == {"threshold": 0.5, "images": 4, "original_present": 3, "missed": 1, "extra": 1}
    # per image: mean over the 2 points of the distance; image 2 (absent in the original) is left out
    assert res["landmark_error_px"] == {"mean": round(5 / 3, 4), "p95": 2.5, "max": 2.5, "images": 3}
    assert "presence agreement 0.5000 (3/4 present in the original, 1 dropped, 1 added)" in log_text(res)
    assert judge(res, Limits.of(200))["gate_failures"].keys() == {"--min-presence-agreement"}


def test_without_a_presence_output_every_image_is_measured():
    ref = np.zeros((2, 6), np.float32)
    conv = ref + np.float32([0, 0, 0, 6, 8, 0])  # point 1 off by 10 px
    tally = Tally(_decoder(presence=False), (200, 100))
    tally.add([ref], [conv])
    res = tally.result()
    assert res == {"landmark_error_px": {"mean": 5.0, "p95": 5.0, "max": 5.0, "images": 2}}


@dataclass
class _Output:
    name: str
    shape: tuple

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class _Source:
    outputs: list = field(default_factory=lambda: [_Output("points", (1, 1, 24)), _Output("score", (1, 1, 1))])


def _gate(**options) -> LandmarkGate:
    request = BuildRequest(model=Path("m.keras"), targets="cpu", calib="c", task="landmarks", task_options=options)
    spec = InputSpec.from_dict({"shape": [1, SIDE, SIDE, 1], "layout": "NHWC", "dtype": "float32"})
    return LandmarkGate.for_model(request, _Source(), spec)


def test_a_bundle_records_the_head_options_with_each_files_own_output_indices():
    gate = _gate(landmarks={"num_landmarks": POINTS}, presence={"output": 1, "threshold": 0.3})
    assert gate.limits.to_dict() == {"max_mean_px": 0.32, "max_p95_px": 0.8, "min_presence_agreement": 0.97,
                                     "input_side_px": SIDE}
    reordered = gate.task_options([{"name": "score"}, {"name": "points"}])
    assert reordered == {"landmarks": {"num_landmarks": POINTS, "output": 1},
                         "presence": {"output": 0, "threshold": 0.3}}
    assert gate.task_options([{"name": "points"}, {"name": "score"}])["presence"]["output"] == 1


@pytest.mark.parametrize("options,message", [
    ({"landmarks": {"output": 2}}, "landmarks landmarks.output 2: the model has 2 outputs (0: points [1, 1, 24]"),
    ({"landmarks": {"num_landmarks": 5}}, "output 0 (points) holds 24 values, not a multiple of num_landmarks 5"),
])
def test_options_the_model_cannot_meet_are_one_line(options, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        _gate(**options)


@pytest.mark.parametrize("extra,message", [
    (("-T", 'landmarks={"num_landmark": 468}'), "landmarks head: landmarks has no option 'num_landmark'"),
    (("-T", 'presence={"output": 0}'), "presence.output 0 is also the landmarks' output"),
    (("-T", "landmarks=[1]"), "landmarks head: landmarks must be a table of options"),
    (("-T", "score_threshold=0.3"), "task 'landmarks' has no option 'score_threshold'"),
    (("--max-landmark-error", "-1"), "--max-landmark-error -1.0 makes no sense"),
    (("--min-presence-agreement", "2"), "--min-presence-agreement 2.0 makes no sense"),
])
def test_a_bad_option_is_one_line_and_exit_2_before_the_model_loads(tmp_path, monkeypatch, extra, message):
    code, errors, err = refused_before_loading(monkeypatch, tmp_path, "landmarks", *extra)
    assert code == 2 and len(errors) == 1 and message in errors[0], err


# --- what reads the figures: recovery, the calibration check, the table, the fix line ----------------


def _verification(mean: float, passed: bool, limit: float = 0.32) -> dict:
    return {"holdout": {**_figures(mean, mean * 2), "passed": passed, "cosine": 0.9999,
                        "landmark_gate": {"max_mean_px": limit, "max_p95_px": 0.8, "input_side_px": SIDE}}}


def _model(verification: dict) -> BuiltModel:
    spec = InputSpec.from_dict({"shape": [1, SIDE, SIDE, 1], "layout": "NHWC", "dtype": "float32"})
    return BuiltModel(name="int8", file="m_int8.tflite", format="tflite", precision="int8", input=spec, outputs=(),
                      convert_seconds=1.0, bytes=1, verification=verification)


def test_recovery_and_the_calibration_check_judge_a_landmark_model_by_its_pixels():
    missed, closer = _model(_verification(0.5, False)), _model(_verification(0.4, False))
    row = _row("as built", missed)
    assert (row["figure_name"], row["figure"], row["passed"]) == ("px mean", 0.5, False)
    assert _figure(closer) > _figure(missed)  # the least error is the best attempt
    assert not _hopeless(row, missed) and _hopeless(row, _model(_verification(3.3, False)))  # over a tenth of 32
    far = gate_of("landmarks", 0.99, 0.98, _verification(0.1, True))
    assert (far.figure, far.threshold, far.flag, far.higher) == (0.1, 0.32, "--max-landmark-error", False)
    assert "0.1 is 0.22 under the limit 0.32; checked over 0.16" in skip_reason(far, (np.arange(3), "disjoint"))
    near = gate_of("landmarks", 0.99, 0.98, _verification(0.2, True))
    assert skip_reason(near, (np.arange(3), "disjoint")) is None  # over half the limit: checked
    broken = gate_of("landmarks", 0.99, 0.98, _verification(4.0, False))
    assert "4.0 is over 3.2: a broken calibration" in skip_reason(broken, (np.arange(3), "disjoint"))


def test_the_table_shows_the_pixel_error_and_presence_and_the_fix_names_the_pixel_flags():
    lost = {"file": "m_int8.tflite", "kept_in": "m-cpu.rejected", "bytes": 1024,
            "verification": {"holdout": {**_figures(3.1, 6.0, 0.5), "cosine": 0.99, "passed": False,
                                         "gate_failures": {"--max-landmark-error": "x", "--max-landmark-p95": "y"}}}}
    manifest = {"task": "landmarks", "models": [{"name": "fp32", "file": "m_fp32.tflite", "bytes": 2048}],
                "verification": {"gated": True, "rejected": {"int8": lost},
                                 "models": {"fp32": {"holdout": {**_figures(0.0, 0.0, 1.0), "cosine": 1.0,
                                                                 "passed": True}}}}}
    result = TargetBuild("cpu", Path("d/m-cpu"), False, 2.0, manifest, "why", ("int8",))
    table = format_table([result]).splitlines()
    assert table[0].split()[4:8] == ["landmark", "error", "presence", "cosine"]
    assert "0.00 px mean, 0.00 px p95  1.0000    1.000000  PASS" in table[2]
    assert "3.10 px mean, 6.00 px p95  0.5000    0.990000  FAIL" in table[3]
    assert "raise --max-landmark-error or --max-landmark-p95 (pixels of the model input)" in gate_fix([result])


# --- a real build ------------------------------------------------------------------------------------


def _landmark_model(path: Path) -> Path:
    """N points in pixels of a 32 x 32 input (a sigmoid times 32) and a sigmoid presence score well
    above 0.5 (its bias), so every image is present in both models and the pixels decide."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    inp = keras.Input((SIDE, SIDE, 1))
    x = layers.GlobalAveragePooling2D()(layers.Conv2D(8, 3, activation="relu")(inp))
    points = layers.Rescaling(float(SIDE), name="points")(layers.Dense(POINTS * 3, activation="sigmoid")(x))
    score = layers.Dense(1, activation="sigmoid", bias_initializer=keras.initializers.Constant(4.0), name="score")(x)
    keras.Model(inp, [points, score]).save(path)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """fp32 and int8 built for cpu with a mean limit of 0.001 px: int8 misses it, and so does every
    recovery attempt; fp32 does not. (exit code, stdout, stderr, dist). Recovery keeps at most 3 layers
    in float: all 9 of this model in float, with its outputs float (builders/int8/float_outputs.py),
    is the float model (0 px)."""
    from edgekit.builders.int8 import recovery

    tmp = tmp_path_factory.mktemp("landmarks")
    model = _landmark_model(tmp / "points.keras")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recovery, "FLOAT_LAYERS", (3,))
        code, out, err = build_cli("--model", model, "--target", "cpu", "--calib", CALIB, "--out", tmp / "dist",
                                   "--calib-count", "40", "--variants", "fp32,int8", "--task", "landmarks",
                                   "-T", f'landmarks={{"num_landmarks": {POINTS}}}', "-T", 'presence={"output": 1}',
                                   "--max-landmark-error", "0.001", "--allow-partial")
    return code, out, err, tmp / "dist"


def test_fp32_passes_with_no_pixel_error_and_the_manifest_records_the_figures(built):
    code, out, err, dist = built
    assert code == 0, err
    manifest = json.loads((dist / "points-cpu" / "edgekit.json").read_text())
    v = manifest["verification"]
    assert manifest["task"] == "landmarks" and v["metric"] == "landmark_error_px" and v["gated"]
    assert v["landmark_gate"] == {"max_mean_px": 0.001, "max_p95_px": 0.8, "min_presence_agreement": 0.97,
                                  "input_side_px": SIDE}
    fp32 = v["models"]["fp32"]["holdout"]
    assert fp32["passed"] and fp32["landmark_error_px"]["mean"] < 1e-3 and fp32["landmark_error_px"]["images"] == 8
    assert fp32["presence_agreement"] == 1.0 and fp32["cosine"] > 0.9999  # cosine still reported
    assert manifest["models"][0]["task_options"] == {"landmarks": {"num_landmarks": POINTS, "output": 0},
                                                     "presence": {"output": 1}}
    assert "fp32 on 8 holdout images: landmark error vs the original" in err


def test_an_int8_over_the_pixel_limit_fails_with_the_pixel_line(built):
    code, out, err, dist = built
    manifest = json.loads((dist / "points-cpu" / "edgekit.json").read_text())
    lost = manifest["verification"]["rejected"]["int8"]
    px = lost["verification"]["holdout"]["landmark_error_px"]
    assert 0.001 < px["mean"] <= px["max"] and lost["verification"]["holdout"]["passed"] is False
    line = f"int8 landmark error {px['mean']:.2f} px mean > 0.001 px (--max-landmark-error)"
    assert lost["reason"].startswith(line), lost["reason"]
    # recovery judged its attempts by the pixels and kept the least error (the first row is the int8 as built)
    rows = lost["verification"]["recovery"]
    assert len(rows) > 2 and {r["figure_name"] for r in rows} == {"px mean"} and not any(r["passed"] for r in rows)
    assert [r["kept"] for r in rows].index(True) == min(range(len(rows)), key=lambda i: rows[i]["figure"])
    assert rows[[r["kept"] for r in rows].index(True)]["figure"] == px["mean"] < rows[0]["figure"]
    assert line in err and "int8 on 8 holdout images: landmark error vs the original" in err
    (row,) = [ln for ln in out.splitlines() if "points_int8" in ln]
    assert f"{px['mean']:.2f} px mean" in row and "FAIL" in row


def test_the_bundle_decodes_landmarks_with_the_options_it_was_built_with(built):
    from edgekit.heads.landmarks import Landmarks
    from edgekit.heads.table import make_decoder
    from edgekit.model import open_model

    with open_model(built[3] / "points-cpu") as opened:
        assert opened.task == "landmarks"
        decode = make_decoder(opened.task, opened.labels, opened.runtime, **opened.task_options)
        frame = np.full((1, SIDE, SIDE, 1), 0.5, np.float32)
        result = decode(opened.runtime.infer(frame))
    assert isinstance(result, Landmarks) and result.present and result.points.shape == (POINTS, 3)
    assert result.points[:, :2].min() >= 0 and result.points[:, :2].max() <= SIDE
