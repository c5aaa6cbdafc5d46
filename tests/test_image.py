"""Preprocessing: the one copy of the code calibration and the device share."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgekit.image import ImageReadError, InputSpec, Preprocessor, crop_center, pixel_lut, read_image, resize


def test_center_crop_matches_seed_window():
    frame = np.arange(360 * 640, dtype=np.uint32).reshape(360, 640)
    win = crop_center(frame, (200, 200))
    assert win.shape == (200, 200)
    assert win[0, 0] == frame[80, 220]  # (360-200)/2, (640-200)/2


def test_crop_clamps_to_small_images_and_square():
    img = np.zeros((28, 40), np.uint8)
    assert crop_center(img, (200, 200)).shape == (28, 40)
    assert crop_center(img, "square").shape == (28, 28)
    assert crop_center(img, None).shape == (28, 40)


def test_float_preprocessing_equals_formula():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (360, 640, 3), dtype=np.uint8)
    spec = InputSpec(shape=(1, 32, 32, 3), colour="rgb", mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4))
    out = Preprocessor(spec)(frame)
    rgb = cv2.resize(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), (32, 32), interpolation=cv2.INTER_AREA)
    expected = (rgb.astype(np.float64) - np.array(spec.mean)) / np.array(spec.std)
    assert out.shape == (1, 32, 32, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-5)


def test_quantised_lut_matches_round_and_clip():
    spec = InputSpec(shape=(1, 8, 8, 1), dtype="int8", scale=1 / 255, zero_point=-128, colour="gray")
    lut = pixel_lut(spec)[0]
    pixels = np.arange(256)
    expected = np.clip(np.round((pixels / 255.0) / (1 / 255)) - 128, -128, 127)
    np.testing.assert_array_equal(lut.astype(np.int64), expected)
    out = Preprocessor(spec)(np.full((10, 10), 255, np.uint8))
    assert out.dtype == np.int8 and out.max() == 127


def test_nchw_layout_and_gray_from_bgr():
    frame = np.zeros((50, 60, 3), np.uint8)
    frame[..., 2] = 255  # pure red in BGR
    spec = InputSpec(shape=(1, 1, 16, 16), layout="NCHW", colour="gray")
    out = Preprocessor(spec)(frame)
    assert out.shape == (1, 1, 16, 16)
    assert abs(out.mean() - 76 / 255) < 0.01  # BT.601 luma of red is 0.299


def test_letterbox_keeps_aspect():
    img = np.full((100, 200), 255, np.uint8)
    out = resize(img, 64, 64, mode="letterbox")
    assert out.shape == (64, 64)
    assert out[0, 32] == 0 and out[32, 32] == 255  # padded rows top/bottom, content in the middle


def test_read_image_rejects_truncated_and_garbage(tmp_path):
    img = (np.random.default_rng(1).random((40, 40, 3)) * 255).astype(np.uint8)
    good = tmp_path / "a.jpg"
    cv2.imwrite(str(good), img)
    assert read_image(good).shape == (40, 40, 3)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ImageReadError):
        read_image(cut)
    junk = tmp_path / "junk.png"
    junk.write_text("not an image")
    with pytest.raises(ImageReadError):
        read_image(junk)


def test_read_image_16bit_and_alpha(tmp_path):
    img16 = np.full((10, 10), 65535, np.uint16)
    cv2.imwrite(str(tmp_path / "g16.png"), img16)
    assert read_image(tmp_path / "g16.png").max() == 255
    rgba = np.zeros((10, 10, 4), np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), rgba)
    assert read_image(tmp_path / "a.png").shape == (10, 10, 3)


def test_spec_round_trips_through_dict():
    spec = InputSpec(shape=(1, 32, 32, 1), dtype="uint8", scale=0.0039, zero_point=0, colour="gray", crop=(200, 200))
    assert InputSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("spec", [
    InputSpec(shape=(1, 16, 16, 3), mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4)),
    InputSpec(shape=(1, 16, 16, 3), dtype="int8", scale=0.02, zero_point=-3, mean=(1.0, 2.0, 3.0)),
    InputSpec(shape=(1, 16, 16, 3), dtype="float16"),
    InputSpec(shape=(1, 16, 16, 1), dtype="uint8", scale=1 / 255, zero_point=0, colour="gray"),
])
def test_fast_lookup_equals_per_channel_table(spec):
    frame = np.random.default_rng(3).integers(0, 256, (90, 160, 3), dtype=np.uint8)
    prep = Preprocessor(spec)
    img = prep.shaped(frame).reshape(16, 16, spec.channels)
    lut = pixel_lut(spec)
    expected = np.stack([lut[c][img[..., c]] for c in range(spec.channels)], axis=-1)
    out = prep(frame)
    assert out.dtype == np.dtype(spec.dtype)
    np.testing.assert_array_equal(out[0], expected)
