"""Camera sources: iterators of :class:`Frame` with newest-frame semantics.

A slow consumer always gets the latest frame, never a stale queue.

Two mechanisms give that guarantee:

* live sources (USB/V4L2 cameras, RTSP/HTTP streams, picamera2) run a grabber thread
  (:class:`LatestFrameSource`) that reads as fast as the camera delivers and keeps only the
  newest frame; frames overtaken before anyone asked for them are skipped;
* clips, image folders and the synthetic pattern (:class:`SequenceSource`) are read on the
  consumer's thread against a virtual clock: when paced, frame ``k`` is "captured" at
  ``start + k / fps``, and frames whose time has already passed are skipped (not decoded)
  so the consumer again gets the newest one.

Use :func:`open_camera` with a URI; every source is an iterator, a context manager, and has
``close()`` and ``stats()``. Typical use::

    with open_camera("file:clip.mp4") as cam:
        for frame in cam:
            ...

Frames follow OpenCV's convention (uint8, B,G,R). The array in a :class:`Frame` belongs to
the consumer: no source writes into it after handing it out. Sources are not thread-safe:
iterate one from a single thread (the grabber thread is internal).
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2

from edgekit.camera.base import (
    DEFAULT_OPEN_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    Frame,
    FrameSource,
    LatestFrameSource,
    parse_size,
    redact_uri,
)
from edgekit.camera.files import VIDEO_SUFFIXES, ImageFolderSource, SequenceSource, VideoFileSource
from edgekit.camera.opencv import OpenCVSource
from edgekit.camera.picamera import PICAMERA2_INSTALL_HINT, PICAMERA2_TO_BGR, Picamera2Source
from edgekit.camera.synthetic import SyntheticSource, synthetic_frame
from edgekit.errors import CameraError, UsageError

STREAM_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://")
URI_FORMS = (
    "v4l2:N | N | rtsp://... | http(s)://... | file:PATH | PATH.mp4 | folder:DIR | DIR | "
    "picamera2[:N] | synthetic[:WxH[@FPS]] | vector:SERIAL"
)


def _build(label: str, factory: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """Call ``factory`` after checking that it takes every option (a typo such as
    ``looop=True`` gets a clear error instead of a TypeError from deep inside)."""
    params = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            takes = ", ".join(n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)
            raise UsageError(f"{label} does not take option(s) {', '.join(unknown)}", f"it takes: {takes}")
    return factory(*args, **options)


def _device_source(device: int | str, uri: str, options: dict) -> OpenCVSource:
    # Linux: V4L2 directly (CAP_ANY may try GStreamer on system OpenCV builds). Elsewhere the
    # platform's default backend.
    api = cv2.CAP_V4L2 if sys.platform.startswith("linux") else cv2.CAP_ANY
    defaults = {"fourcc": "MJPG", "buffer_size": 1}
    hint = (
        "is a camera connected (`ls /dev/video*`), free (not used by another program), and "
        "readable by you (group 'video')? Raspberry Pi CSI cameras need picamera2:N"
    )
    return _build(uri, OpenCVSource, device, api=api, name=uri, hint=hint, **{**defaults, **options})


def _stream_source(url: str, options: dict) -> OpenCVSource:
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
    return _build(name, OpenCVSource, url, api=cv2.CAP_FFMPEG, name=name, hint=hint,
                  **{"params": params, **options})  # fmt: skip


def open_camera(uri: str | int, **options: Any) -> FrameSource:
    """Open a frame source from a URI.

    URIs and their options (all sources also take none of the others'):

    * ``v4l2:N``, ``v4l2:/dev/videoN`` or ``N``: a USB/V4L2 camera via OpenCV, grabber
      thread. Options: ``size=(w, h)``, ``fps=``, ``fourcc="MJPG"``, ``buffer_size=1``,
      ``timeout_s=5``, ``open_timeout_s=10``.
    * ``rtsp://...``, ``http(s)://...`` (and other FFMPEG URLs): a network stream via
      OpenCV FFMPEG, grabber thread. Options: ``timeout_s``, ``open_timeout_s``. RTSP over
      TCP instead of UDP: set ``OPENCV_FFMPEG_CAPTURE_OPTIONS=rtsp_transport;tcp`` in the
      environment (OpenCV reads it when the stream opens).
    * ``file:PATH`` or a path ending in a video suffix: a clip. Options: ``pace=True``
      (to the file's fps), ``loop=False``, ``fps=`` (override).
    * ``folder:DIR`` or an existing directory: its images. Options: ``fps=`` (pace),
      ``loop=False``.
    * ``picamera2`` or ``picamera2:N``: a Raspberry Pi camera. Options: ``size=``,
      ``main_size=``, ``format="RGB888"``, ``lores_format="YUV420"``, ``fps=``,
      ``buffer_count=4``, ``timeout_s``, ``open_timeout_s``.
    * ``synthetic``, ``synthetic:WxH`` or ``synthetic:WxH@FPS``: a moving test pattern
      (640x360 by default, unpaced unless a rate is given). Options: ``frames=``, ``loop=``.
    * ``vector:SERIAL``: an Anki Vector's camera (``edgekit[vector]``); options are passed to
      ``edgekit.vector.camera.VectorSource``.

    Returns:
        A source: an iterator of :class:`Frame` with ``close()``, ``stats()`` and context
        manager support. Live sources start their grabber thread here.

    Raises:
        CameraError: unknown URI or option, or a camera/file that cannot be opened.
        BackendUnavailable: picamera2 or the Vector SDK is not installed.
    """
    if isinstance(uri, int):
        uri = str(uri)
    text = uri.strip()
    lower = text.lower()
    if text.isdigit():
        return _device_source(int(text), f"v4l2:{text}", options)
    if lower.startswith("v4l2:"):
        device = text[5:]
        if not (device.isdigit() or device.startswith("/dev/")):
            raise CameraError(f"bad camera URI {uri!r}", "write v4l2:0 or v4l2:/dev/video0")
        return _device_source(int(device) if device.isdigit() else device, text, options)
    if lower.startswith(STREAM_SCHEMES):
        return _stream_source(text, options)
    if lower.startswith("file:"):
        path = text[5:]
        path = path[2:] if path.startswith("//") else path  # file:///abs/path
        return _build(text, VideoFileSource, path, **options)
    if lower.startswith("folder:"):
        return _build(text, ImageFolderSource, text[7:], **options)
    if lower == "picamera2" or lower.startswith("picamera2:"):
        num = text[10:] or "0"
        if not num.isdigit():
            raise CameraError(f"bad camera URI {uri!r}", "write picamera2 or picamera2:N")
        return _build(text, Picamera2Source, int(num), **options)
    if lower == "synthetic" or lower.startswith("synthetic:"):
        return _synthetic(text, options)
    if lower.startswith("vector:"):
        serial = text[7:]
        if not serial:
            raise CameraError(f"bad camera URI {uri!r}", "write vector:SERIAL (the robot's serial number)")
        from edgekit.plugins import resolve

        vector_source = resolve("edgekit.vector.camera:VectorSource", "pip install 'edgekit[vector]'")
        if "timeout_s" in options:  # one name for "no frame for this long" across every source
            options["frame_timeout_s"] = options.pop("timeout_s")
        return vector_source(serial, **options)
    path = Path(text)
    if path.is_dir():
        return _build(text, ImageFolderSource, path, **options)
    if path.suffix.lower() in VIDEO_SUFFIXES:
        return _build(text, VideoFileSource, path, **options)
    if path.exists():
        raise CameraError(f"{uri}: not a video file or folder", f"video suffixes: {' '.join(VIDEO_SUFFIXES)}")
    raise CameraError(f"unknown camera {uri!r}", f"use one of: {URI_FORMS}")


def _synthetic(text: str, options: dict) -> SyntheticSource:
    spec = text[10:]
    m = re.fullmatch(r"(?:(\d+)[xX](\d+))?(?:@(\d+(?:\.\d+)?))?", spec)
    if not m:
        raise CameraError(f"bad camera URI {text!r}", "write synthetic, synthetic:640x480 or synthetic:640x480@30")
    if m.group(1):
        options.setdefault("size", (int(m.group(1)), int(m.group(2))))
    if m.group(3):
        options.setdefault("fps", float(m.group(3)))
    return _build(text, SyntheticSource, **options)


__all__ = [
    "DEFAULT_OPEN_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "PICAMERA2_INSTALL_HINT",
    "CameraError",
    "Frame",
    "FrameSource",
    "ImageFolderSource",
    "LatestFrameSource",
    "OpenCVSource",
    "PICAMERA2_TO_BGR",
    "Picamera2Source",
    "SequenceSource",
    "SyntheticSource",
    "VIDEO_SUFFIXES",
    "VideoFileSource",
    "open_camera",
    "parse_size",
    "redact_uri",
    "synthetic_frame",
]
