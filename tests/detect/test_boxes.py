"""Boxes found in the model input land on the source frame where the object is.

The check is made with the real preprocessor: a bright rectangle is drawn on a frame, the
frame is cropped/letterboxed/stretched by :class:`edgekit.imaging.image.Preprocessor`, the rectangle
is found again in the model input, and :func:`edgekit.imaging.geometry.box_map` must carry that
box back onto the rectangle drawn.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.detect.boxes import Detection, Detections
from edgekit.imaging.geometry import box_map, identity_map
from edgekit.imaging.image import InputSpec, Preprocessor


def _spec(h: int, w: int, **kw) -> InputSpec:
    return InputSpec.from_dict({"shape": [1, h, w, 3], "dtype": "float32", **kw})


def _found(img: np.ndarray) -> np.ndarray:
    """xyxy (pixel edges) of the bright pixels of an image."""
    ys, xs = np.nonzero(img.max(axis=-1) > 127)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)


CASES = [
    # frame (h, w), input (h, w), spec options, rectangle x1, y1, x2, y2 on the frame
    ((480, 640), (160, 160), {"resize": "letterbox"}, (200, 100, 360, 300)),
    ((480, 640), (160, 160), {"resize": "stretch"}, (200, 100, 360, 300)),
    ((480, 640), (96, 128), {"resize": "letterbox"}, (40, 60, 600, 420)),
    ((480, 640), (160, 160), {"crop": "square"}, (200, 100, 360, 300)),
    ((600, 300), (128, 128), {"resize": "letterbox"}, (50, 100, 250, 500)),
    ((480, 640), (100, 100), {"crop": [300, 400], "resize": "letterbox"}, (180, 120, 420, 330)),
]


@pytest.mark.parametrize("frame_hw, input_hw, options, rect", CASES)
def test_box_in_the_input_maps_back_onto_the_object(frame_hw, input_hw, options, rect):
    frame = np.zeros((*frame_hw, 3), np.uint8)
    x1, y1, x2, y2 = rect
    frame[y1:y2, x1:x2] = 255
    spec = _spec(*input_hw, interpolation="nearest", **options)
    seen = _found(Preprocessor(spec).shaped(frame))
    mapped = box_map(spec, frame.shape)(seen[None])[0]
    # one input pixel is frame/input pixels wide: the box is right to within that
    step = max(frame_hw[0] / input_hw[0], frame_hw[1] / input_hw[1]) + 1
    np.testing.assert_allclose(mapped, np.array(rect, np.float32), atol=step)


def test_boxes_are_clipped_to_the_part_of_the_frame_the_model_saw():
    spec = _spec(100, 100, crop="square")
    mapping = box_map(spec, (480, 640, 3))
    # the square crop of a 640x480 frame is x 80..560: a box over the whole input covers exactly it
    np.testing.assert_allclose(mapping(np.array([[-20, -20, 120, 120]], np.float32))[0], [80, 0, 560, 480])
    assert mapping.size == (640, 480)


def test_letterbox_padding_is_removed():
    spec = _spec(160, 160, resize="letterbox")
    mapping = box_map(spec, (480, 640))
    # 640x480 -> 160x120 inside 160x160: 20 px of padding above; input y 20 is frame y 0
    np.testing.assert_allclose(mapping(np.array([[0, 20, 160, 140]], np.float32))[0], [0, 0, 640, 480])


def test_identity_map_keeps_input_pixels():
    spec = _spec(120, 160)
    np.testing.assert_allclose(identity_map(spec)(np.array([[10, 20, 30, 200]], np.float32))[0], [10, 20, 30, 120])


def test_detections_json_and_text():
    found = Detections((Detection(2, "cat", 0.91234567, (1.234, 2.0, 30.5, 40.0)),
                        Detection(0, "dog", 0.5, (0, 0, 1, 1))), (640, 480))
    d = found.to_dict()
    assert d["count"] == 2 and d["image_size"] == [640, 480]
    assert d["detections"][0] == {"index": 2, "label": "cat", "score": 0.912346, "box": [1.23, 2.0, 30.5, 40.0]}
    assert found.top.label == "cat" and found.labels == ("cat", "dog") and len(found) == 2
    assert str(found).startswith("cat 0.91 [1, 2, 30, 40]")
    empty = Detections(())
    assert empty.top is None and str(empty) == "nothing detected" and "image_size" not in empty.to_dict()
