"""What the model is fed and what its outputs are called: preprocessing and labels for a build.

Both come from files saved beside the model (``<stem>.preprocess.json``, ``<stem>.labels.txt``,
as ``robot.train`` writes them), overridden by what the user gives; preprocessing that cannot
fit the model's input is refused before any work is done.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from edgekit.builders.source import SourceModel
from edgekit.errors import UsageError
from edgekit.image import MAX_SIDE, InputSpec
from edgekit.model import read_labels

PREPROCESS_KEYS = ("colour", "crop", "resize", "interpolation", "mean", "std")


def read_sidecars(model_path: Path) -> tuple[list[str] | None, dict]:
    """Labels and preprocessing saved beside a model as ``<stem>.labels.txt`` / ``<stem>.preprocess.json``."""
    stem = model_path.with_suffix("") if model_path.is_file() else model_path
    labels_file = Path(f"{stem}.labels.txt")
    if not labels_file.is_file() and model_path.is_dir():
        labels_file = model_path / "labels.txt"
    labels = read_labels(labels_file) if labels_file.is_file() else None
    pre_file = Path(f"{stem}.preprocess.json")
    preprocess = {}
    if pre_file.is_file():
        try:
            preprocess = json.loads(pre_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"cannot read {pre_file.name}: {exc}".splitlines()[0][:300],
                             "fix the JSON object in it, or delete it and give the --colour/--crop/--mean/--std flags"
                             ) from exc
        if not isinstance(preprocess, dict):
            raise UsageError(f"{pre_file.name} holds {type(preprocess).__name__}, not an object",
                             'write an object such as {"colour": "gray", "crop": [200, 200]}')
    return labels or None, preprocess


def explicit_labels(labels: tuple[str, ...] | Path | None) -> list[str] | None:
    """The labels the user gave: a list as it is, a file read (one label per line)."""
    if isinstance(labels, Path):
        return read_labels(labels)
    return list(labels) if labels else None


def preprocessing(given: dict[str, Any], channels: int, raw_pixels: bool = False) -> dict[str, Any]:
    """InputSpec keywords (``given``: PREPROCESS_KEYS only) for a ``channels``-channel image, defaults added, checked.

    Defaults: grey or RGB by channel count, pixels scaled to [0, 1] (mean 0, std 255), or left
    0-255 (std 1) for a model that scales its own pixels (``raw_pixels``: a Keras model whose first
    layer is Rescaling, :func:`edgekit.builders.source.scales_own_pixels`) unless a mean or std
    is given; one mean/std value is repeated for every channel.
    """
    # a single number (a preprocess.json may say "mean": 127.5) counts as one value per channel
    spec_kw = {k: (tuple(v) if isinstance(v, list) else (v,) if k in ("mean", "std") and isinstance(v, (int, float))
                   else v) for k, v in given.items()}
    spec_kw.setdefault("colour", "gray" if channels == 1 else "rgb")
    spec_kw.setdefault("mean", (0.0,) * channels)
    raw = raw_pixels and "mean" not in given and "std" not in given
    spec_kw.setdefault("std", (1.0 if raw else 255.0,) * channels)
    for key in ("mean", "std"):
        if isinstance(spec_kw[key], tuple) and len(spec_kw[key]) == 1 and channels > 1:
            spec_kw[key] = tuple(spec_kw[key]) * channels
    check_preprocess(spec_kw, channels)
    return spec_kw


def float_input_spec(source: SourceModel, spec_kw: dict[str, Any]) -> InputSpec:
    """The original model's float input: its shape and layout with the build's preprocessing."""
    h, w, c = source.input_hwc
    layout = source.layout
    shape = (1, h, w, c) if layout == "NHWC" else (1, c, h, w)
    return InputSpec(shape=shape, layout=layout, **spec_kw)


def check_preprocess(spec: dict, channels: int) -> None:
    """Reject preprocessing that cannot apply to this model, before any work is done."""
    crop = spec.get("crop")
    if crop not in (None, "none", "square") and (
        not isinstance(crop, (list, tuple)) or len(crop) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIDE for v in crop)
    ):
        raise UsageError(f"bad crop {crop!r}", "use square, none or HxW with positive sizes, like 200x200")
    for key in ("mean", "std"):
        values = spec.get(key, ())
        if isinstance(values, str) or not isinstance(values, (list, tuple)) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise UsageError(f"--{key} {values!r} is not a list of finite numbers", "use e.g. 127.5 or 0,0,0")
        if len(values) not in (1, channels):
            raise UsageError(f"--{key} has {len(values)} values for a {channels}-channel input",
                             f"give 1 or {channels} comma-separated values")
    if any(float(v) <= 0 for v in spec.get("std", ())):
        raise UsageError("--std must be positive (pixel = (value - mean) / std)", "use e.g. 255 or 127.5")
    for key, allowed in (("resize", ("stretch", "letterbox")), ("interpolation", ("area", "linear", "nearest"))):
        if spec.get(key, allowed[0]) not in allowed:
            raise UsageError(f"bad {key} {spec[key]!r}", f"use {' or '.join(allowed)}")
    if spec.get("colour") not in ("gray", "rgb", "bgr"):
        raise UsageError(f"bad colour {spec.get('colour')!r}", "use gray, rgb or bgr")
    if channels == 1 and spec["colour"] != "gray" or channels == 3 and spec["colour"] == "gray":
        raise UsageError(f"colour {spec['colour']} does not fit a {channels}-channel model input",
                         "use --colour gray for 1 channel, rgb or bgr for 3")
