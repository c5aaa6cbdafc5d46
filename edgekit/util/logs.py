"""The ``edgekit`` logger on stderr at the level ``-v``/``-q`` ask for, the same for edgekit's verbs and
the robot demo (which has its own command line but shares the flags' meaning)."""

from __future__ import annotations

import argparse
import logging
import sys


def log_level(args: argparse.Namespace) -> int:
    """The ``edgekit`` logger's level for ``-v``/``-q``: WARNING by default."""
    if getattr(args, "quiet", False):
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(getattr(args, "verbose", 0) or 0, logging.DEBUG)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (callers and tests swap it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def log_to_stderr(args: argparse.Namespace) -> None:
    """Set the ``edgekit`` logger to :func:`log_level` and give it one stderr handler (once)."""
    logger = logging.getLogger("edgekit")
    logger.setLevel(log_level(args))
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
