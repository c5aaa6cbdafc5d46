"""edgekit: take a trained vision model to small devices and prove how well it runs there.

The Python API mirrors the CLI:

>>> import edgekit                                                     # doctest: +SKIP
>>> results = edgekit.build("demo.keras", targets=["cpu"], calib="calib/fashion", out="dist")
>>> bundle = edgekit.load_bundle("dist/demo-cpu")
>>> with edgekit.open_runtime("dist/demo-cpu") as rt:
...     scores = rt.infer(edgekit.Preprocessor(rt.input_spec)(frame))[0]
>>> with edgekit.open_model("dist/demo-cpu") as model, edgekit.open_camera("synthetic") as cam:
...     for result in edgekit.Pipeline(model.runtime, model.labels).run(cam, max_frames=100):
...         print(result)

Importing edgekit loads neither TensorFlow nor any runtime backend; ``Pipeline``, ``open_camera``
and ``open_model`` are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from edgekit._version import __version__
from edgekit.bundle import Bundle, load_bundle
from edgekit.errors import EdgekitError
from edgekit.imaging.image import InputSpec, Preprocessor, preprocess
from edgekit.runtime import open_runtime

if TYPE_CHECKING:
    from edgekit.camera import open_camera
    from edgekit.model import open_model
    from edgekit.pipeline import Pipeline

# name -> the module that defines it, imported when the name is first read (PEP 562): the frame
# loop, the camera table and the model opener stay out of a plain `import edgekit`.
_LAZY = {"Pipeline": "edgekit.pipeline", "open_camera": "edgekit.camera", "open_model": "edgekit.model"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgekit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    # the public names only: the typing helpers this module imports (Any, TYPE_CHECKING, annotations)
    # are no API, and tab completion in a notebook must not offer them
    return sorted(__all__)


def build(*args: Any, **kwargs: Any):
    """Build verified bundles; see :func:`edgekit.builders.build.build` (imports TensorFlow lazily)."""
    from edgekit.builders.build import build as _build

    return _build(*args, **kwargs)


__all__ = ["Bundle", "EdgekitError", "InputSpec", "Pipeline", "Preprocessor", "build", "load_bundle", "open_camera",
           "open_model", "open_runtime", "preprocess", "__version__"]
