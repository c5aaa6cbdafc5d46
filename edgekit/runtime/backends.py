"""The row type of the runtime backend table and the limits adapters hold their options to.

The table itself (``BACKENDS``) is :mod:`edgekit.runtime.registry`; the adapters import this module
and :mod:`edgekit.util.optionspec` (their ``OPTIONS``), never the registry, so a row naming an
adapter is no import cycle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

MAX_THREADS = (os.cpu_count() or 1) * 4
"""The most CPU threads an adapter takes: more only slows inference down, and a copied bundle
asking LiteRT for 100000 crashed the process (every thread's stack is reserved at start)."""
MAX_MIB = 1 << 20
"""The largest memory size in MiB an option takes (1 TiB): a larger one is a typo."""
MAX_INDEX = 255
"""The largest device index an option takes."""


@dataclass(frozen=True)
class Backend:
    """One row of :data:`edgekit.runtime.registry.BACKENDS`."""

    adapter: str  # "package.module:Class"
    formats: tuple[str, ...]  # model formats it runs ("tflite", "onnx")
    defaults: dict[str, Any]  # options it starts from, before the caller's
    install_hint: str  # what to install when its library is missing
    summary: str = ""

    @property
    def path(self) -> str:
        """The adapter's dotted path: every plug-in table's row names its plug-in as ``path`` (the
        options are the adapter's ``OPTIONS``, read when it is imported; ``defaults`` fill them)."""
        return self.adapter
