"""Waiting in tests for something another thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01,
               what: str = "condition") -> T:
    """Call ``predicate`` until it returns something true and return that; AssertionError naming
    ``what`` after ``timeout`` seconds.

    The timeout is a ceiling, not an expected time: a loaded 2-core machine can take seconds for
    what takes milliseconds alone, and a passing wait returns as soon as the condition holds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout} s")
