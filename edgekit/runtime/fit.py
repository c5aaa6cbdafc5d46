"""Whether the backend a user asked for is the one that runs the model.

A backend (``--backend``, ``[model] backend``) replaces a bundle's adapter only for models of
the formats it runs, so one ``edgekit bench`` can mix a .tflite and an .onnx bundle. For the
one model of ``edgekit run`` or ``edgekit serve`` that rule meant a backend that cannot take
the model was ignored without a word: ``--backend tensorrt`` on a .tflite bundle ran LiteRT.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.runtime.registry import BACKENDS


def check_backend_fits(backend: str | None, runtime: Any, flag: str = "--backend") -> None:
    """UsageError when ``backend`` was asked for and ``runtime`` (already open) is not its adapter
    because the model is of a format that backend does not run."""
    if not backend or backend not in BACKENDS:
        return
    row = BACKENDS[backend]
    if f"{type(runtime).__module__}:{type(runtime).__name__}" == row.adapter:
        return
    formats = "/".join(row.formats)
    fmt = Path(str(getattr(runtime, "model_path", ""))).suffix.lstrip(".").lower() or "different"
    if fmt not in row.formats:
        raise UsageError(f"{flag} {backend} runs {formats} models; this model is a .{fmt} file",
                         f"drop {flag} (the bundle's own runtime runs it), or give a bundle built for a target "
                         f"whose models are {formats}")
