"""edgekit.outputs.overlay: boxes and labels land where the detections are, in the class colour; a
classifier gets a banner; the frame given is never changed."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.detect.boxes import Detection, Detections
from edgekit.heads.classify import Classification
from edgekit.heads.tensors import Prediction
from edgekit.outputs.overlay import colour_for, draw


def _changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(int) - b.astype(int)).max(axis=-1) > 0


def test_a_box_is_drawn_on_its_outline_in_the_class_colour_and_nowhere_else():
    frame = np.full((240, 320, 3), 40, np.uint8)
    before = frame.copy()
    dets = Detections((Detection(3, "cup", 0.91, (100.0, 80.0, 220.0, 200.0)),), size=(320, 240))
    out = draw(frame, dets)
    np.testing.assert_array_equal(frame, before)  # pure: the caller's frame is untouched
    assert out.shape == frame.shape and out.dtype == np.uint8
    changed = _changed(out, frame)
    # the outline: left and right edges down the middle of the box, in the class colour
    assert tuple(out[140, 100]) == colour_for(3) and tuple(out[140, 219]) == colour_for(3)
    assert changed[150:195, 100].all() and changed[150:195, 219].all()
    # the inside below the label tab, and everything well outside the box, are untouched
    assert not changed[120:195, 105:215].any()
    assert not changed[:, 230:].any() and not changed[205:].any() and not changed[:, :95].any()
    # the label tab sits above the box, filled in the class colour
    tab = (out[:80, 100:160] == colour_for(3)).all(axis=-1)
    assert tab[70:80, :40].mean() > 0.5 and not tab[:60].any()


def test_each_class_keeps_its_colour_and_overlapping_boxes_are_all_drawn():
    frame = np.zeros((480, 640, 3), np.uint8)
    dets = Detections((Detection(0, "a", 0.9, (50, 50, 300, 300)), Detection(1, "b", 0.8, (200, 200, 500, 400))),
                      size=(640, 480))
    out = draw(frame, dets)
    assert colour_for(0) != colour_for(1)
    assert tuple(out[150, 50]) == colour_for(0) and tuple(out[350, 499]) == colour_for(1)


def test_boxes_in_another_image_size_are_scaled_onto_the_frame():
    # a decoder not told the frame's shape leaves boxes in model-input pixels (here 100x100)
    dets = Detections((Detection(0, "a", 0.9, (10, 10, 50, 50)),), size=(100, 100))
    out = draw(np.zeros((200, 400, 3), np.uint8), dets)
    assert tuple(out[60, 40]) == colour_for(0)  # x 10 -> 40, y between 20 and 100
    assert not out[150:, 220:].any()


@pytest.mark.parametrize("shape", [(96, 184, 3), (1080, 1920, 3)])
def test_text_is_readable_on_small_and_large_frames(shape):
    h, w = shape[:2]
    dets = Detections((Detection(0, "person", 0.5, (w * 0.3, h * 0.4, w * 0.7, h * 0.9)),), size=(w, h))
    out = draw(np.zeros(shape, np.uint8), dets)
    tab = (out == colour_for(0)).all(axis=-1)
    rows = np.nonzero(tab[: int(h * 0.4), int(w * 0.3):].any(axis=1))[0]
    height = rows.max() - rows.min() + 1  # the filled tab behind the label
    assert 9 <= height <= max(16, h // 15)  # legible on Vector's face, not a banner on 1080p
    assert (out[rows.min():rows.max() + 1] != colour_for(0)).any()  # text drawn in it


def test_gray_and_bgra_frames_come_back_bgr():
    dets = Detections((Detection(0, "a", 0.9, (10, 10, 60, 60)),), size=(100, 100))
    for frame in (np.zeros((100, 100), np.uint8), np.zeros((100, 100, 4), np.uint8)):
        out = draw(frame, dets)
        assert out.shape == (100, 100, 3) and tuple(out[30, 10]) == colour_for(0)


def test_a_classification_is_a_banner_with_the_top_label():
    frame = np.full((240, 320, 3), 200, np.uint8)
    result = Classification((Prediction(2, "stop", 0.87), Prediction(0, "go", 0.1)))
    out = draw(frame, result)
    changed = _changed(out, frame)
    rows = np.nonzero(changed.any(axis=1))[0]
    assert rows.min() == 0 and rows.max() < 40  # a strip across the top only
    assert changed[: rows.max(), 100:].any()  # text, not only the colour bar
    assert tuple(out[5, 0]) == colour_for(2)


def test_nothing_detected_or_an_unknown_result_draws_nothing():
    frame = np.full((120, 160, 3), 77, np.uint8)
    np.testing.assert_array_equal(draw(frame, Detections((), size=(160, 120))), frame)
    np.testing.assert_array_equal(draw(frame, {"whatever": 1}), frame)


def test_a_frame_that_is_not_an_image_is_refused():
    with pytest.raises(ValueError, match="uint8"):
        draw(np.zeros((10, 10, 3), np.float32), Detections(()))


def test_the_face_image_is_drawn_at_screen_size_with_the_boxes_where_they_were():
    from edgekit.vector.face import render_result

    frame = np.zeros((360, 640, 3), np.uint8)
    dets = Detections((Detection(0, "cat", 0.9, (320.0, 180.0, 640.0, 360.0)),), size=(640, 360))
    face = render_result(frame, dets)
    assert face.shape == (96, 184, 3)
    # 640x360 -> 171x96 centred (6 px bars): the box covers the lower right quarter of the picture
    red = (face == np.array(colour_for(0)[::-1])).all(axis=-1)  # RGB on the face
    ys, xs = np.nonzero(red)
    assert abs(xs.min() - (6 + 85)) <= 1 and abs(ys.max() - 95) <= 1 and abs(xs.max() - (6 + 170)) <= 1
    # the label is drawn at the screen's size: a tab about 14 px high, not 1/4 of that
    assert 10 <= ys.max() - ys.min() - 48 <= 18
    # a result without a size is taken to be in the frame's pixels
    same = render_result(frame, Detections(dets.detections))
    np.testing.assert_array_equal(same, face)


def test_labels_of_overlapping_boxes_never_cover_each_other():
    from edgekit.outputs.overlay import place_tabs

    boxes = [(100 + 4 * i, 100 + 3 * i, 300, 300) for i in range(8)]  # eight boxes, corners piled up
    tabs = place_tabs(boxes, [(90, 16)] * 8, (480, 640))
    for i, a in enumerate(tabs):
        assert min(a[0], a[1]) >= 0 and a[2] <= 640 and a[3] <= 480  # inside the image
        for b in tabs[i + 1:]:
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)
    assert tabs[0] == (100, 84, 190, 100)  # the best box keeps the natural spot above its corner
    frame = np.zeros((480, 640, 3), np.uint8)
    dets = Detections(tuple(Detection(i, f"c{i}", 0.9 - i / 20, tuple(map(float, b))) for i, b in enumerate(boxes)),
                      size=(640, 480))
    out = draw(frame, dets)
    for i in range(8):  # every label's tab shows its own colour somewhere
        assert (out == colour_for(i)).all(axis=-1).sum() > 50


def test_the_first_classes_have_colours_a_colour_blind_reader_tells_apart():
    def lab(bgr):
        import cv2

        return cv2.cvtColor(np.uint8([[bgr]]), cv2.COLOR_BGR2LAB)[0, 0].astype(float)

    first = [lab(colour_for(i)) for i in range(7)]
    closest = min(np.linalg.norm(a - b) for i, a in enumerate(first) for b in first[i + 1:])
    assert closest > 25  # CIELAB distance (8-bit scale): clearly different colours, not shades


def test_a_classifier_overlay_outlines_the_window_the_model_saw_and_dims_the_rest():
    frame = np.full((360, 640, 3), 200, np.uint8)
    result = Classification((Prediction(2, "bag", 0.8),))
    out = draw(frame, result, crop="square")  # the largest centred square: x 140..499
    assert tuple(out[300, 20]) == (80, 80, 80)  # outside the window: dimmed
    assert tuple(out[300, 320]) == (200, 200, 200)  # inside: as the camera gave it
    assert tuple(out[300, 140]) == colour_for(2) and tuple(out[300, 499]) == colour_for(2)  # the outline
    whole = draw(frame, result)  # no crop: nothing dimmed below the banner
    assert tuple(whole[300, 20]) == (200, 200, 200)


def test_a_cascade_draws_its_region_landmarks_and_sub_label():
    from edgekit.detect.boxes import Detection, Detections
    from edgekit.heads.landmarks import Landmarks

    frame = np.zeros((200, 300, 3), np.uint8)
    face = Detection(0, "face", 0.9, (100.0, 50.0, 160.0, 110.0), landmarks=((40.0, 170.0, 0.0),),
                     region=(130.0, 80.0, 90.0, 90.0, 30.0), sub_label="smile", sub_label_score=0.8)
    image = draw(frame, Detections((face,), (300, 200)))
    assert image[170, 40].any()  # the landmark, far from the box
    c, s = np.cos(np.radians(30)), np.sin(np.radians(30))
    corner = np.array([[c, -s], [s, c]]) @ [45, 45]
    x, y = np.round([130 + corner[0], 80 + corner[1]]).astype(int)
    assert image[y - 2:y + 3, x - 2:x + 3].any()  # the rotated region's corner
    alone = draw(frame, Landmarks(np.array([[20.0, 30.0, 0.0]], np.float32), 0.9, True, (300, 200)))
    assert alone[30, 20].any() and not draw(frame, Landmarks(np.zeros((0, 3), np.float32), 0.1, False)).any()


def test_a_mask_is_tinted_in_its_class_colour_where_the_model_put_it_and_nowhere_else():
    from edgekit.heads.table import make_decoder
    from edgekit.imaging.image import InputSpec

    class _Runtime:
        input_spec = InputSpec(shape=(1, 4, 8, 3), resize="letterbox")
        output_quantization = None

    grid = np.zeros((1, 4, 8, 1), np.float32)
    grid[0, :2, 4:8, 0] = 0.9  # the right half of the padding row and the frame's top half
    frame = np.full((100, 400, 3), 200, np.uint8)  # 400 x 100 letterboxed into 8 x 4: grid rows 1 and 2
    result = make_decoder("segment", ("person",), _Runtime())([grid], frame_shape=frame.shape)
    assert result.segments[0].box == (200.0, 0.0, 400.0, 50.0)  # the padding row is not the frame's
    image = draw(frame, result)
    tint = (np.full(3, 200) + colour_for(0)) // 2
    assert tuple(image[30, 300]) == tuple(tint)  # inside the mask: half-way to the class colour
    assert tuple(image[30, 100]) == (200, 200, 200) and tuple(image[80, 300]) == (200, 200, 200)  # outside
    assert not _changed(image, frame)[60:].any() and not _changed(image, frame)[20:, :190].any()
    empty = make_decoder("segment", (), _Runtime())([np.zeros_like(grid)], frame_shape=frame.shape)
    np.testing.assert_array_equal(draw(frame, empty), frame)
