"""The camera scheme table (:data:`SCHEMES`), its row type and the option checks ``open_camera`` runs.

Each row (:class:`Scheme`) names its opener by dotted path, so a source whose library is
optional (picamera2, the Vector SDK) is imported only when it is opened, and declares the
options it takes (:class:`~edgekit.util.optionspec.Option`: a type, a default and a range).
Options arrive as proper Python values from code, or as strings from a command line
(``--camera-option fps=15``) and TOML; :func:`check_options` turns both into the declared type
and refuses unknown keys, so a typo is an error rather than a silently ignored value. The
sources never import this module (nor the ``edgekit.camera`` package face), so a row naming
one is no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.camera.base import (
    DEFAULT_OPEN_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    MAX_FPS,
    MIN_FPS,
    CameraOptionError,
    parse_size,
)
from edgekit.camera.files import VIDEO_SUFFIXES
from edgekit.camera.picamera import PICAMERA2_INSTALL_HINT
from edgekit.camera.synthetic import SYNTHETIC_FPS, SYNTHETIC_SPEC
from edgekit.util.optionspec import Option, OptionValueError, close_match

__all__ = ["SCHEMES", "CameraOptionError", "Scheme", "camera_value", "check_options"]


def camera_value(option: Option, value: Any, label: str) -> Any:
    """``value`` as ``option`` takes it (text allowed), or CameraOptionError naming the option:
    ``is not a number`` for the wrong type, ``must be >0`` for a value out of range."""
    try:
        return option.coerce(value)
    except OptionValueError as exc:
        fix = option.describe() + (f": {option.help}" if option.help else "")
        if exc.wrong_type or option.choices:
            what = f"is not {option.article()}" if exc.wrong_type else f"must be {exc.what}"
            raise CameraOptionError(f"{label}: option {option.name}={value!r} {what}", fix) from None
        high = option.high()
        raise CameraOptionError(
            f"{label}: option {option.name}={value!r} must be {option.bound() or '>=0'}"
            + (f" and at most {high:g}" if high is not None and option.le is None else ""), fix,
        ) from None


@dataclass(frozen=True)
class Scheme:
    """One row of the camera scheme table.

    ``opener`` (``"module:Name"``) is called as ``opener(target, **options)`` where
    ``target`` is the URI after ``name:`` (the whole URI when ``whole_uri``); ``target``
    must match the regular expression ``accepts``. ``words`` are the URI schemes the row
    claims (default: its name); ``bare`` lets the word stand alone (``synthetic``);
    ``claims`` recognises a URI with no scheme at all (``0``, ``clip.mp4``, a directory).
    ``forms`` are the URI forms shown in help and errors. ``shares_runtime``: the opener is also
    given the model's open runtime, positionally after ``target`` (``imx500`` reads the camera the
    imx500 backend opened).
    """

    name: str
    opener: str
    forms: tuple[str, ...]
    options: tuple[Option, ...] = ()
    install_hint: str | None = None
    summary: str = ""
    accepts: str = ".+"
    words: tuple[str, ...] = ()
    bare: bool = False
    whole_uri: bool = False
    claims: Callable[[str], bool] | None = None
    shares_runtime: bool = False

    @property
    def path(self) -> str:
        """The opener's dotted path: every plug-in table's row names its plug-in as ``path``."""
        return self.opener

    def describe(self) -> str:
        """One line for help: forms, summary and options."""
        opts = ", ".join(o.describe() for o in self.options) or "none"
        return f"{' | '.join(self.forms)}: {self.summary}; options: {opts}"


def check_options(scheme: Scheme, options: dict[str, Any], label: str) -> dict[str, Any]:
    """``options`` checked against ``scheme``: unknown keys refused, values coerced and
    range-checked, renamed where an option says ``to=``; a None value is left out, so the
    source uses its default.

    Raises CameraOptionError naming the key (and listing the accepted ones).
    """
    declared = {o.name: o for o in scheme.options}
    unknown = sorted(set(options) - set(declared))
    if unknown:
        close = close_match(unknown[0], declared)
        guess = f" (did you mean {close!r}?)" if close else ""
        raise CameraOptionError(
            f"{label}: unknown camera option(s) {', '.join(unknown)}{guess}",
            f"{scheme.name} takes: {', '.join(declared) or 'no options'}",
        )
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}  # passed-on name -> the key the caller used
    for key, value in options.items():
        if value is None:
            continue  # None means "the source's default", as it does for every keyword
        option = declared[key]
        name = option.to or key
        if name in out:
            first, second = sorted((given_as[name], key))
            raise CameraOptionError(f"{label}: give {first} or {second}, not both", "they are two names for one option")
        out[name], given_as[name] = camera_value(option, value, label), key
    return out


def _size(name: str, default: tuple[int, int] | None = None, help: str = "") -> Option:
    """A ``WxH`` option, read by the one frame-size parser."""
    return Option(name, "size", default, help, parse=parse_size)


_TIMEOUTS = (
    Option("timeout_s", "float", DEFAULT_TIMEOUT_S, gt=0, help="no new frame for this long: the camera stopped"),
    Option("open_timeout_s", "float", DEFAULT_OPEN_TIMEOUT_S, gt=0, help="wait this long for the first frame"),
)
_FPS = Option("fps", "float", ge=MIN_FPS, le=MAX_FPS, help="frames per second")
_LOOP = Option("loop", "bool", False, help="start again at the end")


def _opencv_options(fourcc: str | None, buffer_size: int | None) -> tuple[Option, ...]:
    return (
        _size("size", help="WIDTHxHEIGHT to request; stats()['size'] says what arrives"),
        _FPS,
        Option("fourcc", "str", fourcc, help="pixel format to request, e.g. MJPG"),
        Option("buffer_size", "int", buffer_size, ge=1, help="driver queue length (1: freshest)"),
        Option("params", "ints", help="extra cv2.VideoCapture open parameters: prop,value,..."),
        _size("decode_size", help="MJPEG only: decode at 1/2, 1/4 or 1/8 scale, still >= WxH "
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
        (_size("size", help="the size delivered (the ISP resizes for free)"),
         _size("main_size", help="main stream size when size= is a lores stream"),
         Option("format", "str", "RGB888"), Option("lores_format", "str", "YUV420"), _FPS,
         Option("buffer_count", "int", 4, ge=1), *_TIMEOUTS),
        summary="a Raspberry Pi camera", install_hint=PICAMERA2_INSTALL_HINT, accepts=r"\d*", bare=True,
        shares_runtime=True,  # only to say "use imx500" when the imx500 backend holds the camera
    ),
    Scheme(
        "imx500", "edgekit.camera.imx500:open_imx500", ("imx500",), _TIMEOUTS,
        summary="the Raspberry Pi AI Camera's frames, each with the outputs the sensor's network gave it "
                "(with an imx500 bundle: its backend opens the camera)",
        install_hint=PICAMERA2_INSTALL_HINT, accepts="", bare=True, shares_runtime=True,
    ),
    Scheme(
        "synthetic", "edgekit.camera.synthetic:open_synthetic", ("synthetic[:WxH[@FPS]]",),
        (_size("size", (640, 360)), SYNTHETIC_FPS,
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
