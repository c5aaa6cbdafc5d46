"""The crop and the way back (edgekit/cascade/warp.py): numpy's warp against OpenCV's, and a round trip
frame -> crop -> frame that lands a marked pixel where it was, rotated or not."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from edgekit.cascade.region import Region
from edgekit.cascade.warp import crop, frame_from_input, to_frame, warp_numpy


def _scene(h: int = 240, w: int = 320, channels: int = 3) -> np.ndarray:
    rng = np.random.default_rng(0)
    shape = (h, w, channels) if channels > 1 else (h, w)
    return cv2.GaussianBlur(rng.integers(0, 256, shape, dtype=np.uint8), (7, 7), 2)


@pytest.mark.parametrize("degrees", [0.0, 40.0, -40.0, 135.0])
@pytest.mark.parametrize("channels", [1, 3])
def test_numpy_warp_matches_opencv(degrees, channels):
    frame = _scene(channels=channels)
    region = Region(150.0, 110.0, 120.0, 90.0, math.radians(degrees))
    m = frame_from_input(region, 64, 48)
    ours = warp_numpy(frame, m, 64, 48).astype(int)
    theirs = cv2.warpAffine(frame, m, (64, 48), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                            borderMode=cv2.BORDER_REPLICATE).astype(int)
    assert ours.shape == theirs.shape
    diff = np.abs(ours - theirs.reshape(ours.shape))
    assert diff.max() <= 2 and diff.mean() < 0.5  # OpenCV interpolates in 1/32-pixel steps


def test_the_border_is_replicated_outside_the_frame():
    frame = _scene()
    region = Region(5.0, 5.0, 100.0, 100.0, 0.0)  # three quarters of it outside the frame
    for use_opencv in (True, False):
        out = crop(frame, region, 50, 50, use_opencv=use_opencv)
        assert (out[0, 0] == frame[0, 0]).all()  # the top-left corner repeats the frame's


@pytest.mark.parametrize("degrees", [0.0, 40.0, -40.0, 90.0])
@pytest.mark.parametrize("use_opencv", [True, False])
def test_a_marked_pixel_goes_to_the_crop_and_back(degrees, use_opencv):
    frame = np.zeros((300, 400, 3), np.uint8)
    mark = (233.0, 141.0)
    cv2.circle(frame, (int(mark[0]), int(mark[1])), 3, (255, 255, 255), -1)
    region = Region(210.0, 150.0, 120.0, 120.0, math.radians(degrees))
    image = crop(frame, region, 96, 96, use_opencv=use_opencv)
    ys, xs = np.nonzero(image[..., 0] > 127)
    found = np.array([[xs.mean(), ys.mean(), 0.0]])
    back = to_frame(found, region, 96, 96)
    assert back[0, :2] == pytest.approx(mark, abs=1.0)


def test_to_frame_scales_z_like_x_by_the_region_width():
    region = Region(100.0, 100.0, 200.0, 200.0, math.radians(30))
    points = np.array([[48.0, 48.0, 10.0]])  # the input's centre, z 10 input pixels
    out = to_frame(points, region, 96, 96)
    assert out[0] == pytest.approx((100.0, 100.0, 10.0 * 200 / 96), abs=1e-3)


def test_the_rotation_is_clockwise_on_screen():
    region = Region(100.0, 100.0, 96.0, 96.0, math.radians(90))
    # the input's right edge middle (96, 48) sits below the centre when the region turns 90 degrees
    out = to_frame(np.array([[96.0, 48.0]]), region, 96, 96)
    assert out[0, :2] == pytest.approx((100.0, 148.0), abs=1e-3)
