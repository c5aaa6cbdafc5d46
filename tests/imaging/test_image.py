"""Preprocessing: the one copy of the code calibration and the device share."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgekit.imaging.image import (
    ImageReadError,
    InputSpec,
    InputSpecError,
    Preprocessor,
    convert_colour,
    crop_center,
    pixel_lut,
    read_image,
    resize,
)
from edgekit.imaging.imgops import crop_window, letterbox_window


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


# --- without OpenCV: numpy resize/colour (edgekit.imaging.imgops) and Pillow decoding ---------------------------------

SIZES = [((200, 200), (32, 32)), ((360, 640), (224, 224)), ((360, 640), (96, 128)), ((28, 28), (32, 32)),
         ((7, 9), (32, 32)), ((64, 48), (32, 32))]


@pytest.mark.parametrize(("src", "dst"), SIZES)
@pytest.mark.parametrize("interpolation", ["area", "linear", "nearest", "cubic"])
def test_numpy_resize_follows_opencv(src, dst, interpolation):
    from edgekit.imaging import imgops

    rng = np.random.default_rng(0)
    codes = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST,
             "cubic": cv2.INTER_CUBIC}
    for img in (rng.integers(0, 256, src, dtype=np.uint8), rng.integers(0, 256, (*src, 3), dtype=np.uint8)):
        ref = cv2.resize(img, dst[::-1], interpolation=codes[interpolation])
        got = imgops.resize(img, *dst, interpolation)
        assert got.shape == ref.shape and got.dtype == np.uint8
        assert np.abs(got.astype(int) - ref).max() <= 1  # float vs OpenCV's fixed point: one grey level at most


def test_numpy_gray_and_channel_order_are_identical_to_opencv():
    from edgekit.imaging import imgops

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
    """edgekit.imaging.image as on a device without OpenCV (the lookup is cached, so patch its user)."""
    import edgekit.imaging.image

    monkeypatch.setattr(edgekit.imaging.image, "optional_cv2", lambda: None)


def _specs():
    return [InputSpec(shape=(1, 32, 32, 1), dtype="uint8", scale=1 / 255, zero_point=0, crop=(200, 200)),
            InputSpec(shape=(1, 96, 96, 3), dtype="int8", scale=0.02, zero_point=-3, mean=(127.5,), std=(127.5,)),
            InputSpec(shape=(1, 3, 64, 64), layout="NCHW", colour="bgr", resize="letterbox")]


def test_preprocessing_without_opencv_gives_the_same_tensors(monkeypatch):
    # A model calibrated on a host with OpenCV must see the same tensors on a device without it.
    import edgekit.imaging.image
    from edgekit.camera import synthetic_frame

    frames = [synthetic_frame(i, 640, 360) for i in (0, 17)]
    full = {k: [Preprocessor(spec)(f) for f in frames] for k, spec in enumerate(_specs())}
    monkeypatch.setattr(edgekit.imaging.image, "optional_cv2", lambda: None)
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


# --- values, boundaries, messages and fallbacks the mutation run found unpinned (issue 18, docs/mutation.md) ---

def _problem(**kw):
    """The message of InputSpecError for a spec built from ``kw`` (None when it is fine)."""
    try:
        InputSpec(**{"shape": (1, 8, 8, 3), **kw}).check()
    except InputSpecError as exc:
        assert exc.hint == "rebuild the bundle, or fix the preprocessing given to edgekit build"
        return exc.message
    return None


def test_spec_sides_and_channels_in_both_layouts():
    nhwc, nchw = InputSpec(shape=(2, 20, 30, 3)), InputSpec(shape=(2, 3, 20, 30), layout="NCHW")
    for spec in (nhwc, nchw):
        assert (spec.height, spec.width, spec.channels) == (20, 30, 3)
    assert InputSpec(shape=(1, 8, 8, 1), dtype="int16", scale=1.0).quantized
    assert not InputSpec(shape=(1, 8, 8, 1), dtype="float16").quantized


def test_spec_dict_form_lists_sequences_and_keeps_crop_words():
    d = InputSpec(shape=(1, 8, 8, 3), crop=(4, 6), mean=(1.0, 2.0, 3.0), std=(4.0,)).to_dict()
    assert (d["shape"], d["crop"], d["mean"], d["std"]) == ([1, 8, 8, 3], [4, 6], [1.0, 2.0, 3.0], [4.0])
    assert InputSpec(shape=(1, 8, 8, 3), crop="square").to_dict()["crop"] == "square"
    assert InputSpec(shape=(1, 8, 8, 3)).to_dict()["crop"] is None


def test_spec_from_untrusted_dicts():
    def refusal(d):
        with pytest.raises(InputSpecError) as err:
            InputSpec.from_dict(d)
        return err.value.message

    assert refusal([1, 8, 8, 3]) == "input is list, not an object"
    assert refusal({"dtype": "float32"}) == "input has no 'shape'"
    for shape, word in (([1, 2.5, 8, 3], "2.5"), ([1, True, 8, 3], "True"), ([1, "8", 8, 3], "'8'")):
        assert refusal({"shape": shape}) == f"input is malformed: {word} is not a whole number"
    assert refusal({"shape": [1, 8, 8, 3], "std": ["wide"]}).startswith("input is malformed: could not convert")
    spec = InputSpec.from_dict({"shape": [1, 8, 8, 3], "crop": [4, 6], "mean": [1, 2, 3], "std": [2],
                                "extra": {"kept": 1}, "source": "keras"})
    assert spec.crop == (4, 6) and spec.mean == (1.0, 2.0, 3.0) and spec.std == (2.0,)
    assert spec.extra == {"kept": 1, "source": "keras"}
    assert InputSpec.from_dict({"shape": [1, 8, 8, 3], "crop": "square"}).crop == "square"


def test_spec_choices_are_named_in_the_refusal():
    assert _problem(dtype="float64") == "input dtype 'float64' is not one of float32, float16, uint8, int8, int16"
    assert _problem(layout="HWC") == "input layout 'HWC' is not one of NHWC, NCHW"
    assert _problem(colour="yuv") == "input colour 'yuv' is not one of gray, rgb, bgr"
    assert _problem(resize="crop") == "input resize 'crop' is not one of stretch, letterbox"
    assert _problem(interpolation="lanczos") == (
        "input interpolation 'lanczos' is not one of area, linear, nearest, cubic")
    assert len(_problem(dtype="x" * 400)) == 300  # an untrusted value cannot flood the error line


def test_spec_shape_limits():
    batch = "is not a batch of images (N, H, W, C or N, C, H, W; every size >= 1)"
    for shape in ((1, 8, 8), (1, 8, 8, 3, 1), (0, 8, 8, 3), (1, 8, 0, 3), (1, 8, 8.0, 3), (1, True, 8, 3)):
        assert _problem(shape=shape) == f"input shape {list(shape)} {batch}", shape
    feeds = "is not an image batch edgekit feeds (1 or 3 channels, sides <= 16384)"
    for shape in ((1, 16384, 1, 1), (1, 1, 16384, 3), (64, 8, 8, 3)):
        assert _problem(shape=shape) is None, shape
    for shape in ((1, 16385, 1, 1), (1, 1, 16385, 3), (1, 8, 8, 2), (1, 8, 8, 4), (65, 8, 8, 3)):
        assert _problem(shape=shape) == f"input shape {list(shape)} {feeds}", shape
    assert _problem(shape=(1, 1, 16385, 1), layout="NCHW") is not None  # height of NCHW
    assert _problem(shape=(1, 1, 1, 16385), layout="NCHW") is not None  # width of NCHW
    assert _problem(shape=(1, 3, 16384, 16384), layout="NCHW", mean=(0.0,)) is None


def test_spec_crop_limits():
    for crop in (None, "none", "square", (1, 1), (16384, 16384), [5, 7], "3:4", "480:640"):
        assert _problem(crop=crop) is None, crop
    for crop in ((0, 5), (5, 16385), (True, 5), (5.0, 5), (5,), (5, 5, 5), "centre", 5, "0:4", "3:", "-3:4",
                 "3:4:5", "123456:1"):
        assert _problem(crop=crop) == (f"input crop {crop!r} must be null, 'square', [height, width] in pixels "
                                       "(1 to 16384) or an aspect 'h:w'"), crop


def test_spec_pad_value_limits():
    for value in (0, 114, 255):
        assert _problem(pad_value=value) is None
    for value in (-1, 256, 114.0, True, "114", None):
        assert _problem(pad_value=value) == (
            f"input pad_value {value!r} must be a whole number from 0 to 255 (a letterbox's border)"), value


def test_spec_normalisation_and_quantisation_limits():
    assert _problem(mean=(1.0, 2.0)) == "input mean (1.0, 2.0) must be 1 or 3 finite numbers"
    assert _problem(std=(1.0, float("nan"), 1.0)) == "input std (1.0, nan, 1.0) must be 1 or 3 finite numbers"
    assert _problem(mean=5.0) == "input mean 5.0 must be 1 or 3 finite numbers"
    assert _problem(mean=("1",)) == "input mean ('1',) must be 1 or 3 finite numbers"
    assert _problem(mean=[1, 2, 3], std=[255]) is None
    assert _problem(std=(1.0, 0.0, 1.0)) == "input std [1.0, 0.0, 1.0] has a zero (pixel = (value - mean) / std)"
    for scale in (None, 0, -0.5, float("inf"), "0.1"):
        assert _problem(dtype="int8", scale=scale) == (
            f"input dtype int8 needs a positive quantisation scale, not {scale!r}"), scale
    assert _problem(dtype="int8", scale=1) is None
    for dtype, lo, hi in (("uint8", 0, 255), ("int8", -128, 127), ("int16", -32768, 32767)):
        assert _problem(dtype=dtype, scale=0.5, zero_point=lo) is None
        assert _problem(dtype=dtype, scale=0.5, zero_point=hi) is None
        for bad in (lo - 1, hi + 1):
            assert _problem(dtype=dtype, scale=0.5, zero_point=bad) == f"input zero_point {bad} does not fit {dtype}"
    assert _problem(dtype="uint8", scale=0.5, zero_point=1.5) == "input zero_point 1.5 does not fit uint8"
    assert _problem(dtype="uint8", scale=0.5, zero_point=None) is None
    assert _problem(zero_point=1000) is None  # a float input has no zero point to check


def test_with_quantization_keeps_the_preprocessing():
    spec = InputSpec(shape=(1, 8, 8, 3), crop="square", mean=(127.5,), std=(127.5,), name="x")
    q = spec.with_quantization("int8", 0.5, -3)
    assert (q.dtype, q.scale, q.zero_point) == ("int8", 0.5, -3)
    assert (q.crop, q.mean, q.std, q.name, q.shape) == ("square", (127.5,), (127.5,), "x", (1, 8, 8, 3))


def test_crop_windows():
    assert crop_window(10, 20, None) == crop_window(10, 20, "none") == (0, 0, 10, 20)
    assert crop_window(10, 20, "square") == (0, 5, 10, 10)
    assert crop_window(20, 10, "square") == (5, 0, 10, 10)
    assert crop_window(11, 20, (4, 5)) == (3, 7, 4, 5)
    assert crop_window(10, 20, (30, 6)) == (0, 7, 10, 6)
    assert crop_window(10, 20, (4, 30)) == (3, 0, 4, 20)
    frame = np.arange(200).reshape(10, 20)
    assert crop_center(frame, "none") is frame
    np.testing.assert_array_equal(crop_center(frame, (4, 5)), frame[3:7, 7:12])


def test_letterbox_windows():
    assert letterbox_window(100, 200, 64, 64) == (16, 0, 32, 64)
    assert letterbox_window(200, 100, 64, 64) == (0, 16, 64, 32)
    assert letterbox_window(1, 1000, 10, 10) == (4, 0, 1, 10)  # never a zero-pixel side
    assert letterbox_window(1000, 1, 10, 10) == (0, 4, 10, 1)
    assert letterbox_window(30, 40, 30, 40) == (0, 0, 30, 40)


def test_letterbox_places_the_image_in_its_window_on_black(no_cv2_too):
    img = np.full((100, 200, 3), 200, np.uint8)
    out = resize(img, 64, 64, mode="letterbox")
    assert out.shape == (64, 64, 3) and out.dtype == np.uint8
    assert (out[16:48] == 200).all() and (out[:16] == 0).all() and (out[48:] == 0).all()


@pytest.fixture(params=["opencv", "numpy"])
def no_cv2_too(request, monkeypatch):
    """Run a test with OpenCV, then again as on a device without it."""
    import edgekit.imaging.image

    if request.param == "numpy":
        monkeypatch.setattr(edgekit.imaging.image, "optional_cv2", lambda: None)
    return request.param


def test_resize_refuses_unknown_interpolation_and_keeps_a_frame_already_the_size(no_cv2_too):
    frame = np.zeros((8, 8), np.uint8)
    with pytest.raises(ValueError, match="^unknown interpolation 'lanczos'; use area, linear, nearest, cubic$"):
        resize(frame, 8, 8, interpolation="lanczos")
    assert resize(frame, 8, 8) is frame and resize(frame, 8, 8, mode="letterbox") is frame


@pytest.mark.parametrize(("interpolation", "code"), [
    ("area", cv2.INTER_AREA), ("linear", cv2.INTER_LINEAR), ("nearest", cv2.INTER_NEAREST), ("cubic", cv2.INTER_CUBIC)])
def test_resize_uses_the_interpolation_asked_for(interpolation, code, no_cv2_too):
    img = np.random.default_rng(5).integers(0, 256, (20, 60, 3), dtype=np.uint8)
    assert letterbox_window(20, 60, 16, 24) == (4, 0, 8, 24)
    for got, ref in ((resize(img, 16, 24, interpolation=interpolation), cv2.resize(img, (24, 16), interpolation=code)),
                     (resize(img, 16, 24, "letterbox", interpolation)[4:12],
                      cv2.resize(img, (24, 8), interpolation=code))):
        # OpenCV's own result; numpy's differs by one grey level at most (fixed point vs float)
        assert np.abs(got.astype(int) - ref).max() <= (0 if no_cv2_too == "opencv" else 1)
    # the Preprocessor passes the spec's interpolation on
    spec = InputSpec(shape=(1, 16, 24, 3), colour="bgr", interpolation=interpolation)
    shaped = Preprocessor(spec).shaped(img)
    assert np.abs(shaped.astype(int) - cv2.resize(img, (24, 16), interpolation=code)).max() <= (
        0 if no_cv2_too == "opencv" else 1)


def test_colour_conversion_of_every_frame_kind(no_cv2_too):
    rng = np.random.default_rng(6)
    bgr = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)
    bgra = np.dstack([bgr, np.full((9, 11), 9, np.uint8)])
    gray = bgr[..., 1].copy()
    expected = {"gray": cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY), "rgb": bgr[..., ::-1], "bgr": bgr}
    for colour in ("gray", "rgb", "bgr"):
        np.testing.assert_array_equal(convert_colour(bgr, colour), expected[colour])
        np.testing.assert_array_equal(convert_colour(bgra, colour), expected[colour])
    assert convert_colour(gray, "gray") is gray or no_cv2_too == "numpy"
    np.testing.assert_array_equal(convert_colour(gray, "gray"), gray)
    np.testing.assert_array_equal(convert_colour(gray[..., None], "gray"), gray)  # HxWx1 is gray
    for colour in ("rgb", "bgr"):
        np.testing.assert_array_equal(convert_colour(gray, colour), np.dstack([gray] * 3))
    assert convert_colour(bgr, "bgr") is bgr or no_cv2_too == "numpy"
    with pytest.raises(ValueError, match="^frames have 1, 3 or 4 channels, not 2$"):
        convert_colour(np.zeros((4, 4, 2), np.uint8), "rgb")


def test_pixel_tables():
    rgb = InputSpec(shape=(1, 8, 8, 3), mean=(0.0, 100.0, 200.0), std=(1.0, 2.0, 4.0), dtype="float16")
    lut = pixel_lut(rgb)
    assert lut.shape == (3, 256) and lut.dtype == np.float16
    assert (lut[0, 255], lut[1, 0], lut[2, 255]) == (255.0, -50.0, 13.75)
    with pytest.raises(ValueError, match="^input dtype int8 needs a quantisation scale$"):
        pixel_lut(InputSpec(shape=(1, 8, 8, 1), dtype="int8"))  # unchecked: check() refuses it first
    no_zero = InputSpec(shape=(1, 8, 8, 1), dtype="uint8", scale=1 / 255, zero_point=None)
    np.testing.assert_array_equal(pixel_lut(no_zero)[0], np.arange(256))
    clipped = InputSpec(shape=(1, 8, 8, 1), dtype="int16", scale=1 / 255 / 300, zero_point=-32768, mean=(1.0,))
    table = pixel_lut(clipped)[0]
    assert table.dtype == np.int16  # clipped to int16's range at both ends, not wrapped
    assert (table[0], table[1], table[128], table[255]) == (-32768, -32768, 127 * 300 - 32768, 32767)


def test_preprocessor_refuses_bad_specs_and_frames(no_cv2_too):
    with pytest.raises(InputSpecError, match="crop"):
        Preprocessor(InputSpec(shape=(1, 8, 8, 3), crop=(-5, 5)))
    prep = Preprocessor(InputSpec(shape=(1, 8, 8, 3)))
    with pytest.raises(ValueError, match="^frames must be uint8, got float32$"):
        prep(np.zeros((8, 8, 3), np.float32))
    for shape in ((1, 8, 8, 3), (8,), (0, 8, 3), (8, 0)):
        with pytest.raises(ValueError, match=r"^frames must be HxW or HxWxC with pixels, got shape"):
            prep(np.zeros(shape, np.uint8))
    with pytest.raises(ValueError, match="^frames have 1, 3 or 4 channels, not 2$"):  # not wrapped: not cv2's
        prep(np.zeros((8, 8, 2), np.uint8))


@pytest.mark.parametrize("spec", [
    InputSpec(shape=(1, 3, 6, 6), layout="NCHW", mean=(10.0, 20.0, 30.0)),
    InputSpec(shape=(1, 6, 6, 3), dtype="int8", scale=0.5, zero_point=-100, mean=(0.0, 1.0, 2.0), std=(1.0,)),
    InputSpec(shape=(1, 6, 6, 3), dtype="float16", mean=(0.0, 1.0, 2.0)),
    InputSpec(shape=(1, 1, 6, 6), layout="NCHW", colour="gray", dtype="float16"),
])
def test_every_table_lookup_path_gives_the_formula(spec, no_cv2_too):
    frame = np.random.default_rng(7).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    img = Preprocessor(spec).shaped(frame).reshape(6, 6, spec.channels).astype(np.float64)
    x = (img - np.array(spec.mean)) / np.array(spec.std)
    if spec.quantized:
        x = np.clip(np.round(x / spec.scale) + spec.zero_point, -128, 127)
    if spec.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    out = Preprocessor(spec)(frame)
    assert out.shape == spec.shape and out.dtype == np.dtype(spec.dtype) and out.flags.c_contiguous
    np.testing.assert_array_equal(out[0], x.astype(spec.dtype))


def test_read_image_jpeg_end_marker_window(tmp_path):
    ok, data = cv2.imencode(".jpg", np.full((16, 16, 3), 90, np.uint8))
    assert ok
    data = data.tobytes()
    (tmp_path / "padded.jpg").write_bytes(data + b"\0" * 62)  # end marker in the last 64 bytes
    assert read_image(tmp_path / "padded.jpg").shape == (16, 16, 3)
    (tmp_path / "far.jpg").write_bytes(data + b"\0" * 63)  # only its second byte is: looks cut off
    with pytest.raises(ImageReadError, match="far.jpg: truncated JPEG$"):
        read_image(tmp_path / "far.jpg")
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ImageReadError, match="empty.png: not a readable image$"):
        read_image(tmp_path / "empty.png")


def test_read_image_scales_deep_images_to_8_bits(tmp_path, no_cv2_too):
    from PIL import Image

    deep = np.array([[0x1234, 0x8000], [0xFFFF, 0x00FF]], np.uint16)
    cv2.imwrite(str(tmp_path / "w.png"), deep)
    Image.fromarray(deep.astype(">u2")).save(tmp_path / "be.tif")  # big-endian 16-bit (Pillow: I;16B)
    for name in ("w.png", "be.tif"):
        got = read_image(tmp_path / name)
        assert got.dtype == np.uint8 and got.tolist() == [[0x12, 0x80], [0xFF, 0x00]], name
    # float and 32-bit images have no fixed range: stretched from their min to their max
    Image.fromarray(np.array([[0.5, 1.5], [2.5, 2.5]], np.float32)).save(tmp_path / "f.tif")
    Image.fromarray(np.array([[-10, 0], [10, 10]], np.int32)).save(tmp_path / "i.tif")
    Image.fromarray(np.full((2, 2), 7.0, np.float32)).save(tmp_path / "flat.tif")
    assert read_image(tmp_path / "f.tif").dtype == np.uint8
    assert read_image(tmp_path / "f.tif").tolist() == [[0, 128], [255, 255]]
    assert read_image(tmp_path / "i.tif").tolist() == [[0, 128], [255, 255]]
    assert read_image(tmp_path / "flat.tif").tolist() == [[0, 0], [0, 0]]  # no range: no division by zero


def test_read_image_drops_alpha_into_a_contiguous_frame(tmp_path, no_cv2_too):
    bgra = np.random.default_rng(8).integers(0, 256, (5, 7, 4), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), bgra)
    img = read_image(tmp_path / "a.png")
    assert img.flags.c_contiguous
    np.testing.assert_array_equal(img, bgra[..., :3])


def test_pillow_modes_become_opencv_frames(tmp_path, no_opencv):
    from PIL import Image

    two = np.array([[0, 255], [255, 0]], np.uint8)
    Image.fromarray(two).convert("1").save(tmp_path / "bits.png")
    Image.fromarray(two).convert("LA").save(tmp_path / "la.png")
    gray_palette = Image.fromarray(np.array([[0, 1], [2, 3]], np.uint8), "P")
    gray_palette.putpalette([0, 0, 0, 80, 80, 80, 160, 160, 160, 255, 255, 255])
    gray_palette.save(tmp_path / "pgray.png")
    colour_palette = Image.fromarray(np.array([[0, 1]], np.uint8), "P")
    colour_palette.putpalette([255, 0, 0, 0, 0, 255])  # red, blue
    colour_palette.save(tmp_path / "pcolour.png")
    assert read_image(tmp_path / "bits.png").tolist() == two.tolist()
    assert read_image(tmp_path / "la.png").tolist() == two.tolist()
    assert read_image(tmp_path / "pgray.png").tolist() == [[0, 80], [160, 255]]
    assert read_image(tmp_path / "pcolour.png").tolist() == [[[0, 0, 255], [255, 0, 0]]]  # B, G, R
    (tmp_path / "bad.ppm").write_bytes(b"P6\n2 2\n255\n\x00")  # a header Pillow accepts, pixels cut off
    with pytest.raises(ImageReadError, match="not a readable image"):
        read_image(tmp_path / "bad.ppm")


def test_without_pillow_or_opencv_reading_says_what_to_install(tmp_path, no_opencv, monkeypatch):
    import sys

    from edgekit.errors import BackendUnavailable

    cv2.imwrite(str(tmp_path / "c.png"), np.zeros((4, 4), np.uint8))
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL raises ImportError
    with pytest.raises(BackendUnavailable) as err:
        read_image(tmp_path / "c.png")
    assert err.value.message == "reading c.png needs Pillow or OpenCV, and neither is installed"
    assert err.value.hint == "pip install 'edgekit-vision[images]' (Pillow, small) or 'edgekit-vision[opencv]'"


def test_preprocessor_crops_then_converts_then_resizes(no_cv2_too):
    frame = np.random.default_rng(9).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    spec = InputSpec(shape=(1, 10, 10, 3), colour="rgb", crop=(20, 20), interpolation="nearest")
    window = frame[10:30, 20:40, ::-1]  # the centred 20 x 20 window, in R, G, B order
    np.testing.assert_array_equal(Preprocessor(spec).shaped(frame), window[::2, ::2])
    np.testing.assert_array_equal(Preprocessor(spec)(frame)[0], window[::2, ::2] / np.float32(255))


def test_a_one_channel_model_gets_gray_whatever_its_colour_says(no_cv2_too):
    frame = np.random.default_rng(10).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    out = Preprocessor(InputSpec(shape=(1, 8, 8, 1)))(frame)  # colour defaults to rgb
    assert out.shape == (1, 8, 8, 1)
    np.testing.assert_array_equal(out[0, ..., 0], cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY) / np.float32(255))


def test_preprocess_is_the_one_off_preprocessor():
    from edgekit.imaging.image import preprocess

    frame = np.random.default_rng(11).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    spec = InputSpec(shape=(1, 8, 8, 3), dtype="int8", scale=0.5, zero_point=-3)
    np.testing.assert_array_equal(preprocess(frame, spec), Preprocessor(spec)(frame))


def test_with_opencv_images_are_decoded_by_opencv(tmp_path):
    # a 16-bit PGM: OpenCV keeps it 16-bit (shifted to 8 bits), Pillow widens it to 32-bit "I" (stretched)
    cv2.imwrite(str(tmp_path / "g.pgm"), np.array([[0x1234, 0x8000]], np.uint16))
    assert read_image(tmp_path / "g.pgm").tolist() == [[0x12, 0x80]]


def test_pillow_decodes_a_16_bit_pgm_like_opencv(tmp_path, no_opencv):
    cv2.imwrite(str(tmp_path / "g.pgm"), np.array([[0x1234, 0x8000]], np.uint16))
    assert read_image(tmp_path / "g.pgm").tolist() == [[0x12, 0x80]]


def test_a_palette_is_gray_only_when_every_entry_is(tmp_path, no_opencv):
    from PIL import Image

    for name, colour in (("yellow", (200, 200, 0)), ("red", (255, 0, 0)), ("magenta", (255, 0, 255))):
        im = Image.fromarray(np.zeros((1, 2), np.uint8), "P")
        im.putpalette(list(colour))
        im.save(tmp_path / f"{name}.png")
        assert Image.open(tmp_path / f"{name}.png").mode == "P"
        assert read_image(tmp_path / f"{name}.png").tolist() == [[list(colour[::-1])] * 2], name


# --- area shrink block by block (edgekit.imaging.imgops.area_shrink): OpenCV's INTER_AREA numbers, sooner -------------

def photo_gray() -> np.ndarray:
    from skimage import data

    return cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2GRAY)


@pytest.mark.parametrize(("src", "dst", "used"), [
    ((200, 200), (32, 32), True),    # the demo: 200x200 window -> 32x32, runs of 25 -> 4
    ((360, 640), (96, 128), True),   # runs of 15 and 5
    ((100, 100), (32, 32), True),
    ((200, 200), (28, 28), False),   # runs of 50: an even product, ties possible
    ((360, 640), (32, 32), False),   # runs of 45 and 20: even
    ((360, 640), (180, 320), False),  # whole ratios: OpenCV's fixed-point path is faster
    ((360, 640), (224, 224), False),  # 35 multiply-adds a pixel: OpenCV is faster
    ((32, 32), (64, 64), False),     # growing is not a shrink
])
def test_area_shrink_gives_opencvs_numbers_where_the_preprocessor_uses_it(src, dst, used):
    from edgekit.imaging import imgops

    assert imgops.area_shrink_matches_opencv(src, dst) is used
    if dst[0] > src[0]:
        with pytest.raises(ValueError, match="cannot grow"):
            imgops.area_shrink(np.zeros(src, np.uint8), *dst)
        return
    rng = np.random.default_rng(7)
    photo = cv2.resize(photo_gray(), src[::-1], interpolation=cv2.INTER_LINEAR)
    images = [photo, rng.integers(0, 256, src, dtype=np.uint8), rng.integers(0, 256, (*src, 3), dtype=np.uint8)]
    images += [rng.integers(0, 256, src, dtype=np.uint8) for _ in range(20)]
    for img in images:
        ref = cv2.resize(img, dst[::-1], interpolation=cv2.INTER_AREA)
        got = imgops.area_shrink(img, *dst)
        assert got.shape == ref.shape and got.dtype == np.uint8
        diff = np.abs(got.astype(int) - ref)
        if used:  # odd runs: no exact ties, so both round every output the same way
            np.testing.assert_array_equal(got, ref)
        else:  # ties (x.5) are decided by float error, or OpenCV's fixed point rounds them up
            assert diff.max() <= 1


def test_preprocessor_takes_the_block_path_and_keeps_opencvs_tensor(monkeypatch):
    from skimage import data

    from edgekit.imaging import imgops

    frame = cv2.resize(cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR), (640, 360), interpolation=cv2.INTER_AREA)
    spec = InputSpec(shape=(1, 32, 32, 1), colour="gray", crop=(200, 200), dtype="uint8", scale=1 / 255,
                     zero_point=0)
    calls = []
    shrink = imgops.area_shrink
    monkeypatch.setattr(imgops, "area_shrink", lambda *a: calls.append(a[1:]) or shrink(*a))
    out = Preprocessor(spec)(frame)
    gray = cv2.cvtColor(frame[80:280, 220:420], cv2.COLOR_BGR2GRAY)
    np.testing.assert_array_equal(out[0, :, :, 0], cv2.resize(gray, (32, 32), interpolation=cv2.INTER_AREA))
    assert calls == [(32, 32)]
