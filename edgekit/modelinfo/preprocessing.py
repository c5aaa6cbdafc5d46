"""Where a model's preprocessing comes from: flags, then its sidecar file, then the model itself.

One precedence rule for ``build``, ``run`` and ``bench``, key by key:

1. flags (``--colour --crop --mean --std --resize --interpolation --pad-value``, or keyword arguments);
2. ``<model>.preprocess.json`` beside the model (as ``robot.train`` writes it);
3. what the model says: for a file of a bundle, what the bundle's ``edgekit.json`` records for it
   (:mod:`edgekit.modelinfo.bundled`), else what the file declares (:mod:`edgekit.modelinfo.embedded`:
   Ultralytics ONNX metadata, TFLite metadata); and a first op dividing the image by 255
   (:mod:`edgekit.modelinfo.rescale`), which makes the default pixels 0-255;
4. defaults: gray or RGB by channel count, pixels / 255, stretched, no crop.

Labels follow the same order (``--labels``, ``<model>.labels.txt``, the model's own). Every
value remembers where it came from (:class:`Resolved`), so ``run`` can say what it assumed.
``--resize crop`` is a centre crop to the input's aspect ratio followed by a resize; the
InputSpec stores it as that crop (``"h:w"``) so boxes map back through the same window.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import UsageError, first_line

PREPROCESS_KEYS = ("colour", "crop", "resize", "interpolation", "mean", "std", "pad_value")
RESIZE_MODES = ("stretch", "letterbox", "crop")
INTERPOLATIONS = ("area", "linear", "nearest", "cubic")  # edgekit.imaging.imgops.INTERPOLATIONS, without numpy
INTERPOLATION_HELP = ("how the frame is resized to the input: area (averages: the default), linear (bilinear, as "
                      "MediaPipe and Ultralytics resize), nearest or cubic (OpenCV's INTER_*; numpy equivalents "
                      "within one grey level without OpenCV)")
FLAG, DEFAULT = "flag", "default"
_MAX_SIDE = 16384  # edgekit.imaging.image.MAX_SIDE, without importing numpy for argparse


@dataclass(frozen=True)
class Resolved:
    """Preprocessing for one model with the origin of every value (``flag``, ``sidecar NAME``,
    the embedded source such as ``Ultralytics ONNX metadata``, or ``default``)."""

    given: dict[str, Any]
    origin: dict[str, str]
    labels: list[str] | None = None
    labels_origin: str | None = None
    embedded: Any = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    scales_own_pixels: str | None = None  # why the graph takes 0-255 pixels (when no layer gives mean or std)


def read_sidecar_files(model_path: Path) -> tuple[list[str] | None, dict, Path | None]:
    """Labels and preprocessing saved beside a model as ``<stem>.labels.txt`` / ``<stem>.preprocess.json``
    (and the preprocess file's path, None when there is none)."""
    from edgekit.bundle import read_labels

    stem = model_path.with_suffix("") if model_path.is_file() else model_path
    labels_file = Path(f"{stem}.labels.txt")
    if not labels_file.is_file() and model_path.is_dir():
        labels_file = model_path / "labels.txt"
    labels = read_labels(labels_file) if labels_file.is_file() else None
    pre_file = Path(f"{stem}.preprocess.json")
    if not pre_file.is_file():
        return labels or None, {}, None
    try:
        preprocess = json.loads(pre_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UsageError(f"cannot read {pre_file.name}: {first_line(exc, 300)}",
                         "fix the JSON object in it, or delete it and give the --colour/--crop/--mean/--std flags"
                         ) from exc
    if not isinstance(preprocess, dict):
        raise UsageError(f"{pre_file.name} holds {type(preprocess).__name__}, not an object",
                         'write an object such as {"colour": "gray", "crop": [200, 200]}')
    return labels or None, preprocess, pre_file


def resolve(model_path: Path, flags: dict[str, Any] | None = None, labels_flag: list[str] | None = None) -> Resolved:
    """Layer flags over the sidecar files over what the model declares (see the module notes).

    ``given`` holds only what one of the three layers says (defaults are added by
    :func:`preprocessing`, which knows the channel count); ``origin`` names the layer of each key.
    """
    from edgekit.modelinfo.bundled import bundle_record
    from edgekit.modelinfo.embedded import read_embedded

    embedded = (bundle_record(model_path) or read_embedded(model_path)) if model_path.is_file() else None
    side_labels, side_pre, side_file = read_sidecar_files(model_path)
    layers = [(embedded.source if embedded else "", embedded.preprocess if embedded else {}),
              (f"sidecar {side_file.name}" if side_file else "", side_pre), (FLAG, flags or {})]
    given: dict[str, Any] = {}
    origin: dict[str, str] = {}
    rank: dict[str, int] = {}
    for level, (name, values) in enumerate(layers):
        for key in PREPROCESS_KEYS:
            if key in values:
                given[key], origin[key], rank[key] = values[key], name, level
    if given.get("resize") == "crop" and "crop" in given and rank["resize"] > rank["crop"]:
        del given["crop"], origin["crop"]  # --resize crop over a classifier's saved square crop: the flag's crop
    labels, labels_origin = labels_flag, FLAG if labels_flag else None
    if not labels and side_labels:
        labels, labels_origin = side_labels, f"sidecar {Path(str(model_path.with_suffix(''))).name}.labels.txt"
    if not labels and embedded is not None and embedded.labels:
        labels, labels_origin = embedded.labels, embedded.source
    rescale = None
    if model_path.is_file() and "mean" not in given and "std" not in given:
        from edgekit.modelinfo.rescale import in_graph_rescale

        rescale = in_graph_rescale(model_path)
    return Resolved(given, origin, labels, labels_origin, embedded, embedded.notes if embedded else (), rescale)


def raw_pixels_origin(why: str) -> str:
    """Where 0-255 pixels came from, as :func:`describe` prints it (``model graph: its first op ...``)."""
    return f"model graph: {why}"


def preprocessing(given: dict[str, Any], channels: int, raw_pixels: bool = False) -> dict[str, Any]:
    """InputSpec keywords (``given``: PREPROCESS_KEYS only) for a ``channels``-channel image, defaults added, checked.

    Defaults: grey or RGB by channel count, pixels scaled to [0, 1] (mean 0, std 255), or left
    0-255 (std 1) for a model that scales its own pixels (``raw_pixels``: a Keras model whose first
    layer is Rescaling, :func:`edgekit.builders.sources.load.scales_own_pixels`, or a graph whose first op
    divides by 255, :func:`edgekit.modelinfo.rescale.in_graph_rescale`) unless a mean or std
    is given; one mean/std value is repeated for every channel. ``resize`` may still be ``crop``
    (:func:`fit_resize` turns it into a crop once the input's size is known).
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


def fit_resize(spec_kw: dict[str, Any], height: int, width: int) -> dict[str, Any]:
    """``resize: crop`` as the InputSpec cuts it: a centred crop of the input's aspect ratio, stretched."""
    if spec_kw.get("resize") != "crop":
        return spec_kw
    crop = "square" if height == width else f"{height}:{width}"
    return {**spec_kw, "resize": "stretch", "crop": crop}


def check_preprocess(spec: dict, channels: int) -> None:
    """Reject preprocessing that cannot apply to this model, before any work is done."""
    from edgekit.imaging.imgops import crop_problem

    crop = spec.get("crop")
    if crop_problem(tuple(crop) if isinstance(crop, list) else crop, _MAX_SIDE):
        raise UsageError(f"bad crop {crop!r}", "use square, none, HxW with positive sizes like 200x200, or h:w")
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
    for key, allowed in (("resize", RESIZE_MODES), ("interpolation", INTERPOLATIONS)):
        if spec.get(key, allowed[0]) not in allowed:
            raise UsageError(f"bad {key} {spec[key]!r}", f"use {' or '.join(allowed)}")
    if spec.get("resize") == "crop" and spec.get("crop") not in (None, "none"):
        raise UsageError(f"--resize crop crops to the input's aspect ratio; it cannot follow crop {crop!r}",
                         "give one of --resize crop and --crop")
    pad = spec.get("pad_value", 0)
    if not isinstance(pad, int) or isinstance(pad, bool) or not 0 <= pad <= 255:
        raise UsageError(f"bad pad_value {pad!r}", "use a whole number from 0 (black) to 255; Ultralytics uses 114")
    if spec.get("colour") not in ("gray", "rgb", "bgr"):
        raise UsageError(f"bad colour {spec.get('colour')!r}", "use gray, rgb or bgr")
    if channels == 1 and spec["colour"] != "gray" or channels == 3 and spec["colour"] == "gray":
        raise UsageError(f"colour {spec['colour']} does not fit a {channels}-channel model input",
                         "use --colour gray for 1 channel, rgb or bgr for 3")


def describe(spec: Any, origin: dict[str, str]) -> str:
    """The preprocessing of ``spec`` (an InputSpec) grouped by where each value came from, e.g.
    ``colour rgb, resize letterbox, pad_value 114 (Ultralytics ONNX metadata); crop none (default)``."""
    values = {
        "colour": spec.colour,
        "crop": "none" if spec.crop in (None, "none") else "x".join(map(str, spec.crop))
        if isinstance(spec.crop, (list, tuple)) else spec.crop,
        "resize": spec.resize, "interpolation": spec.interpolation,
        "mean": ",".join(f"{v:g}" for v in _one_or_all(spec.mean)),
        "std": ",".join(f"{v:g}" for v in _one_or_all(spec.std)),
        "pad_value": spec.pad_value,
    }
    if origin.get("resize") and origin.get("crop") is None and spec.crop not in (None, "none"):
        origin = {**origin, "crop": origin["resize"]}  # --resize crop made the crop
    if spec.resize != "letterbox" and origin.get("pad_value") != FLAG:
        values.pop("pad_value")  # no border to fill: not worth a word
    groups: dict[str, list[str]] = {}
    for key, value in values.items():
        groups.setdefault(origin.get(key) or DEFAULT, []).append(f"{key} {value}")
    order = sorted(groups, key=lambda o: (o == DEFAULT, o != FLAG, not o.startswith("sidecar"), o))
    return "; ".join(f"{', '.join(groups[o])} ({o})" for o in order)


def _one_or_all(values: tuple[float, ...]) -> tuple[float, ...]:
    return values[:1] if len(set(values)) == 1 else values


def add_preprocess_options(parser: argparse.ArgumentParser) -> None:
    """``--colour --crop --mean --std --resize --interpolation --pad-value`` for a bare model (run, bench)."""
    g = parser.add_argument_group("preprocessing of a bare model (over <model>.preprocess.json and the model's "
                                  "own metadata; a bundle records its own)")
    g.add_argument("--colour", choices=["gray", "rgb", "bgr"], help="the model's input colour")
    g.add_argument("--crop", help="'square', 'none', HxW centre crop in pixels (e.g. 200x200) or an aspect h:w")
    g.add_argument("--mean", help="per-channel mean in pixel units, e.g. 127.5 or 123.7,116.3,103.5")
    g.add_argument("--std", help="per-channel std in pixel units, e.g. 127.5 (with --mean 127.5: [-1, 1])")
    g.add_argument("--resize", choices=list(RESIZE_MODES),
                   help="stretch to the input size, letterbox (aspect kept, borders padded) or crop (centre crop "
                        "to the input's aspect ratio, then resize)")
    g.add_argument("--interpolation", choices=list(INTERPOLATIONS), help=INTERPOLATION_HELP)
    g.add_argument("--pad-value", type=pad_value, metavar="0-255", help="letterbox border grey (Ultralytics: 114)")


def pad_value(text: str) -> int:
    """An argparse type: a whole number 0..255."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from exc
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(f"must be 0 to 255, got {text}")
    return value


def preprocess_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The preprocessing flags given, parsed; unset ones are left out so the lower layers apply."""
    pre: dict[str, Any] = {k: getattr(args, k) for k in ("colour", "resize", "interpolation", "pad_value")
                           if getattr(args, k, None) is not None}
    crop = getattr(args, "crop", None)
    if crop in ("square", "none"):
        pre["crop"] = None if crop == "none" else "square"
    elif crop:
        pre["crop"] = crop if ":" in crop else _sizes(crop)
    for key in ("mean", "std"):
        value = getattr(args, key, None)
        if value:
            try:
                pre[key] = [float(v) for v in value.split(",")]
            except ValueError as exc:
                raise UsageError(f"bad --{key} {value!r}", "use numbers like 127.5 or 123.7,116.3,103.5") from exc
    return pre


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.lower().split("x")]
        if len(sizes) != 2:
            raise ValueError(text)
    except ValueError as exc:
        raise UsageError(f"bad --crop {text!r}", "use square, none, HxW like 200x200, or an aspect h:w") from exc
    return sizes
