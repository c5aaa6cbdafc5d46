"""What the model is fed and what its outputs are called: preprocessing and labels for a build.

They come from what the user gives, then files saved beside the model (``<stem>.preprocess.json``,
``<stem>.labels.txt``, as ``robot.train`` writes them), then what the model file declares
(Ultralytics ONNX metadata, TFLite metadata): the one rule of :mod:`edgekit.modelinfo.preprocessing`, which
``run`` and ``bench`` use too. Preprocessing that cannot fit the model's input is refused before
any work is done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.builders.sources.load import SourceModel
from edgekit.imaging.image import InputSpec
from edgekit.model import read_labels
from edgekit.modelinfo.preprocessing import PREPROCESS_KEYS, check_preprocess, fit_resize, preprocessing, resolve

__all__ = ["PREPROCESS_KEYS", "check_preprocess", "explicit_labels", "float_input_spec", "preprocessing",
           "read_sidecars"]


def read_sidecars(model_path: Path) -> tuple[list[str] | None, dict]:
    """Labels and preprocessing known before the flags: ``<stem>.labels.txt`` / ``<stem>.preprocess.json``
    beside the model, over what the model file declares (:func:`edgekit.modelinfo.preprocessing.resolve`)."""
    resolved = resolve(model_path)
    return resolved.labels, resolved.given


def explicit_labels(labels: tuple[str, ...] | Path | None) -> list[str] | None:
    """The labels the user gave: a list as it is, a file read (one label per line)."""
    if isinstance(labels, Path):
        return read_labels(labels)
    return list(labels) if labels else None


def float_input_spec(source: SourceModel, spec_kw: dict[str, Any]) -> InputSpec:
    """The original model's float input: its shape and layout with the build's preprocessing."""
    h, w, c = source.input_hwc
    layout = source.layout
    shape = (1, h, w, c) if layout == "NHWC" else (1, c, h, w)
    return InputSpec(shape=shape, layout=layout, **fit_resize(spec_kw, h, w))
