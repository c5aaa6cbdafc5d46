"""edgekit: take a trained vision model to small devices and prove how well it runs there.

The Python API mirrors the CLI:

>>> import edgekit                                                     # doctest: +SKIP
>>> results = edgekit.build("demo.keras", targets=["cpu"], calib="calib/fashion", out="dist")
>>> bundle = edgekit.load_bundle("dist/demo-cpu")
>>> with edgekit.open_runtime("dist/demo-cpu") as rt:
...     scores = rt.infer(edgekit.Preprocessor(rt.input_spec)(frame))[0]

Importing edgekit loads neither TensorFlow nor any runtime backend.
"""

from __future__ import annotations

from typing import Any

from edgekit._version import __version__
from edgekit.bundle import Bundle, load_bundle
from edgekit.errors import EdgekitError
from edgekit.image import InputSpec, Preprocessor, preprocess
from edgekit.runtime import open_runtime


def build(*args: Any, **kwargs: Any):
    """Build verified bundles; see :func:`edgekit.builders.build.build` (imports TensorFlow lazily)."""
    from edgekit.builders.build import build as _build

    return _build(*args, **kwargs)


__all__ = ["Bundle", "EdgekitError", "InputSpec", "Preprocessor", "build", "load_bundle", "open_runtime",
           "preprocess", "__version__"]
