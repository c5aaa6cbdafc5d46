"""One option spec for every plug-in table: runtime backends, camera schemes, task heads, the serve config.

An :class:`Option` says what one option is (name, type, default, range or choices, help) and turns a
value into that type: a Python value from code, or text from a command line (``--camera-option
fps=15``, ``-T k=5``) when the caller allows text. A value that does not fit raises
:class:`OptionValueError` saying what the option takes (``a whole number from 1 to 64``); each
table puts that into its own one-line message with its own fix, because where the value came
from (a bundle, a flag, a TOML table) is what the fix names. :func:`close_match` is the one
did-you-mean for an unknown name.

Types: ``int``, ``float``, ``bool``, ``str``, ``path`` (a str or os.PathLike, kept as given),
``ints``/``floats`` (a list, or ``"1,2"``), ``pair`` (two floats), ``strs`` (a string or a list of
strings, kept as given), ``str_or_list`` (either, kept as given), ``list`` (a list or tuple of
anything), ``table`` (a dict) and ``any``; any other type name (``size``) needs ``parse``, the
function that reads it.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edgekit.errors import EdgekitError

MAX_FLOAT = 365 * 86400.0
"""The largest float an option takes unless its ``le`` says otherwise: seconds and rates beyond a
year overflow waits and frame clocks (fps=1e-300 made a frame time infinite)."""

_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
               "on": True, "off": False}  # fmt: skip


class OptionValueError(ValueError):
    """A value that does not fit its option; ``what`` is what the option takes (``a number from 0
    to 1``), for the table's own message; ``wrong_type`` when the value is not of the option's type
    at all (rather than out of its range or choices)."""

    def __init__(self, option: Option, value: Any, what: str, wrong_type: bool = False):
        super().__init__(f"{option.name}={value!r} must be {what}")
        self.option, self.value, self.what, self.wrong_type = option, value, what, wrong_type


@dataclass(frozen=True)
class Option:
    """One option a plug-in takes.

    ``ge``/``gt``/``le`` bound a number (each number of ``ints``, ``floats`` and ``pair``); a float
    is at most :data:`MAX_FLOAT` unless ``le`` says otherwise. ``choices`` lists the values allowed
    (compared after coercion). ``default`` is what the plug-in uses when the option is not given
    (shown in help; plug-ins read it from here). ``to`` passes the value on under another name (one
    spelling for several sources); ``parse`` reads a type this module does not know (``size``).
    """

    name: str
    type: str
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    to: str | None = None
    parse: Callable[[Any], Any] | None = None

    def coerce(self, value: Any, text: bool = True) -> Any:
        """``value`` as this option's type, range- and choice-checked; None passes (the plug-in's default).

        ``text`` lets a number or a bool arrive as text (a flag, a URI), and a bool as 0 or 1: off
        where the source is typed (TOML, JSON), so ``threads = "4"`` is still refused there.
        Raises OptionValueError.
        """
        if value is None:
            return None
        try:
            out = self._convert(value, text)
        except (TypeError, ValueError, EdgekitError) as exc:
            raise OptionValueError(self, value, self.takes(), wrong_type=True) from exc
        if self.choices and out not in self.choices:
            raise OptionValueError(self, value, f"one of: {', '.join(map(_show, self.choices))}")
        high = self.high()
        for number in _numbers(out, self.type):
            if (self.gt is not None and not number > self.gt) or (self.ge is not None and not number >= self.ge) \
                    or (high is not None and number > high):
                raise OptionValueError(self, value, self.takes())
        return out

    def _convert(self, value: Any, text: bool) -> Any:
        if self.parse is not None:
            return self.parse(value)
        if not text and ((isinstance(value, str) and self.type in _TYPED)
                         or (self.type == "bool" and not isinstance(value, bool))):
            raise TypeError(value)  # a typed source said "4" where it means 4, or 1 where it means true
        return _CONVERT[self.type](value)

    def high(self) -> float | None:
        """The largest number allowed, or None."""
        return self.le if self.le is not None else MAX_FLOAT if self.type in ("float", "floats", "pair") else None

    def bound(self) -> str:
        """The range as text (``>0``, ``>=1``, ``>0,<=10000``), empty when unbounded."""
        low = f">{self.gt:g}" if self.gt is not None else f">={self.ge:g}" if self.ge is not None else ""
        high = f"<={self.le:g}" if self.le is not None else ""
        return ",".join(p for p in (low, high) if p)

    def article(self) -> str:
        """The type in words: ``a whole number``, ``true or false``."""
        return _ARTICLE.get(self.type, f"a {self.type}")

    def takes(self) -> str:
        """What a value must be, in words: ``a whole number from 1 to 64``, ``true or false``."""
        if self.choices:
            return f"one of: {', '.join(map(_show, self.choices))}"
        what = self.article()
        low = self.gt if self.gt is not None else self.ge
        high = self.high()
        if low is not None and high is not None:
            return f"{what} from {low:g}{' (exclusive)' if self.gt is not None else ''} to {high:g}"
        if low is not None:
            return f"{what} {'above' if self.gt is not None else 'of at least'} {low:g}"
        return f"{what} of at most {high:g}" if high is not None else what

    def describe(self) -> str:
        """``name=type`` with its range and default, e.g. ``fps=float>0 (default 5)``."""
        default = "" if self.default is None else f" (default {_show(self.default)})"
        return f"{self.name}={_SHOWN_TYPE.get(self.type, self.type)}{self.bound()}{default}"


def by_name(options: Iterable[Option]) -> dict[str, Option]:
    """``options`` keyed by name."""
    return {o.name: o for o in options}


def defaults(options: Iterable[Option]) -> dict[str, Any]:
    """Each option's default, by name: what a plug-in's keyword defaults are read from."""
    return {o.name: o.default for o in options}


def close_match(name: str, names: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name ``name`` is most likely a typo of, or None (the one did-you-mean)."""
    found = difflib.get_close_matches(str(name), list(names), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(name: str, names: Iterable[str], cutoff: float = 0.6) -> str:
    """The fix line for an unknown ``name``: ``did you mean 'k'?``, else the names known."""
    names = list(names)
    close = close_match(name, names, cutoff)
    return f"did you mean {close!r}?" if close else f"known: {', '.join(names) or 'none'}"


def coerce_all(options: Iterable[Option], given: Mapping[str, Any], text: bool = True) -> dict[str, Any]:
    """``given`` checked against ``options``, keys kept: raises KeyError naming the first unknown key
    (sorted) and OptionValueError for a value that does not fit; the caller words both."""
    declared = by_name(options)
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise KeyError(unknown[0])
    return {key: declared[key].coerce(value, text) for key, value in given.items()}


def _numbers(value: Any, kind: str) -> tuple:
    if kind in ("int", "float"):
        return (value,)
    return tuple(value) if kind in ("ints", "floats", "pair") else ()


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
        raise TypeError(value)  # True is an int to Python, never a count to a user
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(value)
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    if not isinstance(value, int):
        raise TypeError(value)
    return int(value)


def _to_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(value)
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(value)  # nan slips through every range check
    return out


def _typed(kind: type | tuple[type, ...]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if not isinstance(value, kind):
            raise TypeError(value)
        return value

    return convert


def _items(value: Any) -> list:
    if isinstance(value, str):
        return [v for v in re.split(r"[,\s]+", value.strip()) if v]
    if not isinstance(value, (list, tuple)):
        raise TypeError(value)
    return list(value)


def _to_pair(value: Any) -> tuple[float, float]:
    first, second = (_to_float(v) for v in _items(value))
    return first, second


def _to_strs(value: Any) -> Any:
    if isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
        return value
    raise TypeError(value)


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "int": _to_int,
    "float": _to_float,
    "bool": _to_bool,
    "str": _typed(str),
    "path": _typed((str, os.PathLike)),  # a Path stays a Path
    "ints": lambda v: [_to_int(i) for i in _items(v)],
    "floats": lambda v: [_to_float(i) for i in _items(v)],
    "pair": _to_pair,
    "strs": _to_strs,
    "str_or_list": _typed((str, list, tuple)),
    "list": _typed((list, tuple)),
    "table": _typed(dict),
    "any": lambda v: v,
}
_TYPED = ("int", "float", "bool", "ints", "floats", "pair")  # types whose text form a typed source must not use
_ARTICLE = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "path": "a path",
    "size": "a size WIDTHxHEIGHT",
    "ints": "a list of whole numbers",
    "floats": "a list of numbers",
    "pair": "two numbers",
    "strs": "a string or a list of strings",
    "str_or_list": "a string or a list",
    "list": "a list",
    "table": "a table",
    "any": "a value",
}
_SHOWN_TYPE = {"size": "WxH", "ints": "int,int,...", "floats": "float,float,...", "pair": "float,float"}


def _show(value: Any) -> str:
    """A value as a user would type it: ``640x360``, ``true``, ``0.5,8``, ``5``."""
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"{value[0]}x{value[1]}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)
