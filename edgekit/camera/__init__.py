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
``close()`` and ``stats()``. Which URI opens which source, and the options each takes, is
one table, :data:`SCHEMES` (help and error messages are generated from it). Typical use::

    with open_camera("file:clip.mp4") as cam:
        for frame in cam:
            ...

Frames follow OpenCV's convention (uint8, B,G,R). The array in a :class:`Frame` belongs to
the consumer: no source writes into it after handing it out. Sources are not thread-safe:
iterate one from a single thread (the grabber thread is internal).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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
from edgekit.camera.synthetic import SYNTHETIC_FPS, SYNTHETIC_SPEC, SyntheticSource, synthetic_frame
from edgekit.camera.table import MAX_FPS, MIN_FPS, CameraOptionError, Option, Scheme, check_options
from edgekit.errors import CameraError
from edgekit.util.plugins import resolve

_TIMEOUTS = (
    Option("timeout_s", "float", DEFAULT_TIMEOUT_S, gt=0, help="no new frame for this long: the camera stopped"),
    Option("open_timeout_s", "float", DEFAULT_OPEN_TIMEOUT_S, gt=0, help="wait this long for the first frame"),
)
_FPS = Option("fps", "float", ge=MIN_FPS, le=MAX_FPS, help="frames per second")
_LOOP = Option("loop", "bool", False, help="start again at the end")


def _opencv_options(fourcc: str | None, buffer_size: int | None) -> tuple[Option, ...]:
    return (
        Option("size", "size", help="WIDTHxHEIGHT to request; stats()['size'] says what arrives"),
        _FPS,
        Option("fourcc", "str", fourcc, help="pixel format to request, e.g. MJPG"),
        Option("buffer_size", "int", buffer_size, ge=1, help="driver queue length (1: freshest)"),
        Option("params", "ints", help="extra cv2.VideoCapture open parameters: prop,value,..."),
        Option("decode_size", "size", help="MJPEG only: decode at 1/2, 1/4 or 1/8 scale, still >= WxH "
               "(e.g. the model input); frames arrive smaller, so a crop in pixels would change"),
        *_TIMEOUTS,
    )


def _is_device(text: str) -> bool:
    """``0`` or ``/dev/video0``: what a user types for a USB camera without ``v4l2:``."""
    return text.isdigit() or text.startswith("/dev/video")


def _is_dir(text: str) -> bool:
    return Path(text).is_dir()


def _is_video_path(text: str) -> bool:
    return Path(text).suffix.lower() in VIDEO_SUFFIXES


#: Camera schemes, in the order URIs are tried and shown: name -> how to open it, what
#: URIs it accepts and the options it takes. Openers are imported on first use, so an
#: optional library (picamera2, the Vector SDK) is needed only by the URIs that use it.
SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme(
        "v4l2", "edgekit.camera.opencv:open_device", ("v4l2:N", "v4l2:/dev/videoN", "N"),
        _opencv_options("MJPG", 1), summary="a USB/V4L2 camera via OpenCV",
        accepts=r"\d+|/dev/.+", claims=_is_device,
    ),
    Scheme(
        "stream", "edgekit.camera.opencv:open_stream", ("rtsp://...", "http(s)://..."),
        _opencv_options(None, None), summary="a network stream via OpenCV's FFMPEG",
        words=("rtsp", "rtsps", "rtmp", "http", "https", "udp", "tcp", "srt"), whole_uri=True,
    ),
    Scheme(
        "folder", "edgekit.camera.files:ImageFolderSource", ("folder:DIR", "DIR"),
        (Option("fps", "float", ge=MIN_FPS, le=MAX_FPS, help="pace to this rate (default: as fast as asked)"), _LOOP),
        summary="the images of a folder in name order", claims=_is_dir,
    ),
    Scheme(
        "file", "edgekit.camera.files:open_video", ("file:PATH", "PATH.mp4"),
        (Option("pace", "bool", True, help="deliver at the clip's frame rate"), _LOOP,
         Option("fps", "float", ge=MIN_FPS, le=MAX_FPS, help="override the clip's frame rate")),
        summary="a video clip", claims=_is_video_path,
    ),
    Scheme(
        "picamera2", "edgekit.camera.picamera:open_picamera", ("picamera2[:N]",),
        (Option("size", "size", help="the size delivered (the ISP resizes for free)"),
         Option("main_size", "size", help="main stream size when size= is a lores stream"),
         Option("format", "str", "RGB888"), Option("lores_format", "str", "YUV420"), _FPS,
         Option("buffer_count", "int", 4, ge=1), *_TIMEOUTS),
        summary="a Raspberry Pi camera", install_hint=PICAMERA2_INSTALL_HINT, accepts=r"\d*", bare=True,
    ),
    Scheme(
        "synthetic", "edgekit.camera.synthetic:open_synthetic", ("synthetic[:WxH[@FPS]]",),
        (Option("size", "size", (640, 360)), SYNTHETIC_FPS,
         Option("frames", "int", ge=0, help="end after this many frames"), _LOOP),
        summary="a moving test pattern", accepts=SYNTHETIC_SPEC, bare=True,
    ),
    Scheme(
        "vector", "edgekit.vector.camera:VectorSource", ("vector:SERIAL",),
        (Option("config_home", "path", help="directory holding .anki_vector/sdk_config.ini"),
         Option("connect_timeout_s", "float", 10.0, gt=0),
         Option("frame_timeout_s", "float", 5.0, gt=0, help="no new image for this long: connection lost"),
         Option("timeout_s", "float", gt=0, to="frame_timeout_s", help="the same as frame_timeout_s"),
         Option("behavior_control", "bool", True), Option("reconnect", "bool", False),
         Option("max_reconnects", "int", ge=0), Option("backoff_s", "pair", (0.5, 8.0), gt=0)),
        summary="an Anki Vector's camera", install_hint="pip install 'edgekit-vision[vector]'",
    ),
)}  # fmt: skip


def camera_uri_forms() -> list[str]:
    """Every camera URI form, from :data:`SCHEMES` (for help texts and error messages)."""
    return [form for scheme in SCHEMES.values() for form in scheme.forms]


URI_FORMS = " | ".join(camera_uri_forms())


def open_camera(uri: str | int, **options: Any) -> FrameSource:
    """Open a frame source from a URI.

    :data:`SCHEMES` lists the URI forms (:func:`camera_uri_forms`) and each scheme's
    options: ``v4l2:N``, ``v4l2:/dev/videoN`` or ``N`` (a USB camera), ``rtsp://...`` and
    ``http(s)://...`` (network streams), ``file:PATH`` or a path with a video suffix,
    ``folder:DIR`` or an existing directory, ``picamera2[:N]``, ``synthetic[:WxH[@FPS]]``
    and ``vector:SERIAL``. Options may be Python values or strings (from a command line or
    TOML: ``fps="15"``, ``size="640x480"``, ``loop="yes"``); they are converted to the
    declared type and range-checked. ``timeout_s`` means "no new frame for this long" for
    every live source.

    Returns:
        A source: an iterator of :class:`Frame` with ``close()``, ``stats()`` and context
        manager support. Live sources start their grabber thread here.

    Raises:
        CameraError: unknown or malformed URI, or a camera/file that cannot be opened.
        CameraOptionError: an unknown option or a bad value (a UsageError and a
            CameraError), naming the option.
        BackendUnavailable: picamera2 or the Vector SDK is not installed.
    """
    text = str(uri).strip()
    if not text:  # an empty string would otherwise name the current directory as a folder of frames
        raise CameraError("no camera given (empty URI)", f"use one of: {URI_FORMS}")
    scheme, target = _locate(text)
    checked = check_options(scheme, options, redact_uri(text))
    opener = resolve(scheme.opener, scheme.install_hint)
    return opener(target, **checked)


def _locate(text: str) -> tuple[Scheme, str]:
    """The scheme row for a URI, and the part its opener takes."""
    word, colon, rest = text.partition(":")
    by_word = {w: s for s in SCHEMES.values() for w in (s.words or (s.name,))}
    scheme = by_word.get(word.lower())
    if scheme is not None and (colon or scheme.bare):
        target = text if scheme.whole_uri else rest
        if not scheme.whole_uri and not re.fullmatch(scheme.accepts, target):
            raise CameraError(f"bad camera URI {text!r}", f"write {' or '.join(scheme.forms)}")
        return scheme, target
    for scheme in SCHEMES.values():  # no scheme: a device number, a folder, a clip
        if scheme.claims is not None and scheme.claims(text):
            return scheme, text
    if Path(text).exists():
        raise CameraError(f"{text}: not a video file or folder", f"video suffixes: {' '.join(VIDEO_SUFFIXES)}")
    raise CameraError(f"unknown camera {text!r}", f"use one of: {URI_FORMS}")


__all__ = [
    "DEFAULT_OPEN_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "PICAMERA2_INSTALL_HINT",
    "PICAMERA2_TO_BGR",
    "SCHEMES",
    "URI_FORMS",
    "VIDEO_SUFFIXES",
    "CameraError",
    "CameraOptionError",
    "Frame",
    "FrameSource",
    "ImageFolderSource",
    "LatestFrameSource",
    "OpenCVSource",
    "Option",
    "Picamera2Source",
    "Scheme",
    "SequenceSource",
    "SyntheticSource",
    "VideoFileSource",
    "camera_uri_forms",
    "open_camera",
    "parse_size",
    "redact_uri",
    "synthetic_frame",
]
