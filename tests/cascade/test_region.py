"""Region math (edgekit/cascade/region.py) against rotations and scales computed by hand, with the
option names and the order of MediaPipe's DetectionsToRects and RectTransformation calculators."""

from __future__ import annotations

import math

import pytest

from edgekit.cascade.region import Region, RoiOptions, normalize_radians, parse_roi, region_for, transform
from edgekit.errors import UsageError

BOX = (100.0, 100.0, 200.0, 150.0)  # centre (150, 125), 100 x 50


def test_no_options_gives_the_box_itself():
    r = region_for(BOX, (), RoiOptions())
    assert (r.cx, r.cy, r.width, r.height, r.rotation) == (150.0, 125.0, 100.0, 50.0, 0.0)


def test_square_long_then_scale_as_the_face_recipe():
    r = region_for(BOX, (), parse_roi({"scale_x": 1.5, "scale_y": 1.5, "square_long": True}))
    assert (r.width, r.height) == (150.0, 150.0)
    r = region_for(BOX, (), parse_roi({"scale_x": 2.0, "scale_y": 1.0, "square_short": True}))
    assert (r.width, r.height) == (100.0, 50.0)


def test_eyes_level_means_no_rotation_and_a_tilted_pair_turns_the_region():
    level = ((120.0, 120.0), (180.0, 120.0))
    roi = parse_roi({"rotation_vector_start_keypoint_index": 0, "rotation_vector_end_keypoint_index": 1,
                     "rotation_vector_target_angle_degrees": 0})
    assert region_for(BOX, level, roi).rotation == 0.0
    # the second eye 10 px lower per 10 px right: the face is turned 45 degrees clockwise on screen
    tilted = ((120.0, 120.0), (130.0, 130.0))
    assert math.degrees(region_for(BOX, tilted, roi).rotation) == pytest.approx(45.0)
    tilted_back = ((120.0, 130.0), (130.0, 120.0))
    assert math.degrees(region_for(BOX, tilted_back, roi).rotation) == pytest.approx(-45.0)


def test_the_hand_recipe_target_90_and_shift_along_the_rotated_axis():
    # wrist (0) straight below the middle finger (2): the hand points up, which is the target: no rotation
    keypoints = ((150.0, 150.0), (0.0, 0.0), (150.0, 100.0))
    roi = parse_roi({"rotation_vector_start_keypoint_index": 0, "rotation_vector_end_keypoint_index": 2,
                     "rotation_vector_target_angle_degrees": 90, "scale_x": 2.6, "scale_y": 2.6, "shift_y": -0.5,
                     "square_long": True})
    r = region_for(BOX, keypoints, roi)
    assert r.rotation == pytest.approx(0.0)
    assert (r.cx, r.cy) == pytest.approx((150.0, 125.0 - 25.0))  # shift by -0.5 x height (50) before squaring
    assert (r.width, r.height) == pytest.approx((260.0, 260.0))
    # the hand pointing right (finger right of the wrist): rotation -90 degrees; the shift then runs along x
    keypoints = ((150.0, 125.0), (0.0, 0.0), (200.0, 125.0))
    r = region_for(BOX, keypoints, roi)
    assert math.degrees(r.rotation) == pytest.approx(90.0)
    # rotation 90 deg: the region's y axis points to -x; shift_y -0.5 x 50 moves the centre by +25 in x
    assert (r.cx, r.cy) == pytest.approx((150.0 + 25.0, 125.0))


def test_shift_x_follows_the_rotation():
    region = Region(0.0, 0.0, 10.0, 20.0, math.radians(30))
    r = transform(region, RoiOptions(shift_x=1.0))
    assert (r.cx, r.cy) == pytest.approx((10 * math.cos(math.radians(30)), 10 * math.sin(math.radians(30))))


def test_alignment_points_centre_and_size_from_two_keypoints():
    keypoints = ((300.0, 400.0), (300.0, 250.0))  # hip centre, then the full-body point above it
    roi = parse_roi({"rotation_vector_start_keypoint_index": 0, "rotation_vector_end_keypoint_index": 1,
                     "rotation_vector_target_angle_degrees": 90, "alignment_points": True, "scale_x": 1.25,
                     "scale_y": 1.25, "square_long": True})
    r = region_for(BOX, keypoints, roi)
    assert (r.cx, r.cy, r.rotation) == pytest.approx((300.0, 400.0, 0.0))
    assert (r.width, r.height) == pytest.approx((375.0, 375.0))  # 2 x 150, then x 1.25


def test_keypoints_outside_the_frame_are_used_as_given():
    keypoints = ((100.0, -50.0), (100.0, -250.0))
    roi = parse_roi({"rotation_vector_start_keypoint_index": 0, "rotation_vector_end_keypoint_index": 1,
                     "rotation_vector_target_angle_degrees": 90, "alignment_points": True})
    r = region_for(BOX, keypoints, roi)
    assert (r.cx, r.cy, r.width) == pytest.approx((100.0, -50.0, 400.0))


def test_normalize_radians_wraps_into_minus_pi_pi():
    assert normalize_radians(3 * math.pi / 2) == pytest.approx(-math.pi / 2)
    assert normalize_radians(-3 * math.pi / 2) == pytest.approx(math.pi / 2)
    assert normalize_radians(0.25) == pytest.approx(0.25)


@pytest.mark.parametrize("roi, needle", [
    ("{nope", "--roi is not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"scale": 1.5}', "did you mean 'scale_"),
    ('{"scale_x": 0}', "--roi scale_x must be"),
    ('{"max_regions": 1000}', "--roi max_regions must be"),
    ('{"rotation_vector_start_keypoint_index": 0}', "needs both"),
    ('{"square_long": true, "square_short": true}', "cannot both"),
    ('{"alignment_points": true}', "alignment_points needs"),
])
def test_bad_region_options_are_one_line(roi, needle):
    with pytest.raises(UsageError) as err:
        parse_roi(roi)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_keypoint_the_detector_lacks_is_named():
    roi = parse_roi({"rotation_vector_start_keypoint_index": 0, "rotation_vector_end_keypoint_index": 5})
    with pytest.raises(UsageError, match="keypoint 5, but there are 2"):
        region_for(BOX, ((1.0, 1.0), (2.0, 2.0)), roi)
