"""Raspberry Pi CSI cameras through picamera2 (imported only when such a source is opened).

The module is not called ``picamera2`` so that it never reads like (or shadows) the library.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

import numpy as np

from edgekit.camera.base import DEFAULT_OPEN_TIMEOUT_S, DEFAULT_TIMEOUT_S, LatestFrameSource, parse_size
from edgekit.errors import CameraError, CameraUnavailable


def _yuv420_to_bgr(array: np.ndarray, width: int, height: int) -> np.ndarray:
    """picamera2's YUV420 array is ``(height*3/2, stride)``: a Y plane, then U and V planes
    whose rows are half a stride each. Drop the stride padding and convert I420 -> BGR."""
    stride = array.shape[1]
    y = array[:height, :width]
    halves = array.reshape(array.shape[0] * 2, stride // 2)  # one chroma row per half-row
    u = halves[2 * height : 2 * height + height // 2, : width // 2]
    v = halves[2 * height + height // 2 : 3 * height, : width // 2]
    return i420_to_bgr(y, u, v)


# BT.601 limited range in 20-bit fixed point: OpenCV's YUV2BGR_I420 constants
# (ITUR_BT_601_CY ... CVR in modules/imgproc/src/color_yuv.simd.hpp), so both agree.
_CY, _CUB, _CUG, _CVG, _CVR, _SHIFT = 1220542, 2116026, -409993, -852492, 1673527, 20


def i420_to_bgr(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Planar Y (HxW) + U, V (H/2 x W/2) -> B,G,R uint8, each chroma sample shared by a 2x2 block."""
    yy = (np.maximum(y.astype(np.int64) - 16, 0) * _CY)
    uu = np.repeat(np.repeat(u.astype(np.int64) - 128, 2, axis=0), 2, axis=1)[: y.shape[0], : y.shape[1]]
    vv = np.repeat(np.repeat(v.astype(np.int64) - 128, 2, axis=0), 2, axis=1)[: y.shape[0], : y.shape[1]]
    half = 1 << (_SHIFT - 1)
    b = (yy + _CUB * uu + half) >> _SHIFT
    g = (yy + _CVG * vv + _CUG * uu + half) >> _SHIFT
    r = (yy + _CVR * vv + half) >> _SHIFT
    return np.clip(np.stack([b, g, r], axis=-1), 0, 255).astype(np.uint8)


#: picamera2 stream format -> conversion to OpenCV's B,G,R byte order. libcamera names a
#: format by its little-endian word, so the bytes come reversed: "RGB888" arrays are already
#: B,G,R (no work) and "BGR888" arrays are R,G,B; the 32-bit formats add a padding byte.
#: Channel reordering in numpy: no OpenCV needed on a Pi.
PICAMERA2_TO_BGR: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "RGB888": lambda a: a,
    "BGR888": lambda a: np.ascontiguousarray(a[:, :, ::-1]),
    "XRGB8888": lambda a: np.ascontiguousarray(a[:, :, :3]),  # bytes B,G,R,X
    "XBGR8888": lambda a: np.ascontiguousarray(a[:, :, 2::-1]),  # bytes R,G,B,X
}
PICAMERA2_INSTALL_HINT = (
    "picamera2 comes with Raspberry Pi OS (sudo apt install python3-picamera2); "
    "create the virtualenv with --system-site-packages so it can be imported"
)


class Picamera2Source(LatestFrameSource):
    """A Raspberry Pi camera through picamera2 (imported only when this source is opened).

    The ISP resizes for free, so ask it for the model's input size: ``size=(w, h)`` alone
    configures the main stream at that size; with ``main_size=`` as well, the main stream
    runs at ``main_size`` and a low-resolution stream at ``size`` is what this source
    delivers (lores must be ``YUV420`` before the Pi 5). Frames are converted to OpenCV's
    B,G,R order with :data:`PICAMERA2_TO_BGR` (``"RGB888"``, the default, needs no work).
    """

    kind = "picamera2"

    def __init__(
        self,
        camera_num: int = 0,
        *,
        size: Any = None,
        main_size: Any = None,
        format: str = "RGB888",
        lores_format: str = "YUV420",
        fps: float | None = None,
        buffer_count: int = 4,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
    ):
        label = f"picamera2:{camera_num}"
        size, main_size = parse_size(size), parse_size(main_size)
        for fmt in {format, lores_format}:
            if fmt not in PICAMERA2_TO_BGR and fmt != "YUV420":
                raise CameraError(
                    f"{label}: unsupported format {fmt!r}",
                    f"use one of {', '.join([*PICAMERA2_TO_BGR, 'YUV420'])}",
                )
        cam = _open(camera_num, label)
        if size and main_size:
            main = {"size": main_size, "format": format}
            lores: dict | None = {"size": size, "format": lores_format}
            stream, fmt, out_size = "lores", lores_format, size
        else:
            out_size = size or main_size
            main = {"format": format, **({"size": out_size} if out_size else {})}
            lores, stream, fmt = None, "main", format
        config = {"main": main, "lores": lores, "controls": {"FrameRate": float(fps)} if fps else {},
                  "buffer_count": buffer_count}  # fmt: skip
        width, height = _start(cam, label, config, stream, out_size)
        convert = PICAMERA2_TO_BGR.get(fmt) or (lambda a: _yuv420_to_bgr(a, width, height))
        read, release = _reader(cam, stream, convert, poll_s=min(float(timeout_s), 0.5))
        super().__init__(read, name=label, release=release, timeout_s=timeout_s, open_timeout_s=open_timeout_s)
        self._info.update({"stream": stream, "format": fmt, "nominal_fps": float(fps) if fps else None})


def _open(camera_num: int, label: str) -> Any:
    """A ``Picamera2`` object for camera ``camera_num`` (the library is imported here)."""
    from edgekit.util.plugins import resolve

    picamera2_cls = resolve("picamera2:Picamera2", PICAMERA2_INSTALL_HINT)
    try:
        return picamera2_cls(camera_num)
    except Exception as exc:  # picamera2 raises IndexError/RuntimeError when no camera is there
        raise CameraUnavailable(
            f"{label}: cannot open ({type(exc).__name__}: {exc})",
            "is the camera connected and detected? try `rpicam-hello --list-cameras`",
        ) from exc


def _start(cam: Any, label: str, config: dict, stream: str, out_size: Any) -> tuple[int, int]:
    """Configure and start ``cam``; returns the delivered stream's (width, height).
    A camera that fails here is closed before the error is raised."""
    try:
        cam.configure(cam.create_video_configuration(
            **config,
            queue=False,  # wait for a fresh frame rather than take one already queued
        ))  # fmt: skip
        if out_size is None:  # the camera chose: read the size back from the configuration
            out_size = tuple(cam.camera_configuration()[stream]["size"])
        cam.start()
    except Exception as exc:
        cam.close()
        raise CameraError(f"{label}: cannot configure ({type(exc).__name__}: {exc})",
                          "try another size= or format=") from exc  # fmt: skip
    return out_size


def _reader(cam: Any, stream: str, convert: Callable, poll_s: float) -> tuple[Callable, Callable]:
    """The grabber's ``read()`` and ``release()`` for a started camera.

    Each frame is requested asynchronously and waited for in ``poll_s`` slices: a camera
    that stops then shows up as timed-out reads (the grabber can notice close()) instead of
    a capture_array() call blocked forever. One request stays pending until it completes.
    """
    pending: list[Any] = []

    def read() -> tuple[bool, np.ndarray | None]:
        if not pending:
            pending.append(cam.capture_array(stream, wait=False))
        try:
            array = cam.wait(pending[0], timeout=poll_s)
        except (TimeoutError, FutureTimeoutError):
            return False, None
        except Exception:
            pending.clear()
            raise
        pending.clear()
        return True, convert(array)

    def release() -> None:
        try:
            cam.stop()
        finally:
            cam.close()

    return read, release


def open_picamera(camera_num: str, runtime: Any = None, /, **options: Any) -> Picamera2Source:
    """Open ``picamera2`` or ``picamera2:N`` (``camera_num`` is ``""`` or ``"N"``).

    With the imx500 backend as ``runtime`` (it holds the AI Camera's ``Picamera2``: picamera2 opens a
    camera once), CameraError naming the ``imx500`` camera, which reads that one.
    """
    if callable(getattr(runtime, "has_outputs", None)):
        raise CameraError("picamera2: the imx500 backend holds the AI Camera (picamera2 opens a camera once)",
                          "read it with --camera imx500: its frames come with the sensor's outputs for them")
    return Picamera2Source(int(camera_num or 0), **options)
