"""The row types of the camera scheme table and the option checks ``open_camera`` runs.

Each row (:class:`Scheme`) names its opener by dotted path, so a source whose library is
optional (picamera2, the Vector SDK) is imported only when it is opened, and declares the
options it takes (:class:`Option`: a type, a default and a range). Options arrive as proper
Python values from code, or as strings from a command line (``--camera-option fps=15``)
and TOML; :func:`check_options` turns both into the declared type and refuses unknown keys,
so a typo is an error rather than a silently ignored value.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgekit.camera.base import parse_size
from edgekit.errors import CameraError, UsageError

# Seconds and rates beyond this overflow the waits and the frame clock (fps=1e-300 made
# ``int(k * 1e9 / fps)`` infinite; open_timeout_s=1e300 overflowed OpenCV's open parameters).
MAX_FLOAT = 365 * 86400.0
MIN_FPS, MAX_FPS = 0.001, 10000.0  # one frame per 17 minutes .. a high-speed camera


class CameraOptionError(UsageError, CameraError):
    """A camera option that does not exist or has a bad value.

    A UsageError (retrying will not fix it: the daemon stops instead of reconnecting) and
    a CameraError (what callers of ``open_camera`` have always caught)."""


@dataclass(frozen=True)
class Option:
    """One option a camera scheme accepts.

    ``type`` is one of ``int``, ``float``, ``bool``, ``str``, ``path``, ``size`` (``(w, h)``
    or ``"WxH"``), ``ints`` (``[1, 2]`` or ``"1,2"``) or ``pair`` (two floats, ``"0.5,8"``).
    ``gt``/``ge``/``le`` bound numbers (for ``pair``, each number); a float is at most
    :data:`MAX_FLOAT` unless ``le`` says otherwise. ``default`` is what the source
    uses when the option is not given (shown in help; the source applies it). ``to`` passes
    the value on under another name (one spelling, ``timeout_s``, for every source).
    """

    name: str
    type: str
    default: Any = None
    gt: float | None = None
    ge: float | None = None
    help: str = ""
    to: str | None = None
    le: float | None = None

    def bound(self) -> str:
        """The range as text (``>0``, ``>=1``, ``>0,<=10000``), empty when unbounded."""
        low = f">{self.gt:g}" if self.gt is not None else f">={self.ge:g}" if self.ge is not None else ""
        return low + (f",<={self.le:g}" if low and self.le is not None else f"<={self.le:g}" if self.le else "")

    def _high(self) -> float | None:
        return self.le if self.le is not None else MAX_FLOAT if self.type in ("float", "pair") else None

    def describe(self) -> str:
        """``name=type`` with its range and default, e.g. ``fps=float>0``."""
        default = "" if self.default is None else f" (default {_show(self.default)})"
        return f"{self.name}={_SHOWN_TYPE.get(self.type, self.type)}{self.bound()}{default}"

    def coerce(self, value: Any, label: str) -> Any:
        """``value`` as this option's type, range-checked; None passes (the source's default).

        Raises CameraOptionError naming the option.
        """
        if value is None:
            return None
        try:
            out = _COERCE[self.type](value)
        except (TypeError, ValueError, CameraError) as exc:
            raise CameraOptionError(
                f"{label}: option {self.name}={value!r} is not {_ARTICLE[self.type]}",
                self.describe() + (f": {self.help}" if self.help else ""),
            ) from exc
        for number in out if self.type == "pair" else (out,) if self.type in ("int", "float") else ():
            high = self._high()
            if (self.gt is not None and not number > self.gt) or (self.ge is not None and not number >= self.ge) \
                    or (high is not None and number > high):
                raise CameraOptionError(
                    f"{label}: option {self.name}={value!r} must be {self.bound() or '>=0'}"
                    + (f" and at most {high:g}" if high is not None and self.le is None else ""),
                    self.describe() + (f": {self.help}" if self.help else ""),
                )
        return out


@dataclass(frozen=True)
class Scheme:
    """One row of the camera scheme table.

    ``opener`` (``"module:Name"``) is called as ``opener(target, **options)`` where
    ``target`` is the URI after ``name:`` (the whole URI when ``whole_uri``); ``target``
    must match the regular expression ``accepts``. ``words`` are the URI schemes the row
    claims (default: its name); ``bare`` lets the word stand alone (``synthetic``);
    ``claims`` recognises a URI with no scheme at all (``0``, ``clip.mp4``, a directory).
    ``forms`` are the URI forms shown in help and errors.
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
        raise CameraOptionError(
            f"{label}: unknown camera option(s) {', '.join(unknown)}",
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
        out[name], given_as[name] = option.coerce(value, label), key
    return out


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    raise ValueError(value)


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(value)  # True is an int to Python, never a frame count to a user
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(value)
        return int(value)
    return int(value.strip()) if isinstance(value, str) else int(value)


def _to_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(value)
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(value)
    return out


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(value)
    return value


def _to_path(value: Any) -> Any:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(value)
    return value  # a Path stays a Path


def _items(value: Any) -> list:
    return [v for v in re.split(r"[,\s]+", value.strip()) if v] if isinstance(value, str) else list(value)


def _to_pair(value: Any) -> tuple[float, float]:
    first, second = (_to_float(v) for v in _items(value))
    return first, second


_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
               "on": True, "off": False}  # fmt: skip
_COERCE: dict[str, Callable[[Any], Any]] = {
    "int": _to_int,
    "float": _to_float,
    "bool": _to_bool,
    "str": _to_str,
    "path": _to_path,
    "size": parse_size,
    "ints": lambda v: [_to_int(i) for i in _items(v)],
    "pair": _to_pair,
}
_ARTICLE = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false (or yes/no, 1/0)",
    "str": "a string",
    "path": "a path",
    "size": "a size WIDTHxHEIGHT",
    "ints": "a list of whole numbers",
    "pair": "two numbers",
}


_SHOWN_TYPE = {"size": "WxH", "ints": "int,int,...", "pair": "float,float"}


def _show(value: Any) -> str:
    """A default as a user would type it: ``640x360``, ``true``, ``0.5,8``, ``5``."""
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"{value[0]}x{value[1]}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else str(value)
