"""The segment head (edgekit/heads/segment.py): MediaPipe's mask conventions (one probability channel,
a logit, softmax over classes), each class's area and box in the frame's pixels through the model's own
resize, the masks in the JSON only when asked (COCO run-length), options checked in one line."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.errors import UsageError
from edgekit.heads.segment import OPTIONS, Segmentation, grid_of, rle, segment
from edgekit.heads.table import TASK_HEADS, make_decoder
from edgekit.imaging.image import InputSpec


class _Runtime:
    def __init__(self, spec: InputSpec, quant=None):
        self.input_spec = spec
        self.output_quantization = quant


WIDE = InputSpec(shape=(1, 4, 8, 3))  # 8 wide, 4 high, like the landscape selfie model's 256x144


def _square(top: int, left: int, size: int, value: float = 0.9, shape=(1, 4, 8, 1)) -> np.ndarray:
    m = np.full(shape, 0.1, np.float32)
    m[0, top : top + size, left : left + size, 0] = value
    return m


def test_the_row_lists_the_heads_own_options():
    assert TASK_HEADS["segment"].options is OPTIONS
    assert [o.name for o in OPTIONS] == ["output", "activation", "threshold", "channels", "class_names", "masks"]


def test_a_known_mask_gives_its_area_and_box_in_frame_pixels():
    decode = make_decoder("segment", ("person",), _Runtime(WIDE))
    out = decode([_square(1, 2, 2)], frame_shape=(40, 80, 3))  # stretched x10 each way
    (seg,) = out.segments
    assert (seg.label, seg.index) == ("person", 0)
    assert seg.area == pytest.approx(4 / 32) and seg.box == (20.0, 10.0, 40.0, 30.0)
    assert seg.score == pytest.approx(0.9)
    assert str(out) == "person 12.5% [20, 10, 40, 30]"
    assert out.frame_mask(0).sum() == 20 * 20 and out.frame_mask(0)[15, 25] and not out.frame_mask(0)[5, 5]
    d = out.to_dict()
    assert d == {"segments": [{"index": 0, "label": "person", "area": 0.125, "box": [20.0, 10.0, 40.0, 30.0],
                               "score": 0.9}], "count": 1, "image_size": [80, 40]}  # compact: no mask


def test_without_a_frame_the_mask_is_in_input_pixels_and_a_coarser_grid_scales_up():
    decode = make_decoder("segment", (), _Runtime(InputSpec(shape=(1, 8, 16, 3))))
    out = decode([_square(1, 2, 2)])  # a 4 x 8 grid for an 8 x 16 input: 2 px a cell
    assert out.segments[0].box == (4.0, 2.0, 8.0, 6.0) and out.segments[0].label == "mask"
    assert out.grid.size == (16, 8)


def test_a_letterboxed_input_leaves_the_padding_out_of_area_and_box():
    spec = InputSpec(shape=(1, 8, 8, 3), resize="letterbox")
    m = np.zeros((1, 8, 8, 1), np.float32)
    m[0, :, :4] = 1.0  # the left half, padding rows included
    out = make_decoder("segment", (), _Runtime(spec))([m], frame_shape=(40, 80, 3))  # 80x40 -> 8x4 at rows 2..6
    (seg,) = out.segments
    assert seg.box == (0.0, 0.0, 40.0, 40.0) and seg.area == pytest.approx(0.5)


def test_a_logit_takes_sigmoid_and_the_threshold_is_inclusive():
    logits = np.full((1, 4, 8, 1), -5.0, np.float32)
    logits[0, 0, 0, 0] = 0.0  # sigmoid 0.5: at the threshold, in the mask
    out = make_decoder("segment", (), _Runtime(WIDE), activation="sigmoid")([logits])
    assert out.segments[0].area == pytest.approx(1 / 32)
    assert not make_decoder("segment", (), _Runtime(WIDE), activation="sigmoid", threshold=0.51)([logits]).segments


def test_softmax_over_classes_is_the_category_mask_and_channels_pick_the_reported_ones():
    logits = np.zeros((1, 4, 8, 3), np.float32)
    logits[0, 2:, 4:, 0] = 3.0  # background bottom right
    logits[0, :, :4, 1] = 3.0  # hair on the left half
    logits[0, :2, 4:, 2] = 3.0  # class 2 top right
    logits[0, 3, 7] = 0.0  # one pixel of three equal classes: none reaches 0.5, it goes nowhere
    decode = make_decoder("segment", ("background", "hair", "skin"), _Runtime(WIDE), activation="softmax")
    out = decode([logits])
    assert [(s.label, s.area) for s in out.segments] == [("background", 7 / 32), ("hair", 0.5), ("skin", 0.25)]
    only = make_decoder("segment", (), _Runtime(WIDE), activation="softmax", channels=[1],
                        class_names=["bg", "hair"])
    (seg,) = only([logits]).segments
    assert (seg.index, seg.label, seg.area) == (1, "hair", 0.5)
    assert make_decoder("segment", (), _Runtime(WIDE), activation="softmax")([logits]).segments[2].label == "class_2"


def test_channels_first_and_quantised_outputs_decode_alike():
    nchw = np.zeros((1, 2, 4, 8), np.float32)
    nchw[0, 1, 1:3, 2:4] = 1.0
    nchw[0, 0] = 1.0 - nchw[0, 1]
    assert grid_of(nchw).shape == (4, 8, 2)
    out = make_decoder("segment", (), _Runtime(WIDE), channels=[1])([nchw])
    assert out.segments[0].area == pytest.approx(4 / 32)
    q = np.round(_square(1, 2, 2) / (1 / 255)).astype(np.uint8)  # uint8 probabilities, scale 1/255
    quant = make_decoder("segment", (), _Runtime(WIDE, [(1 / 255, 0)]))([q])
    assert quant.segments[0].area == pytest.approx(4 / 32) and quant.segments[0].score == pytest.approx(0.9, abs=0.01)


def test_no_pixel_means_no_segment():
    out = make_decoder("segment", (), _Runtime(WIDE))([np.zeros((1, 4, 8, 1), np.float32)])
    assert out.segments == () and str(out) == "no mask" and out.to_dict()["count"] == 0


def _decode_rle(d: dict) -> np.ndarray:
    h, w = d["size"]
    flat, value = [], False
    for n in d["counts"]:
        flat += [value] * n
        value = not value
    return np.array(flat, bool).reshape(w, h).T  # column-major, COCO's order


def test_masks_true_puts_each_mask_in_the_json_as_coco_run_length():
    m = _square(1, 2, 2)
    m[0, 0, 0, 0] = 0.9  # a mask starting on its first pixel: a zero run first
    out = segment((), _Runtime(WIDE), masks=True)([m], frame_shape=(40, 80, 3))
    d = out.to_dict()
    assert np.array_equal(_decode_rle(d["segments"][0]["mask"]), m[0, :, :, 0] >= 0.5)
    assert d["segments"][0]["mask"]["counts"][0] == 0 and d["mask_box"] == [0.0, 0.0, 80.0, 40.0]
    assert rle(np.zeros((2, 3), bool)) == {"size": [2, 3], "counts": [6]}


@pytest.mark.parametrize("options,message", [
    ({"activation": "relu"}, "segment activation must be one of"),
    ({"threshold": 1.5}, "segment threshold must be"),
    ({"treshold": 0.4}, "did you mean 'threshold'"),
])
def test_a_bad_option_is_one_line(options, message):
    with pytest.raises(UsageError, match=message):
        make_decoder("segment", (), _Runtime(WIDE), **options)


def test_an_output_or_channel_the_model_lacks_is_one_line():
    with pytest.raises(UsageError, match="channel 3 asked for, the mask output has 1"):
        make_decoder("segment", (), _Runtime(WIDE), channels=[3])([_square(0, 0, 1)])
    with pytest.raises(UsageError, match="the model has 1 outputs, no output 2"):
        make_decoder("segment", (), _Runtime(WIDE), output=2)([_square(0, 0, 1)])
    with pytest.raises(UsageError, match=r"a mask output is \[1, H, W, C\]"):
        make_decoder("segment", (), _Runtime(WIDE))([np.zeros((1, 2, 2, 2, 2), np.float32)])


def test_a_result_is_a_segmentation_with_every_reported_mask_kept():
    out = make_decoder("segment", (), _Runtime(WIDE))([_square(1, 2, 2)])
    assert isinstance(out, Segmentation) and out.masks.shape == (1, 4, 8) and out.masks.sum() == 4
