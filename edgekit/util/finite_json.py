"""JSON that every parser reads: a non-finite number (NaN, +-Infinity) is written as ``null``.

Python's ``json.dumps`` writes ``NaN`` and ``Infinity`` by default, which is not JSON (RFC 8259):
``JSON.parse``, Go's ``encoding/json``, jq 1.6 and most MQTT/Prometheus tooling refuse the whole
line. They do occur: a latency summary of a stage with no measured frame is NaN, and a model
(or a bundle with a tampered ``std``) can emit NaN scores. ``null`` says "no number" in a way
every consumer understands, and ``allow_nan=False`` proves nothing non-finite slipped through.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (nested in dicts, lists and tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def strict_dumps(obj: Any, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> str:
    """``json.dumps`` with NaN/Infinity written as ``null`` (also in what ``default`` returns)."""
    wrapped = None if default is None else (lambda o: finite(default(o)))
    return json.dumps(finite(obj), default=wrapped, allow_nan=False, **kwargs)


def to_json(record: dict[str, Any]) -> str:
    """One compact JSON line (no newline), the payload of every output of ``edgekit serve`` (the
    JSON-lines file, MQTT, the events): numpy scalars as numbers, other objects as text."""
    return strict_dumps(record, separators=(",", ":"), default=_plain)


def _plain(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy scalars
    if callable(item):
        return item()
    return str(obj)
