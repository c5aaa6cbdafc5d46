"""OpenCV sources: USB/V4L2 cameras and network streams through ``cv2.VideoCapture``, each
read by a grabber thread that keeps only the newest frame.

OpenCV is an extra: it is imported when such a source is opened, not with this module
(``edgekit.camera`` imports it to list the schemes), and its own warnings are kept quiet
(:func:`edgekit.util.quiet.import_cv2`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

import numpy as np

from edgekit.camera.base import (
    DEFAULT_OPEN_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    LatestFrameSource,
    parse_size,
    redact_uri,
)
from edgekit.errors import CameraError, CameraUnavailable, first_line
from edgekit.util.quiet import import_cv2

log = logging.getLogger(__name__)

#: libjpeg-turbo's DCT scaling factors, as ``cv2.imdecode`` offers them (IMREAD_REDUCED_COLOR_N).
DECODE_SCALES = (8, 4, 2)
_MJPEG_FOURCCS = {"MJPG", "MJPEG", "JPEG", "jpeg", "mjpg", "AVRn", "LJPG", "dmb1"}


class _OpenCVOnUse:
    """``cv2`` imported at the first attribute read (when a source opens), not at module import."""

    def __getattr__(self, name: str) -> Any:
        return getattr(import_cv2("the v4l2:/rtsp:// camera source"), name)


cv2 = _OpenCVOnUse()


def _fourcc_str(value: float) -> str:
    code = int(value)
    chars = "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4))
    return chars if chars.isprintable() and code else ""


class OpenCVSource(LatestFrameSource):
    """Any source ``cv2.VideoCapture`` can open (USB/V4L2 device, RTSP/HTTP URL, even a
    file), read by a grabber thread that keeps only the newest frame.

    Args:
        source: a device index, a URL or path, or an already-open capture-like object with
            ``read()`` and ``release()`` (and optionally ``isOpened()``/``get()``/``set()``).
        api: OpenCV backend (``cv2.CAP_V4L2``, ``cv2.CAP_FFMPEG``, ...); default any.
        fourcc: pixel format to ask a device for, e.g. ``"MJPG"`` (USB cameras deliver far
            higher frame rates compressed than as raw YUYV over USB 2).
        size: ``(width, height)`` or ``"WxH"`` to request; the camera may pick another size,
            ``stats()["size"]`` says what it delivers.
        fps: frame rate to request.
        buffer_size: driver queue length (1 = lowest latency; ignored by files/FFMPEG).
        params: extra ``cv2.VideoCapture`` open parameters (``[prop, value, ...]``).
        decode_size: ``(width, height)`` or ``"WxH"``: read the compressed MJPEG packets and
            decode each with ``cv2.imdecode`` at the smallest 1/2, 1/4 or 1/8 scale that stays
            at least this size (e.g. the model's input): several times cheaper than a full
            decode, and the later resize is cheaper too. A stream that is not MJPEG is decoded
            as usual, with a log line saying so. See :func:`reduced_scale`.
        timeout_s, open_timeout_s: see :class:`LatestFrameSource`.

    Raises:
        CameraError: when the capture does not open (``cv2.VideoCapture`` itself raises
            nothing and returns at once with ``isOpened()`` False when no camera is there).
    """

    kind = "opencv"

    def __init__(
        self,
        source: Any,
        *,
        api: int | None = None,
        fourcc: str | None = None,
        size: Any = None,
        fps: float | None = None,
        buffer_size: int | None = None,
        params: list[int] | None = None,
        decode_size: Any = None,
        name: str | None = None,
        hint: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
    ):
        label = name or (f"camera {source}" if isinstance(source, (int, str)) else type(source).__name__)
        if hasattr(source, "read"):
            cap = source
        else:
            try:
                # a stream FFmpeg cannot reach prints "[tcp @ 0x...] Connection refused" on fd 2 beside our
                # one error line: caught and logged instead (a device number opens through V4L2, quietly)
                with _ffmpeg_quiet(source):
                    cap = cv2.VideoCapture(source, cv2.CAP_ANY if api is None else api, list(params or []))
            except cv2.error as exc:  # its text is a multi-line overload report: one line of it
                text = str(exc)
                why = "a params= value is not a 32-bit integer" if "'params'" in text else first_line(text)
                # OpenCV refused its arguments (a params= value): input to fix, not a dead camera
                raise CameraError(f"{label}: cannot open ({why})", hint) from exc
        if not getattr(cap, "isOpened", lambda: True)():
            cap.release()
            raise CameraUnavailable(f"{label}: cannot open", hint or "check the device or URL")
        try:
            info = _configure_capture(cap, fourcc=fourcc, size=parse_size(size), fps=fps, buffer_size=buffer_size)
            read = _reduced_reader(cap, parse_size(decode_size), info, label) if decode_size else cap.read
        except Exception:
            cap.release()
            raise
        super().__init__(read, name=label, release=cap.release, timeout_s=timeout_s, open_timeout_s=open_timeout_s)
        self._info.update(info)


def _ffmpeg_quiet(source: Any) -> Any:
    """FFmpeg's own lines to the ``edgekit.camera`` log while a URL or file opens; nothing otherwise."""
    import contextlib
    import logging
    import threading

    from edgekit.util.quiet import native_stderr_to_log

    # Only on the main thread (run, bench): catching fd 2 holds the log handlers for the whole open
    # (up to the stream's timeout), and the daemon reopens a lost stream on its capture thread while
    # the MQTT and HTTP threads must keep logging.
    if isinstance(source, str) and "://" in source and threading.current_thread() is threading.main_thread():
        return native_stderr_to_log(logging.getLogger("edgekit.camera"), lambda _line: logging.DEBUG)  # -vv
    return contextlib.nullcontext()


def _configure_capture(cap: Any, *, fourcc, size, fps, buffer_size) -> dict[str, Any]:
    """Request settings on an open capture and return what it actually reports."""
    if not (hasattr(cap, "set") and hasattr(cap, "get")):
        return {}  # a plain read()/release() object: nothing to request or report
    # V4L2 applies these in order; the pixel format must come before the size, or the driver
    # may reject a size that only exists for MJPG.
    if fourcc:
        cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*fourcc))
    if size:
        cap.set(cv2.CAP_PROP_FRAME_WIDTH, size[0])
        cap.set(cv2.CAP_PROP_FRAME_HEIGHT, size[1])
    if fps:
        cap.set(cv2.CAP_PROP_FPS, fps)
    if buffer_size:
        cap.set(cv2.CAP_PROP_BUFFERSIZE, buffer_size)
    info: dict[str, Any] = {}
    with_backend = getattr(cap, "getBackendName", None)
    if with_backend is not None:
        with contextlib.suppress(cv2.error):
            info["backend"] = with_backend()
    nominal = cap.get(cv2.CAP_PROP_FPS)
    info["nominal_fps"] = float(nominal) if nominal and np.isfinite(nominal) and 0 < nominal < 1000 else None
    fcc = _fourcc_str(cap.get(cv2.CAP_PROP_FOURCC))
    if fcc:
        info["fourcc"] = fcc
    return info


def reduced_scale(frame_size: tuple[int, int], at_least: tuple[int, int]) -> int:
    """The largest of 8, 4, 2 that keeps a ``frame_size`` JPEG decoded at 1/scale at least
    ``at_least`` on both sides (libjpeg rounds the scaled size up); 1 when none does."""
    (width, height), (want_w, want_h) = frame_size, at_least
    for scale in DECODE_SCALES:
        if -(-width // scale) >= want_w and -(-height // scale) >= want_h:
            return scale
    return 1


def _reduced_reader(cap: Any, at_least: tuple[int, int], info: dict[str, Any], label: str):
    """A ``read()`` for :class:`LatestFrameSource` that takes the compressed MJPEG packet from
    ``cap`` and decodes it at reduced scale; ``cap.read`` itself when the stream is not MJPEG.

    Reading the packet only is nearly free (``CAP_PROP_FORMAT = -1`` with FFMPEG,
    ``CAP_PROP_CONVERT_RGB = 0`` with V4L2), and ``cv2.imdecode`` releases the GIL while it
    decodes, so the grabber thread does not hold up inference.
    """
    fourcc = info.get("fourcc", "")
    if not (hasattr(cap, "set") and hasattr(cap, "get")) or fourcc not in _MJPEG_FOURCCS:
        log.warning(
            "%s: decode_size= needs an MJPEG stream, this one is %s; decoding every frame in full instead",
            label,
            repr(fourcc) if fourcc else "of unknown format",
        )
        info["decode"] = "full (not MJPEG)"
        return cap.read
    # Raw mode cannot be switched off again (FFMPEG refuses CAP_PROP_FORMAT=0), so it is only
    # asked for once the stream is known to be MJPEG.
    if not (cap.set(cv2.CAP_PROP_FORMAT, -1) or cap.set(cv2.CAP_PROP_CONVERT_RGB, 0)):
        log.warning(
            "%s: backend %s cannot hand out compressed packets; decoding every frame in full instead",
            label,
            info.get("backend", "?"),
        )
        info["decode"] = "full (backend gives no packets)"
        return cap.read
    frame_size = (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
    scale = reduced_scale(frame_size, at_least) if min(frame_size) > 0 else 1
    flag = {
        1: cv2.IMREAD_COLOR,
        2: cv2.IMREAD_REDUCED_COLOR_2,
        4: cv2.IMREAD_REDUCED_COLOR_4,
        8: cv2.IMREAD_REDUCED_COLOR_8,
    }[scale]
    info.update(decode=f"imdecode 1/{scale}", decode_scale=scale)

    def read() -> tuple[bool, np.ndarray | None]:
        ok, packet = cap.read()
        if not ok or packet is None or packet.size < 4:
            return False, None
        buf = packet.reshape(-1)
        if buf[0] != 0xFF or buf[1] != 0xD8:  # no JPEG start-of-image marker: a corrupt packet
            raise CameraError(f"{label}: a packet that is not JPEG in an MJPEG stream")
        return True, cv2.imdecode(buf, flag)  # None for a corrupt JPEG: a read error

    return read


DEVICE_HINT = (
    "is a camera connected (`ls /dev/video*`), free (not used by another program), and "
    "readable by you (group 'video')? Raspberry Pi CSI cameras need picamera2:N"
)


def open_device(
    device: str, *, fourcc: str | None = "MJPG", buffer_size: int | None = 1, **options: Any
) -> OpenCVSource:
    """Open ``v4l2:N`` / ``v4l2:/dev/videoN`` (``device`` is ``"N"`` or the path).

    MJPG and a one-frame driver queue by default: USB 2 cameras reach far higher frame
    rates compressed, and a short queue keeps frames fresh. Other options go to
    :class:`OpenCVSource`.
    """
    # Linux: V4L2 directly (CAP_ANY may try GStreamer on system OpenCV builds). Elsewhere the
    # platform's default backend.
    api = cv2.CAP_V4L2 if sys.platform.startswith("linux") else cv2.CAP_ANY
    source: int | str = int(device) if device.isdigit() else device
    return OpenCVSource(source, api=api, name=f"v4l2:{device}", hint=DEVICE_HINT, fourcc=fourcc,
                        buffer_size=buffer_size, **options)  # fmt: skip


def open_stream(url: str, **options: Any) -> OpenCVSource:
    """Open a network stream (``rtsp://``, ``http(s)://``, ...) through OpenCV's FFMPEG.

    RTSP over TCP instead of UDP: set ``OPENCV_FFMPEG_CAPTURE_OPTIONS=rtsp_transport;tcp``
    in the environment (OpenCV reads it when the stream opens).
    """
    timeout_s = float(options.get("timeout_s", DEFAULT_TIMEOUT_S))
    open_timeout_s = float(options.get("open_timeout_s", DEFAULT_OPEN_TIMEOUT_S))
    # FFMPEG's own timeouts bound a blocking read, so the grabber thread ends soon after the
    # consumer gives up on a dead stream instead of hanging in the network stack.
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, int(open_timeout_s * 1000),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC, int(timeout_s * 1000),
    ]  # fmt: skip
    name = redact_uri(url)
    hint = "check the URL, network and credentials; test it with `ffprobe URL`"
    return OpenCVSource(url, api=cv2.CAP_FFMPEG, name=name, hint=hint, **{"params": params, **options})
