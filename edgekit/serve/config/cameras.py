"""The cameras of ``edgekit serve``: ``[camera]`` (one) or ``[[camera]]`` (several, each with a
``name``), ``--camera [NAME=]URI`` on the command line, and each camera's motion gate keys.

A camera's name goes into MQTT topics (``<topic>/<name>/result``), Home Assistant ids, Prometheus
labels and every result, so it is held to ``[A-Za-z0-9_-]{1,32}``; names are unique even when
case and ``-``/``_`` are ignored (Home Assistant's ids fold both), and the words of the device's
own topics (``availability``, ``set``, ...) are refused: ``<topic>/set/result`` would reach the
command subscription.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from edgekit.camera.motion import MOTION_OPTIONS
from edgekit.errors import UsageError
from edgekit.util.optionspec import Option, by_name, defaults

NAME_PATTERN = "[A-Za-z0-9_-]{1,32}"
_NAME = re.compile(NAME_PATTERN)
# the device-level topics and the per-camera topic words: a camera may not be called like one of them
RESERVED_NAMES = frozenset({"availability", "stats", "events", "set", "result", "state", "label", "sensors",
                            "count", "snapshot"})
MOTION = by_name(MOTION_OPTIONS)
_MOTION_DEFAULT = defaults(MOTION_OPTIONS)
NAME_FIX = "use 1-32 letters, digits, '_' or '-', e.g. --camera door=v4l2:0 or [[camera]] name = \"door\""


@dataclass(frozen=True)
class CameraConfig:
    """``[camera]`` (or one ``[[camera]]``): where frames come from, what to do when they stop,
    and whether a motion gate keeps still frames from the model."""

    uri: str = "v4l2:0"
    options: dict = field(default_factory=dict)  # passed to open_camera(uri, **options)
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    stall_timeout_s: float = 5.0  # no frame for this long: camera unhealthy
    on_end: str = "reconnect"  # when the source ends: reconnect (live cameras) or stop (a clip)
    name: str = ""  # "" = the one unnamed camera; results, topics and metrics name a named one
    motion: bool = False  # infer only frames with motion (edgekit.camera.motion), a still one every refresh_s
    motion_threshold: int = _MOTION_DEFAULT["threshold"]
    motion_min_area: float = _MOTION_DEFAULT["min_area"]
    motion_refresh_s: float = _MOTION_DEFAULT["refresh_s"]
    motion_width: int = _MOTION_DEFAULT["width"]
    motion_alpha: float = _MOTION_DEFAULT["alpha"]


def motion_option(key: str) -> Option | None:
    """The spec of a ``motion_*`` key (the gate's own Option under the key's name), else None."""
    spec = MOTION.get(key.removeprefix("motion_")) if key.startswith("motion_") else None
    if spec is None:
        return None
    return Option(key, spec.type, spec.default, spec.help, spec.choices, spec.ge, spec.gt, spec.le)


def motion_settings(camera: CameraConfig) -> dict[str, Any]:
    """The camera's ``motion_*`` keys as :func:`~edgekit.camera.motion.motion_gate_from` takes them."""
    return {name: getattr(camera, f"motion_{name}") for name in MOTION}


def split_camera_flag(text: str) -> tuple[str, str]:
    """``--camera [NAME=]URI`` as ``(name, uri)`` (name ``""`` when there is none).

    ``NAME=`` counts only before any ``:`` or ``/``: ``rtsp://user:pw@host/s?a=b`` and
    ``file:a=b.mp4`` are URIs. A prefix that comes before them but is no valid name is an error
    (a typo must not become a file name); write such a file as ``file:PATH`` or ``./PATH``.
    """
    prefix, sep, uri = text.partition("=")
    if not sep or ":" in prefix or "/" in prefix:
        return "", text
    if not _NAME.fullmatch(prefix):
        raise UsageError(f"--camera {text!r}: {prefix!r} is not a camera name", NAME_FIX
                         + "; a file with '=' in its name: file:PATH")
    if not uri:
        raise UsageError(f"--camera {text!r} names camera {prefix!r} but gives no URI", "e.g. --camera door=v4l2:0")
    return prefix, uri


def check_names(cameras: tuple[CameraConfig, ...], where: str) -> None:
    """Several cameras: each named, by a valid name, no two alike (ignoring case and ``-``/``_``)."""
    seen: dict[str, str] = {}
    for n, camera in enumerate(cameras, 1):
        name = camera.name
        if not name:
            if len(cameras) > 1:
                raise UsageError(f"{where}: camera {n} of {len(cameras)} ({camera.uri!r}) has no name",
                                 "name every camera: [[camera]] name = \"door\", or --camera door=URI")
            continue
        if not _NAME.fullmatch(name):
            raise UsageError(f"{where}: {name[:40]!r} is not a valid camera name", NAME_FIX)
        if name.lower() in RESERVED_NAMES:
            raise UsageError(f"{where}: camera name {name!r} is one of the device's own MQTT topics",
                             "choose another name; taken: " + ", ".join(sorted(RESERVED_NAMES)))
        key = name.lower().replace("-", "_")
        if key in seen:
            raise UsageError(f"{where}: cameras {seen[key]!r} and {name!r} have the same name",
                             "give each camera its own name: case and '-'/'_' do not tell names apart")
        seen[key] = name
