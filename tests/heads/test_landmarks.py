"""The landmarks head (edgekit/heads/landmarks.py): MediaPipe's option names, points in the frame's
pixels through the model's own resize, never clipped, and a presence score that gates them."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.errors import UsageError
from edgekit.heads.landmarks import OPTIONS, landmarks
from edgekit.heads.table import TASK_HEADS, make_decoder
from edgekit.imaging.image import InputSpec


class _Runtime:
    def __init__(self, spec: InputSpec, quant=None):
        self.input_spec = spec
        self.output_quantization = quant


SQUARE = InputSpec(shape=(1, 100, 100, 3))
POINTS = np.array([[10.0, 20.0, 5.0], [90.0, 50.0, -5.0], [50.0, 120.0, 0.0]], np.float32)  # last one below


def test_the_row_lists_the_heads_own_options():
    assert TASK_HEADS["landmarks"].options is OPTIONS


def test_points_in_input_pixels_without_a_frame():
    decode = make_decoder("landmarks", (), _Runtime(SQUARE), landmarks={"num_landmarks": 3})
    out = decode([POINTS.reshape(1, 9)])
    assert out.points == pytest.approx(POINTS) and out.present and out.size == (100, 100)


def test_a_stretched_input_maps_each_axis_and_z_like_x():
    decode = landmarks((), _Runtime(SQUARE), landmarks={"num_landmarks": 3})
    out = decode([POINTS.reshape(1, 9)], frame_shape=(200, 400, 3))  # 400 wide, 200 high: x * 4, y * 2
    assert out.points[0] == pytest.approx((40.0, 40.0, 20.0))
    assert out.points[2, 1] == pytest.approx(240.0)  # below the frame: kept where the model put it
    assert out.size == (400, 200)


def test_a_letterboxed_input_undoes_the_padding():
    spec = InputSpec(shape=(1, 100, 100, 3), resize="letterbox")
    decode = landmarks((), _Runtime(spec), landmarks={"num_landmarks": 3})
    out = decode([POINTS.reshape(1, 9)], frame_shape=(100, 200, 3))  # 200x100 -> 100x50 at rows 25..75
    assert out.points[0] == pytest.approx((20.0, -10.0, 10.0))


def test_input_image_size_normalises_other_units():
    decode = landmarks((), _Runtime(SQUARE), landmarks={"num_landmarks": 3, "input_image_width": 200,
                                                        "input_image_height": 200, "normalize_z": 2.0})
    out = decode([POINTS.reshape(1, 9)])
    assert out.points[1] == pytest.approx((45.0, 25.0, -1.25))  # x / 200 * 100; z / 200 / 2 * 100 (MediaPipe divides)


def test_presence_gates_and_sigmoid_applies():
    options = {"landmarks": {"num_landmarks": 3}, "presence": {"output": 1, "activation": "sigmoid"}}
    decode = landmarks((), _Runtime(SQUARE), **options)
    gone = decode([POINTS.reshape(1, 9), np.array([[-2.0]])])
    assert not gone.present and len(gone) == 0 and gone.score == pytest.approx(0.1192, abs=1e-4)
    assert gone.to_dict()["landmarks"] == [] and "no landmarks" in str(gone)
    kept = decode([POINTS.reshape(1, 9), np.array([[2.0]])])
    assert kept.present and len(kept) == 3 and kept.to_dict()["landmark_score"] == pytest.approx(0.8808, abs=1e-4)


def test_quantised_outputs_are_dequantised():
    q = (POINTS / 0.5).astype(np.int32) + 10
    decode = landmarks((), _Runtime(SQUARE, [(0.5, 10)]), landmarks={"num_landmarks": 3})
    assert decode([q.reshape(1, 9).astype(np.int16)]).points == pytest.approx(POINTS)


def test_visibility_from_a_fourth_value():
    values = np.concatenate([POINTS, np.array([[0.0], [10.0], [-10.0]], np.float32)], axis=1)
    decode = landmarks((), _Runtime(SQUARE), landmarks={"num_landmarks": 3, "visibility_activation": "sigmoid"})
    out = decode([values.reshape(1, 12)])
    assert out.visibility == pytest.approx((0.5, 1.0, 0.0), abs=1e-4)


def test_the_count_is_guessed_from_triples():
    decode = landmarks((), _Runtime(SQUARE))
    assert len(decode([POINTS.reshape(1, 9)])) == 3


@pytest.mark.parametrize("options, needle", [
    ({"landmarks": {"num_landmark": 3}}, "did you mean 'num_landmarks'"),
    ({"landmarks": {"num_landmarks": 0}}, "landmarks.num_landmarks must be"),
    ({"landmarks": [1]}, "must be a table"),
    ({"presence": {"activation": "sigmoid"}}, "needs its output index"),
    ({"presence": {"output": 0}}, "also the landmarks' output"),
    ({"presence": {"output": 1, "threshold": 2}}, "presence.threshold must be"),
    ({"landmark": {}}, "has no option 'landmark'"),
])
def test_bad_options_are_one_line(options, needle):
    with pytest.raises(UsageError) as err:
        make_decoder("landmarks", (), _Runtime(SQUARE), **options)
    assert needle in str(err.value)


def test_an_output_that_does_not_hold_the_count_is_named():
    decode = landmarks((), _Runtime(SQUARE), landmarks={"num_landmarks": 4})
    with pytest.raises(UsageError, match="not a multiple of num_landmarks 4"):
        decode([POINTS.reshape(1, 9)])
    with pytest.raises(UsageError, match="no output 2"):
        landmarks((), _Runtime(SQUARE), landmarks={"output": 2})([POINTS.reshape(1, 9)])
