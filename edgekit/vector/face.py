"""Vector's face screen: numpy images <-> the robot's 184x96 big-endian RGB565 bytes.

The SDK's own converter (``anki_vector.screen.convert_image_to_screen_data``) builds a
Python object per pixel (about 50 ms per frame); this does the same packing with numpy in
well under a millisecond, byte for byte identical (a test checks it against the SDK).
Needs only numpy and OpenCV, so it imports without the SDK.
"""

from __future__ import annotations

import cv2
import numpy as np

SCREEN_WIDTH = 184
SCREEN_HEIGHT = 96
SCREEN_BYTES = SCREEN_WIDTH * SCREEN_HEIGHT * 2  # 35,328: what set_screen_with_image_data insists on


def encode_rgb565(rgb: np.ndarray) -> bytes:
    """Pack a ``96x184x3`` uint8 RGB image into the 35,328 bytes the face screen takes.

    Each pixel becomes ``RRRRRGGG GGGBBBBB`` (high byte first), keeping the top 5/6/5 bits
    of red/green/blue, exactly as the SDK's ``Color.rgb565_bytepair`` does.

    Raises ValueError for any other shape or dtype (use :func:`fit_to_screen` first).
    """
    if rgb.dtype != np.uint8 or rgb.shape != (SCREEN_HEIGHT, SCREEN_WIDTH, 3):
        raise ValueError(
            f"face images must be uint8 {SCREEN_HEIGHT}x{SCREEN_WIDTH}x3 RGB, got {rgb.dtype} {rgb.shape}"
        )
    # widen before shifting so red's << 8 cannot overflow uint8
    r, g, b = (rgb[..., i].astype(np.uint16) for i in range(3))
    packed = ((r >> 3) << 11) | ((g >> 2) << 5) | (b >> 3)
    return packed.astype(">u2").tobytes()


def decode_rgb565(data: bytes) -> np.ndarray:
    """Unpack face-screen bytes into a ``96x184x3`` uint8 RGB image (the inverse of encoding).

    Low bits are filled by bit replication (a 5-bit 31 becomes 255), so pure colours and
    black/white survive a round trip exactly; other values come back within 8 (red, blue)
    or 4 (green) of the original.
    """
    if len(data) != SCREEN_BYTES:
        raise ValueError(f"face data must be {SCREEN_BYTES} bytes, got {len(data)}")
    packed = np.frombuffer(data, dtype=">u2").astype(np.uint16).reshape(SCREEN_HEIGHT, SCREEN_WIDTH)
    r5, g6, b5 = packed >> 11, (packed >> 5) & 0x3F, packed & 0x1F
    rgb = np.stack([(r5 << 3) | (r5 >> 2), (g6 << 2) | (g6 >> 4), (b5 << 3) | (b5 >> 2)], axis=-1)
    return rgb.astype(np.uint8)


def fit_to_screen(image: np.ndarray, background: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    """Letterbox any uint8 image (gray or RGB) onto a 96x184 RGB canvas, keeping its aspect ratio.

    Colour images are taken as RGB, as the rest of this module does; convert OpenCV BGR
    frames with ``frame[..., ::-1]`` first.
    """
    if image.dtype != np.uint8:
        raise ValueError(f"face images must be uint8, got {image.dtype}")
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    image = image[..., :3]
    h, w = image.shape[:2]
    scale = min(SCREEN_HEIGHT / h, SCREEN_WIDTH / w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    inner = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    canvas = np.empty((SCREEN_HEIGHT, SCREEN_WIDTH, 3), dtype=np.uint8)
    canvas[:] = background
    top, left = (SCREEN_HEIGHT - nh) // 2, (SCREEN_WIDTH - nw) // 2
    canvas[top : top + nh, left : left + nw] = inner
    return canvas


def render_label(
    text: str,
    colour: tuple[int, int, int] = (255, 255, 255),
    background: tuple[int, int, int] = (0, 0, 0),
    thickness: int | None = None,
) -> np.ndarray:
    """Draw ``text`` as large as fits, centred, on a 96x184 RGB image (OpenCV Hershey font).

    Returns the RGB array; pass it to :func:`encode_rgb565` (or ``show_face``) to display it.
    """
    canvas = np.empty((SCREEN_HEIGHT, SCREEN_WIDTH, 3), dtype=np.uint8)
    canvas[:] = background
    text = text.strip() or "?"
    font = cv2.FONT_HERSHEY_DUPLEX
    (w1, h1), base1 = cv2.getTextSize(text, font, 1.0, 1)
    # fit 90 % of the width and 75 % of the height; Hershey glyphs scale linearly
    scale = min(0.9 * SCREEN_WIDTH / max(w1, 1), 0.75 * SCREEN_HEIGHT / max(h1 + base1, 1))
    thick = thickness or max(1, round(scale * 1.6))
    (w, h), base = cv2.getTextSize(text, font, scale, thick)
    origin = ((SCREEN_WIDTH - w) // 2, (SCREEN_HEIGHT + h - base) // 2)
    cv2.putText(canvas, text, origin, font, scale, colour, thick, cv2.LINE_AA)
    return canvas


def render_result(frame: np.ndarray, result: object) -> np.ndarray:
    """A camera frame (BGR or gray, OpenCV convention) with ``result`` drawn, as a 96x184 RGB face image.

    The frame is shrunk to the screen *before* drawing (:func:`edgekit.outputs.overlay.draw`), so the
    boxes are sharp and the labels are drawn at a size the 184x96 screen can show; a
    detector's boxes (in the frame's pixels) are scaled with it.
    """
    from edgekit.detect.boxes import Detections
    from edgekit.outputs.overlay import draw

    h, w = frame.shape[:2]
    if isinstance(result, Detections) and result.size is None:  # boxes without a size are the frame's
        result = Detections(result.detections, (w, h))
    scale = min(SCREEN_HEIGHT / h, SCREEN_WIDTH / w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    small = cv2.resize(frame, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    return fit_to_screen(np.ascontiguousarray(draw(small, result)[..., ::-1]))
