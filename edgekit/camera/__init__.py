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
one table, :data:`~edgekit.camera.table.SCHEMES` (help and error messages are generated from it). Typical use::

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
from edgekit.camera.synthetic import SyntheticSource, synthetic_frame
from edgekit.camera.table import SCHEMES, CameraOptionError, Scheme, check_options
from edgekit.errors import CameraError
from edgekit.util.plugins import resolve


def camera_uri_forms() -> list[str]:
    """Every camera URI form, from :data:`SCHEMES` (for help texts and error messages)."""
    return [form for scheme in SCHEMES.values() for form in scheme.forms]


URI_FORMS = " | ".join(camera_uri_forms())


def open_camera(uri: str | int, runtime: Any = None, /, **options: Any) -> FrameSource:
    """Open a frame source from a URI.

    :data:`SCHEMES` lists the URI forms (:func:`camera_uri_forms`) and each scheme's
    options: ``v4l2:N``, ``v4l2:/dev/videoN`` or ``N`` (a USB camera), ``rtsp://...`` and
    ``http(s)://...`` (network streams), ``file:PATH`` or a path with a video suffix,
    ``folder:DIR`` or an existing directory, ``picamera2[:N]``, ``imx500``, ``synthetic[:WxH[@FPS]]``
    and ``vector:SERIAL``. Options may be Python values or strings (from a command line or
    TOML: ``fps="15"``, ``size="640x480"``, ``loop="yes"``); they are converted to the
    declared type and range-checked. ``timeout_s`` means "no new frame for this long" for
    every live source. ``runtime`` is the open runtime of the model the frames are for: a source
    that reads its device (``imx500``: the AI Camera the imx500 backend opened) needs it, the
    others ignore it.

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
    scheme, target = locate_scheme(text)
    checked = check_options(scheme, options, redact_uri(text))
    opener = resolve(scheme.opener, scheme.install_hint)
    return opener(target, runtime, **checked) if scheme.shares_runtime else opener(target, **checked)


def locate_scheme(text: str) -> tuple[Scheme, str]:
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
