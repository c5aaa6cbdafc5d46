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


# --- without OpenCV: numpy resize/colour (edgekit.imgops) and Pillow decoding ------------------------------------

SIZES = [((200, 200), (32, 32)), ((360, 640), (224, 224)), ((360, 640), (96, 128)), ((28, 28), (32, 32)),
         ((7, 9), (32, 32)), ((64, 48), (32, 32))]


@pytest.mark.parametrize(("src", "dst"), SIZES)
@pytest.mark.parametrize("interpolation", ["area", "linear", "nearest"])
def test_numpy_resize_follows_opencv(src, dst, interpolation):
    from edgekit import imgops

    rng = np.random.default_rng(0)
    codes = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST}
    for img in (rng.integers(0, 256, src, dtype=np.uint8), rng.integers(0, 256, (*src, 3), dtype=np.uint8)):
        ref = cv2.resize(img, dst[::-1], interpolation=codes[interpolation])
        got = imgops.resize(img, *dst, interpolation)
        assert got.shape == ref.shape and got.dtype == np.uint8
        assert np.abs(got.astype(int) - ref).max() <= 1  # float vs OpenCV's fixed point: one grey level at most


def test_numpy_gray_and_channel_order_are_identical_to_opencv():
    from edgekit import imgops

    bgr = np.random.default_rng(1).integers(0, 256, (97, 131, 3), dtype=np.uint8)
    bgra = np.dstack([bgr, np.full(bgr.shape[:2], 7, np.uint8)])
    np.testing.assert_array_equal(imgops.bgr_to_gray(bgr), cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY))
    np.testing.assert_array_equal(imgops.convert_colour(bgra, "gray"), cv2.cvtColor(bgra, cv2.COLOR_BGRA2GRAY))
    np.testing.assert_array_equal(imgops.convert_colour(bgr, "rgb"), cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    np.testing.assert_array_equal(imgops.convert_colour(bgra, "bgr"), bgr)
    gray = bgr[..., 0]
    np.testing.assert_array_equal(imgops.convert_colour(gray, "rgb"), cv2.cvtColor(gray, cv2.COLOR_GRAY2RGB))


@pytest.fixture
def no_opencv(monkeypatch):
    """edgekit.image as on a device without OpenCV (the lookup is cached, so patch its user)."""
    import edgekit.image

    monkeypatch.setattr(edgekit.image, "optional_cv2", lambda: None)


def _specs():
    return [InputSpec(shape=(1, 32, 32, 1), dtype="uint8", scale=1 / 255, zero_point=0, crop=(200, 200)),
            InputSpec(shape=(1, 96, 96, 3), dtype="int8", scale=0.02, zero_point=-3, mean=(127.5,), std=(127.5,)),
            InputSpec(shape=(1, 3, 64, 64), layout="NCHW", colour="bgr", resize="letterbox")]


def test_preprocessing_without_opencv_gives_the_same_tensors(monkeypatch):
    # A model calibrated on a host with OpenCV must see the same tensors on a device without it.
    import edgekit.image
    from edgekit.camera import synthetic_frame

    frames = [synthetic_frame(i, 640, 360) for i in (0, 17)]
    full = {k: [Preprocessor(spec)(f) for f in frames] for k, spec in enumerate(_specs())}
    monkeypatch.setattr(edgekit.image, "optional_cv2", lambda: None)
    for k, spec in enumerate(_specs()):
        for a, b in zip((Preprocessor(spec)(f) for f in frames), full[k]):
            assert a.shape == b.shape and a.dtype == b.dtype
            # one grey level: one quantisation step (or less), or 1/std of a float input
            tolerance = 1 if spec.quantized else 1 / spec.std[0]
            assert np.abs(a.astype(np.float64) - b.astype(np.float64)).max() <= tolerance + 1e-6


def test_pillow_decodes_like_opencv(tmp_path, no_opencv):
    rng = np.random.default_rng(2)
    bgr = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "c.png"), bgr)
    cv2.imwrite(str(tmp_path / "g.png"), bgr[..., 1])
    cv2.imwrite(str(tmp_path / "a.png"), np.dstack([bgr, np.full((40, 50), 200, np.uint8)]))
    cv2.imwrite(str(tmp_path / "w.png"), (bgr[..., 0].astype(np.uint16) * 257))
    np.testing.assert_array_equal(read_image(tmp_path / "c.png"), bgr)
    np.testing.assert_array_equal(read_image(tmp_path / "g.png"), bgr[..., 1])
    np.testing.assert_array_equal(read_image(tmp_path / "a.png"), bgr)
    np.testing.assert_array_equal(read_image(tmp_path / "w.png"), bgr[..., 0])
    smooth = cv2.GaussianBlur(bgr, (7, 7), 3)
    cv2.imwrite(str(tmp_path / "j.jpg"), smooth)
    assert np.abs(read_image(tmp_path / "j.jpg").astype(int) - cv2.imread(str(tmp_path / "j.jpg"))).max() <= 2
    (tmp_path / "cut.jpg").write_bytes((tmp_path / "j.jpg").read_bytes()[:300])
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    for bad in ("cut.jpg", "junk.png"):
        with pytest.raises(ImageReadError):
            read_image(tmp_path / bad)
