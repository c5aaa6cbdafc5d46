"""box_units=auto on a quantised YOLO output (edgekit/detect/yolo.py): decided from the output's
integer range, so an int8 build's normalised boxes decode as such even where a box is far off the
image, and a pixel output stays pixels."""

from __future__ import annotations

import numpy as np

from edgekit.detect import yolo
from edgekit.detect.head import detect_config
from edgekit.imaging.image import InputSpec

SIZE, N = 160, 6


def _quantised(rows: np.ndarray, scale: float) -> np.ndarray:
    return np.clip(np.round(rows / scale), 0, 255).astype(np.uint8)[None]


def _config(**options):
    return detect_config(InputSpec(shape=(1, SIZE, SIZE, 3)), 2, {"score_threshold": 0.5, **options})


def test_normalised_int8_boxes_decode_to_pixels_even_past_the_per_frame_bound():
    rows = np.zeros((6, N), np.float32)
    rows[:4, 0] = [0.5, 0.5, 0.25, 0.5]
    rows[:4, 1] = [0.9, 0.5, 2.0, 3.2]  # a barely trained model's box: 3.2 input heights
    rows[4, :2] = 0.9
    scale = 3.3 / 255  # the int8 output's range spans 3.3: normalised
    got = yolo.candidates([_quantised(rows, scale)], _config(), [(scale, 0)])
    np.testing.assert_allclose(got.boxes[0], [60, 40, 100, 120], atol=1.5)
    np.testing.assert_allclose(got.boxes[1], [-16, -176, 304, 336], atol=2)


def test_pixel_int8_boxes_and_given_units_are_kept():
    rows = np.zeros((6, N), np.float32)
    rows[:4, 0] = [1.0, 1.2, 0.8, 0.6]  # a pixel box that happens to be tiny
    rows[4, 0] = 0.9
    scale = 200 / 255
    q = _quantised(rows, scale)
    got = yolo.candidates([q], _config(), [(scale, 0)])
    assert got.boxes[0, 2] < 3  # pixels: the output's range (200) says so
    forced = yolo.candidates([q], _config(box_units="normalized"), [(scale, 0)])
    assert forced.boxes[0, 2] > 100  # an explicit box_units wins over the range
    assert yolo.quantised_units(_config(), None, np.dtype(np.float32)) is None  # float: the per-frame rule
