"""Camera frames for :class:`~edgekit.vector.fake.FakeVector`, JPEG-encoded once up front.

From an image folder, a video file, a sequence of OpenCV frames, or synthetic numbered
frames; every frame is resized to what a real Vector streams (640x360) unless told otherwise,
and a small image (a 28x28 dataset item) is held up inside the window the model reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import cv2
import numpy as np

from edgekit.errors import CameraError
from edgekit.imaging.image import IMAGE_SUFFIXES, ImageReadError, read_image

CAMERA_SIZE = (640, 360)  # what a real Vector streams (width, height)
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".m4v", ".webm")


def load_frames(
    source: str | Path | Sequence[np.ndarray] | None,
    size: tuple[int, int] | None = CAMERA_SIZE,
    hold: int = 1,
    max_frames: int = 3000,
    jpeg_quality: int = 90,
    window: tuple[int, int] | None = None,
) -> list[bytes]:
    """Camera frames as JPEG bytes, encoded once up front so streaming costs nothing.

    Args:
        source: an image folder (sorted by name), a video file, a sequence of OpenCV
            frames (gray or BGR uint8), or None for synthetic numbered frames.
        size: ``(width, height)`` every frame is resized to (a real Vector sends 640x360);
            None keeps each frame's size.
        hold: repeat every source image this many consecutive frames (a sign held up).
        max_frames: stop reading a video after this many frames.
        jpeg_quality: OpenCV JPEG quality, 0-100.
        window: ``(width, height)`` of the centred window the model reads (its crop); an image
            that fits four times into it is held up inside it, scaled to fill it, on a grey
            frame, as a hand would hold a card up to the camera: stretched over the whole frame,
            a 28x28 item would mostly fall outside the model's crop.
    """
    frames: Iterable[np.ndarray]
    if source is None:
        frames = (_numbered_frame(i, size or CAMERA_SIZE) for i in range(30))
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise CameraError(f"{path} holds no images", f"put {', '.join(IMAGE_SUFFIXES)} files there")
            try:
                frames = [read_image(p) for p in files]
            except ImageReadError as exc:
                raise CameraError(str(exc), "remove or replace that file") from exc
        elif path.is_file():
            frames = _read_video(path, max_frames)
        else:
            raise CameraError(f"{path} does not exist", "give an image folder or a video file")
    else:
        frames = source
    encoded = []
    for frame in frames:
        if size is not None and window is not None and _small(frame, window):
            frame = held_up(frame, tuple(size), tuple(window))
        elif size is not None and frame.shape[1::-1] != tuple(size):
            frame = cv2.resize(frame, tuple(size), interpolation=cv2.INTER_AREA)
        ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, int(jpeg_quality)])
        if not ok:
            raise CameraError("OpenCV could not JPEG-encode a frame")
        encoded.extend([buf.tobytes()] * max(1, int(hold)))
        if len(encoded) >= max_frames:
            break
    if not encoded:
        raise CameraError(f"no frames read from {source}", "check the file plays and is not empty")
    return encoded[:max_frames]


def _small(frame: np.ndarray, window: tuple[int, int]) -> bool:
    return frame.shape[1] * 2 <= window[0] and frame.shape[0] * 2 <= window[1]


def held_up(item: np.ndarray, size: tuple[int, int], window: tuple[int, int]) -> np.ndarray:
    """``item`` scaled to fill the centred ``window`` (aspect kept) on a mid-grey ``size`` frame."""
    width, height = size
    scale = min(window[0] / item.shape[1], window[1] / item.shape[0])
    w, h = max(1, round(item.shape[1] * scale)), max(1, round(item.shape[0] * scale))
    item = cv2.resize(item, (w, h), interpolation=cv2.INTER_LINEAR)
    if item.ndim == 2:
        item = cv2.cvtColor(item, cv2.COLOR_GRAY2BGR)
    canvas = np.full((height, width, 3), 128, np.uint8)
    top, left = (height - h) // 2, (width - w) // 2
    canvas[top : top + h, left : left + w] = item[:, :, :3]
    return canvas


def _read_video(path: Path, max_frames: int) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():  # OpenCV reports a bad file by returning a closed capture, not an error
        raise CameraError(f"OpenCV cannot open the video {path}", f"use one of {', '.join(VIDEO_SUFFIXES)}")
    frames = []
    try:
        while len(frames) < max_frames:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(frame)
    finally:
        cap.release()
    return frames


def _numbered_frame(i: int, size: tuple[int, int]) -> np.ndarray:
    w, h = size
    frame = np.full((h, w, 3), (40 + 7 * i) % 256, dtype=np.uint8)
    cv2.putText(frame, str(i), (w // 3, h // 2), cv2.FONT_HERSHEY_SIMPLEX, 3.0, (255, 255, 255), 5)
    return frame
