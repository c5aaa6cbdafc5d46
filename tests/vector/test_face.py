"""The face-screen encoder, checked byte for byte against the Vector SDK's own converter."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.vector.face import (
    SCREEN_BYTES,
    SCREEN_HEIGHT,
    SCREEN_WIDTH,
    decode_rgb565,
    encode_rgb565,
    fit_to_screen,
    render_label,
)

screen = pytest.importorskip("anki_vector.screen",
                             reason="needs wirepod_vector_sdk (pip install 'edgekit-vision[vector]')")
Image = pytest.importorskip("PIL.Image")

# the SDK's converter calls Pillow's getdata(), deprecated in Pillow 12
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def sdk_encode(rgb: np.ndarray) -> bytes:
    return screen.convert_image_to_screen_data(Image.fromarray(rgb))


def test_screen_constants_match_the_sdk():
    assert screen.dimensions() == (SCREEN_WIDTH, SCREEN_HEIGHT)
    assert SCREEN_BYTES == 35328


@pytest.mark.parametrize("seed", [0, 1])
def test_encoder_matches_the_sdk_byte_for_byte_on_random_images(seed):
    rgb = np.random.default_rng(seed).integers(0, 256, (SCREEN_HEIGHT, SCREEN_WIDTH, 3), dtype=np.uint8)
    ours = encode_rgb565(rgb)
    assert isinstance(ours, bytes)  # set_screen_with_image_data rejects anything but bytes
    assert len(ours) == 35328
    assert ours == sdk_encode(rgb)


def test_encoder_matches_the_sdk_on_every_channel_value():
    # every 8-bit value in every channel, so each bit of the 5/6/5 packing is exercised
    ramp = np.arange(SCREEN_HEIGHT * SCREEN_WIDTH, dtype=np.int64) % 256
    rgb = np.stack([ramp, ramp[::-1], (ramp * 7) % 256], axis=-1).astype(np.uint8)
    rgb = rgb.reshape(SCREEN_HEIGHT, SCREEN_WIDTH, 3)
    assert encode_rgb565(rgb) == sdk_encode(rgb)


def test_big_endian_layout_of_pure_colours():
    for colour, pair in [((255, 0, 0), b"\xf8\x00"), ((0, 255, 0), b"\x07\xe0"), ((0, 0, 255), b"\x00\x1f"),
                         ((255, 255, 255), b"\xff\xff")]:
        rgb = np.zeros((SCREEN_HEIGHT, SCREEN_WIDTH, 3), np.uint8)
        rgb[:] = colour
        data = encode_rgb565(rgb)
        assert data[:2] == pair and data == pair * (SCREEN_WIDTH * SCREEN_HEIGHT)


def test_decode_inverts_encode():
    rgb = np.random.default_rng(3).integers(0, 256, (SCREEN_HEIGHT, SCREEN_WIDTH, 3), dtype=np.uint8)
    back = decode_rgb565(encode_rgb565(rgb))
    diff = np.abs(back.astype(int) - rgb.astype(int))
    assert diff[..., 0].max() <= 7 and diff[..., 1].max() <= 3 and diff[..., 2].max() <= 7
    assert encode_rgb565(back) == encode_rgb565(rgb)  # a decoded image re-encodes to the same bytes
    pure = np.zeros_like(rgb)
    pure[:, :92] = (255, 0, 255)
    np.testing.assert_array_equal(decode_rgb565(encode_rgb565(pure)), pure)


def test_wrong_inputs_are_refused():
    with pytest.raises(ValueError, match="96x184x3"):
        encode_rgb565(np.zeros((96, 184), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        encode_rgb565(np.zeros((96, 184, 3), np.float32))
    with pytest.raises(ValueError, match="35328"):
        decode_rgb565(b"\x00" * 100)


def test_fit_to_screen_letterboxes_and_keeps_aspect():
    tall = np.full((200, 100, 3), 200, np.uint8)
    out = fit_to_screen(tall)
    assert out.shape == (96, 184, 3) and out.dtype == np.uint8
    cols = np.where(out[48, :, 0] > 100)[0]
    assert 46 <= cols.size <= 50  # 100x200 scaled to 48x96, centred
    assert abs((cols[0] + cols[-1]) / 2 - 91.5) <= 1
    gray = fit_to_screen(np.full((96, 184), 77, np.uint8))
    assert (gray == 77).all()


def test_render_label_draws_centred_visible_text():
    img = render_label("a", colour=(255, 255, 255))
    assert img.shape == (96, 184, 3)
    ys, xs = np.where(img[..., 0] > 128)
    assert xs.size > 200  # a large glyph, not a speck
    assert abs(xs.mean() - 92) < 20 and abs(ys.mean() - 48) < 20
    wide = render_label("background")
    xs = np.where(wide[..., 1] > 128)[1]
    assert xs.min() >= 0 and xs.max() <= 183 and xs.max() - xs.min() > 120  # fits, and fills the width
    red = render_label("b", colour=(255, 0, 0))
    assert red[..., 0].max() == 255 and red[..., 2].max() == 0  # RGB order, ready for encode_rgb565
