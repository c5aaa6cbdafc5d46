"""SSD anchors: given as a list or ``.npy`` file, or generated from the common SSD anchor options.

An anchor is ``(cy, cx, h, w)`` normalised to [0, 1]; an SSD model regresses one box per
anchor (:mod:`edgekit.detect.ssd`). The generator follows the algorithm MediaPipe's
``SsdAnchorsCalculator`` documents (the TF Object Detection API's multiple-grid anchors with
the same option names): per layer a scale interpolated linearly from ``min_scale`` to
``max_scale``; consecutive layers with the same stride share one grid and pool their anchors;
per grid cell, one anchor per aspect ratio (``h = scale / sqrt(ratio)``, ``w = scale *
sqrt(ratio)``), plus one of ratio ``interpolated_scale_aspect_ratio`` at the geometric mean of
this layer's and the next layer's scale (1.0 after the last); ``reduce_boxes_in_lowest_layer``
gives the first layer the fixed set (0.1, 1:1), (scale, 2:1), (scale, 1:2);
``fixed_anchor_size`` makes every anchor 1 x 1 (the model regresses absolute sizes, as
BlazeFace does). Grid sizes are ``feature_map_height``/``feature_map_width`` when given, else
``ceil(input_size / stride)``; centres are ``(i + anchor_offset) / grid``; the order is row,
column, anchor, as the model's outputs are laid out.

With ``feature_map_*`` and no ``strides`` every layer is its own group (MediaPipe requires
strides for grouping; here a missing list means "all different").

Anchors read from a bundle are untrusted: every option is range-checked, the total count is
capped, and a ``.npy`` file is loaded with ``allow_pickle=False`` from a regular file only (a
FIFO or device is refused, not waited on). A bundle carries its anchors inline (a list in
``task_options.anchors``), as ``ssd_anchors`` options, or as a ``.npy`` file listed and hashed
in its ``files`` (:data:`edgekit.bundle.PATH_OPTIONS`; opening the bundle turns the name into
the file's absolute path). A path given here must be absolute (a relative path would be
resolved against the current directory, not the bundle).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import ModelError, UsageError, first_line
from edgekit.util.optionspec import Option, OptionValueError, did_you_mean
from edgekit.util.safe_open import open_regular

_DOCS = "see the SSD anchor options in edgekit.detect.anchors (MediaPipe SsdAnchorsCalculator names)"

MAX_ANCHORS = 1_000_000
"""More anchors than any real SSD has (MobileNet-SSD 320: 2,034; BlazeFace: 896)."""

MAX_GRID = 4096
"""The largest grid side or stride accepted."""

_OPTIONS = (
    Option("num_layers", "int", None, ge=1, le=32),
    Option("input_size_height", "int", 0, "needed with strides, not with feature map sizes", ge=0, le=16384),
    Option("input_size_width", "int", 0, ge=0, le=16384),
    Option("min_scale", "float", None, ge=1e-6, le=100.0),
    Option("max_scale", "float", None, ge=1e-6, le=100.0),
    Option("strides", "ints", (), ge=1, le=MAX_GRID),
    Option("feature_map_height", "ints", (), ge=1, le=MAX_GRID),
    Option("feature_map_width", "ints", (), ge=1, le=MAX_GRID),
    Option("aspect_ratios", "floats", (), ge=1e-3, le=1e3),
    Option("anchor_offset_x", "float", 0.5, ge=0.0, le=1.0),
    Option("anchor_offset_y", "float", 0.5, ge=0.0, le=1.0),
    Option("reduce_boxes_in_lowest_layer", "bool", False),
    Option("interpolated_scale_aspect_ratio", "float", 1.0, ge=0.0, le=1e3),
    Option("fixed_anchor_size", "bool", False),
)
"""The ``ssd_anchors`` options (MediaPipe ``SsdAnchorsCalculatorOptions`` names) with their ranges."""
MAX_LIST = 64
"""The longest list option (strides, feature map sizes, aspect ratios) accepted."""


def sub_option(table: str, option: Option, value: Any, docs: str) -> Any:
    """``value`` of a ``detect`` sub-option table (``ssd_anchors``, ``ssd_decode``) checked against
    ``option`` (typed, no text; a list at most :data:`MAX_LIST` long), or UsageError
    ``detect {table}.{name} must be ..., not ...`` with ``docs`` as the fix."""
    try:
        if isinstance(value, (list, tuple)) and len(value) > MAX_LIST:
            raise OptionValueError(option, value, f"a list of at most {MAX_LIST} numbers")
        out = option.coerce(value, text=False)
    except OptionValueError as exc:
        raise UsageError(f"detect {table}.{option.name} must be {exc.what}, not {value!r}", docs) from None
    return tuple(out) if isinstance(out, list) else out


def check_ssd_anchors(options: Any) -> tuple[tuple[str, Any], ...]:
    """The ``ssd_anchors`` options checked, with defaults, as a sorted hashable tuple (the cache key).

    Raises UsageError (one line) for an unknown option, a value out of range, list lengths that
    disagree with ``num_layers``, or more than :data:`MAX_ANCHORS` anchors in all.
    """
    if not isinstance(options, dict):
        raise UsageError(f"detect ssd_anchors must be a table of anchor options, not {options!r}")
    names = [o.name for o in _OPTIONS]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise UsageError(f"detect ssd_anchors has no option {unknown[0]!r}", did_you_mean(unknown[0], names))
    out: dict[str, Any] = {}
    for option in _OPTIONS:
        value = options.get(option.name, option.default)
        if value is None:
            raise UsageError(f"detect ssd_anchors needs {option.name}",
                             f"give {option.name} with the other anchor options")
        out[option.name] = sub_option("ssd_anchors", option, value, _DOCS)
    _check_layers(out)
    return tuple(sorted(out.items()))


def _check_layers(o: dict[str, Any]) -> None:
    layers = o["num_layers"]
    maps = o["feature_map_height"] or o["feature_map_width"]
    if maps and not (len(o["feature_map_height"]) == len(o["feature_map_width"]) == layers):
        raise UsageError(f"detect ssd_anchors: feature_map_height and feature_map_width need {layers} sizes "
                         f"each (num_layers), not {len(o['feature_map_height'])} and {len(o['feature_map_width'])}")
    if o["strides"] and len(o["strides"]) != layers:
        raise UsageError(f"detect ssd_anchors: strides has {len(o['strides'])} values for num_layers {layers}",
                         "give one stride per layer")
    if not maps and not o["strides"]:
        raise UsageError("detect ssd_anchors needs strides or feature_map_height/feature_map_width",
                         "give one stride (or one feature map size) per layer")
    if not maps and not (o["input_size_height"] and o["input_size_width"]):
        raise UsageError("detect ssd_anchors needs input_size_height and input_size_width with strides",
                         "give the model's input size (the grid is input size / stride)")
    total = sum(len(h) * gh * gw for h, _, gh, gw in _groups(o))
    if total == 0:
        raise UsageError("detect ssd_anchors makes no anchors (no aspect_ratios and "
                         "interpolated_scale_aspect_ratio 0)", "give aspect_ratios, e.g. [1.0]")
    if total > MAX_ANCHORS:
        raise UsageError(f"detect ssd_anchors makes {total} anchors, more than {MAX_ANCHORS}",
                         "check the strides or feature map sizes")


def _scale(o: dict[str, Any], index: int, count: int) -> float:
    lo, hi = o["min_scale"], o["max_scale"]
    return (lo + hi) * 0.5 if count == 1 else lo + (hi - lo) * index / (count - 1.0)


def _groups(o: dict[str, Any]):
    """Per group of same-stride layers: anchor heights, widths and the grid's height, width."""
    strides = o["strides"]
    count = len(strides) if strides else o["num_layers"]
    layer = 0
    while layer < o["num_layers"]:
        last = layer
        ratios: list[float] = []
        scales: list[float] = []
        while last < o["num_layers"] and (last == layer or (strides and strides[last] == strides[layer])):
            scale = _scale(o, last, count)
            if last == 0 and o["reduce_boxes_in_lowest_layer"]:
                ratios += [1.0, 2.0, 0.5]
                scales += [0.1, scale, scale]
            else:
                ratios += list(o["aspect_ratios"])
                scales += [scale] * len(o["aspect_ratios"])
                if o["interpolated_scale_aspect_ratio"] > 0:
                    following = 1.0 if last == count - 1 else _scale(o, last + 1, count)
                    scales.append(math.sqrt(scale * following))
                    ratios.append(o["interpolated_scale_aspect_ratio"])
            last += 1
        root = np.sqrt(np.asarray(ratios, np.float64))
        heights, widths = np.asarray(scales) / root, np.asarray(scales) * root
        if o["feature_map_height"]:
            gh, gw = o["feature_map_height"][layer], o["feature_map_width"][layer]
        else:
            gh = math.ceil(o["input_size_height"] / strides[layer])
            gw = math.ceil(o["input_size_width"] / strides[layer])
        yield heights, widths, gh, gw
        layer = last


@lru_cache(maxsize=16)
def generate(options: tuple[tuple[str, Any], ...]) -> np.ndarray:
    """``[N, 4]`` anchors ``(cy, cx, h, w)`` from checked options (:func:`check_ssd_anchors`); cached
    per option set and read-only (shared between detectors)."""
    o = dict(options)
    parts = []
    for heights, widths, gh, gw in _groups(o):
        k = len(heights)
        cy = (np.arange(gh) + o["anchor_offset_y"]) / gh
        cx = (np.arange(gw) + o["anchor_offset_x"]) / gw
        grid = np.empty((gh, gw, k, 4), np.float32)
        grid[..., 0] = cy[:, None, None]
        grid[..., 1] = cx[None, :, None]
        grid[..., 2] = 1.0 if o["fixed_anchor_size"] else heights
        grid[..., 3] = 1.0 if o["fixed_anchor_size"] else widths
        parts.append(grid.reshape(-1, 4))
    anchors = np.concatenate(parts)
    anchors.flags.writeable = False
    return anchors


def check_anchors(value: Any) -> np.ndarray | None:
    """The ``anchors`` option as a read-only ``[N, 4]`` float32 array (None when not given).

    A list of ``[cy, cx, h, w]`` rows, or an absolute path to a ``.npy`` file (loaded without
    pickle). Raises UsageError (one line) for anything else.
    """
    if value is None:
        return None
    hint = "give [[cy, cx, h, w], ...] normalised to [0, 1], or an absolute path to an [N, 4] .npy file"
    if isinstance(value, str):
        path = Path(value)
        if not path.is_absolute() or path.suffix != ".npy":
            raise UsageError(f"detect anchors {value!r} must be an absolute path to a .npy file", hint)
        try:
            with open_regular(path) as f:  # a FIFO or device named here would hang run/bench/serve
                arr = np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise UsageError(f"detect anchors: cannot read {value}: {first_line(exc)}", hint) from exc
    elif isinstance(value, (list, tuple)) and len(value) <= MAX_ANCHORS:
        try:
            arr = np.asarray(value, np.float32)
        except (TypeError, ValueError) as exc:
            raise UsageError("detect anchors must be a list of [cy, cx, h, w] rows of numbers", hint) from exc
    else:
        raise UsageError(f"detect anchors must be a list or a .npy path, not {type(value).__name__}", hint)
    if arr.ndim != 2 or arr.shape[1] != 4 or not 0 < arr.shape[0] <= MAX_ANCHORS or arr.dtype.kind not in "fiu":
        raise UsageError(f"detect anchors must be [N, 4] numbers, not shape {list(arr.shape)} {arr.dtype}", hint)
    arr = np.ascontiguousarray(arr, np.float32)
    if not np.isfinite(arr).all():
        raise UsageError("detect anchors hold a NaN or infinite value", hint)
    arr.flags.writeable = False
    return arr


def anchors_for(config: Any, n: int) -> np.ndarray:
    """The ``[n, 4]`` anchors of ``config`` (``anchors``, else generated from ``ssd_anchors``).

    Raises ModelError when neither is configured or the count is not the model's ``n``.
    """
    anchors = config.anchors if isinstance(config.anchors, np.ndarray) else check_anchors(config.anchors)
    if anchors is None:
        if not config.ssd_anchors:
            raise ModelError("the SSD layout needs anchors", "set the detect option anchors or ssd_anchors")
        options = config.ssd_anchors
        anchors = generate(options if isinstance(options, tuple) else check_ssd_anchors(options))
    if anchors.shape[0] != n:
        raise ModelError(f"the model has {n} boxes, the anchors {anchors.shape[0]}",
                         "check the anchor options (strides, feature map sizes, aspect ratios, "
                         "interpolated_scale_aspect_ratio) against the model's export config")
    return anchors
