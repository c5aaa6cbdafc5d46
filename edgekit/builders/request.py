"""One build request, declared once: every setting of ``edgekit build`` as an :class:`Option` with its flag.

:data:`SETTINGS` is the only place a build setting is named, typed, defaulted, bounded and explained.
From it come :class:`BuildRequest` (a frozen dataclass whose fields are the settings), the Python API's
keyword arguments (:func:`edgekit.builders.build.build` takes ``**settings``, checked by name here),
the argparse flags of ``edgekit build`` (:func:`add_flags`) and the gate thresholds the gates read
(:func:`default`). A new gate flag is one row here and the code that reads it.

A value out of its range is refused when the request is made, before any model is loaded, in one line
naming the flag and a fix. This module imports no build library: ``edgekit build -h`` stays cheap.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from edgekit.camera.base import parse_size
from edgekit.errors import CameraError, UsageError
from edgekit.util.optionspec import Option, OptionValueError, did_you_mean

TASKS = ("classify", "detect", "raw", "landmarks", "segment")
OPTION_TASKS = ("detect", "landmarks", "segment")
"""The tasks whose head takes ``-T`` options (checked by the head at build time)."""
REQUIRED = object()  # a setting with no default: the request cannot be made without it


@dataclass(frozen=True)
class Setting:
    """One build setting: its :class:`Option` (name, type, default, range, help), the flag it becomes
    (None: the Python API only; ``custom``: the verb adds the flag itself, its help from here), the fix
    line for a bad value, and whether a target file's ``[build]`` table may also set it."""

    option: Option
    flag: str | None = None
    hint: str = ""
    metavar: str | None = None
    custom: bool = False
    builder_option: bool = False
    optional: bool = False  # None is a value ("not given": the target's, or a default worked out later)

    @property
    def name(self) -> str:
        """The field's and keyword's name."""
        return self.option.name

    def check(self, value: Any) -> Any:
        """``value`` converted and range-checked; UsageError (the flag, the value, the fix) when it does not fit."""
        if value is None and (self.optional or self.option.default is None):
            return None
        flag = self.flag or self.name
        if value is None:
            raise UsageError(f"{flag} needs a value", self.hint or f"give {self.option.takes()}")
        try:
            return self.option.coerce(value, text=False) if self.option.type in _CHECKED else value
        except OptionValueError as exc:
            if self.option.choices and not exc.wrong_type:
                raise UsageError(f"unknown {flag.lstrip('-')} {value!r}", self.hint or f"give {exc.what}") from exc
            shown = float(value) if self.option.type == "float" and _numeric(value) else value
            raise UsageError(f"{flag} {shown} makes no sense", self.hint or f"give {self.option.takes()}") from exc


_CHECKED = ("int", "float", "bool", "str")


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _s(name: str, type_: str, default: Any, help_: str, flag: str | None = "", **more: Any) -> Setting:
    """A row of :data:`SETTINGS`; ``flag`` "" means ``--<name with dashes>``."""
    option_keys = ("choices", "ge", "gt", "le")
    option = Option(name, type_, default, help_, **{k: more.pop(k) for k in option_keys if k in more})
    return Setting(option, f"--{name.replace('_', '-')}" if flag == "" else flag, **more)


_SHARE_OFF = "use a share like 0.9 (0 turns this check off)"
SETTINGS: tuple[Setting, ...] = (
    # what to build, from what, where
    _s("model", "path", REQUIRED, ".keras, .h5, SavedModel dir, .onnx or float .tflite", custom=True),
    _s("targets", "any", REQUIRED, "edgetpu, rpi, cpu, jetson (comma-separated or repeated)", "--target",
       custom=True),
    _s("calib", "any", REQUIRED, "calibration images; repeat to mix in real camera frames (folder or video)",
       custom=True),
    _s("out", "path", "dist", "output directory", metavar="DIR"),
    _s("eval_dir", "path", None, "labelled ImageFolder (a detector: COCO annotations.json or YOLO images/ + "
       "labels/): enables the accuracy gate", "--eval", metavar="DIR"),
    _s("name", "str", None, "bundle name prefix (default: the model's file name)"),
    _s("labels", "any", None, "labels.txt (default: <model>.labels.txt or the --eval classes)"),
    _s("preprocess", "table", {}, "colour/crop/resize/interpolation/mean/std overrides (the preprocessing flags)",
       custom=True),
    _s("task", "str", None, "task head (default: detect for a detection --eval set, else classify for one 1-D "
       "output, raw otherwise; landmarks: -T landmarks={...}, gated in pixels; segment: by mask IoU)",
       choices=TASKS, hint=f"use --task {' or '.join(TASKS)}"),
    _s("task_options", "table", {}, "detect, landmarks or segment head options (-T KEY=VALUE)", "-T", custom=True),
    _s("input_size", "any", None, "image size for an ONNX input with symbolic height/width", metavar="HxW"),
    _s("background_class", "str", None, "classify: the label meaning 'nothing there' (default: background); with "
       "--eval the open-set thresholds are fitted on it and stored in the manifest", metavar="LABEL"),
    # calibration
    _s("calib_count", "int", 500, "calibration images to draw", ge=1, optional=True,
       hint="need at least one calibration image: use e.g. 500"),
    _s("calib_steps", "int", 150, "images the int8 converter calibrates on, at most (~0.1 s each at 224x224)",
       ge=1, optional=True, hint="the int8 converter needs at least one image: use e.g. 300"),
    _s("seed", "int", 0, "sampling seed"),
    _s("holdout_fraction", "float", 0.2, "share of the calibration images held back to measure agreement", None,
       ge=0, le=0.99, hint="use a share in [0, 1), e.g. 0.2"),
    # builder options: a target file's [build] table sets them too; one given here wins
    _s("variants", "any", None, "override the target's variants, e.g. fp32,int8", builder_option=True),
    _s("io_dtype", "str", None, "int8 model input/output type (default uint8)", choices=("uint8", "int8"),
       builder_option=True),
    _s("compiler", "str", None, "edgetpu_compiler executable (default: search PATH)", builder_option=True),
    _s("min_runtime_version", "int", None, "edgetpu_compiler -m (minimum Edge TPU runtime)", ge=1,
       builder_option=True),
    _s("min_tpu_ops", "float", None, "warn when the share of ops on the Edge TPU is below this", ge=0, le=1,
       builder_option=True, hint="use a share like 0.9 (90 % of ops)"),
    _s("strict_tpu_ops", "bool", False, "fail instead of warn for --min-tpu-ops", builder_option=True),
    # the gate: one row per threshold (0 turns a share's check off)
    _s("min_accuracy_ratio", "float", 0.99, "fail when converted/original top-1 is below this (the MLPerf bar)",
       gt=0, le=1.5, hint="use a ratio like 0.99 (converted top-1 / original top-1)"),
    _s("min_top1_agreement", "float", 0.97, "classify: when the original's top-1 on --eval is 0.9 or more, fail a "
       "model whose top-1 is the original's on fewer of the images than this (0 turns it off)", ge=0, le=1,
       hint=_SHARE_OFF),
    _s("min_map_ratio", "float", 0.99, "detect: fail when converted/original mAP@[.5:.95] on --eval is below this",
       gt=0, le=1.5, hint="use a ratio like 0.99 (converted mAP@[.5:.95] / original mAP@[.5:.95])"),
    _s("max_map_gain", "float", 0.05, "detect: fail when converted/original mAP on --eval is above 1 + this: a "
       "conversion does not improve a model, its scores or boxes moved", ge=0, le=100,
       hint="use a margin like 0.05 (converted mAP may be 1.05x the original's)"),
    _s("min_detect_agreement", "float", 0.9, "detect: fail when the detections at the bundle's score threshold on "
       "--eval agree less than this with the original's (2 x matched / both counts; 0 turns it off)", ge=0, le=1,
       hint=_SHARE_OFF),
    _s("min_score_levels", "int", 20, "detect: fail when the detections on --eval have fewer distinct scores than "
       "this (or than the original's, when it has fewer; 0 turns it off)", ge=0, le=10000,
       hint="use a count like 20 (0 turns this check off)"),
    _s("min_score_cosine", "float", 0.95, "detect: fail when the score output's cosine similarity with the "
       "original's on --eval is below this (0 turns it off)", ge=0, le=1, hint=_SHARE_OFF),
    _s("min_cosine", "float", 0.98, "raw task: fail when the worst output's cosine similarity is below this",
       gt=0, le=1, hint="use a similarity like 0.98"),
    _s("max_landmark_error", "float", None, "landmarks: fail when the mean over images of each image's mean point "
       "distance to the original's, in pixels of the model input, is above this (default 1 %% of its longer "
       "side)", gt=0, le=1e6, metavar="PX", hint="give pixels of the model input, e.g. 2.0"),
    _s("max_landmark_p95", "float", None, "landmarks: the same for the 95th percentile over images (default "
       "2.5 %% of the longer side)", gt=0, le=1e6, metavar="PX", hint="give pixels of the model input, e.g. 2.0"),
    _s("min_presence_agreement", "float", 0.97, "landmarks with a presence output: fail when fewer images than "
       "this share are on the original's side of the presence threshold (0 turns it off)", ge=0, le=1,
       hint="use a share like 0.97 (0 turns this check off)"),
    _s("min_mask_iou", "float", 0.9, "segment: fail when the mean over images of the mask IoU with the original's "
       "(at the head's threshold; both empty or near-empty: 1) is below this", ge=0, le=1,
       hint="give an IoU from 0 to 1, e.g. 0.9 (0 turns it off)"),
    _s("min_mask_iou_p5", "float", 0.7, "segment: the same for the 5th percentile over images", ge=0, le=1,
       hint="give an IoU from 0 to 1, e.g. 0.9 (0 turns it off)"),
    _s("mask_near_empty", "float", 0.005, "segment: a class whose masks both cover under this share of the "
       "grid counts as agreeing (IoU 1), as both empty does; counted in the log and table (0: empty only)",
       ge=0, le=0.5, metavar="SHARE", hint="give a share of the mask from 0 to 0.5, e.g. 0.005 (0: empty only)"),
    # how the build behaves
    _s("allow_partial", "bool", False, "exit 0 when a target's bundle was written without a variant that missed "
       "the gate (kept in <bundle>.rejected); without it such a build exits 3"),
    _s("recover", "bool", True, "build int8 once: no retries (worst layers in float on cpu/rpi, all calibration "
       "images) when it misses the gate", "--no-recover"),
    _s("recovery_budget", "float", None, "int8 recovery: seconds its attempts may take together (default three "
       "times the first int8's, at least 30); an attempt starts only while time is left", gt=0, le=86400,
       metavar="S", hint="give seconds, e.g. 600"),
    _s("recover_16x8", "bool", False, "int8 recovery: try int16 activations (16x8) on XNNPACK targets (cpu, rpi) "
       "too; skipped by default, as no XNNPACK kernel runs it (18-73x slower than fp32 measured)"),
    _s("memory_check", "bool", True, "build even when the estimated memory or temporary disk exceeds what is "
       "available", "--no-memory-check"),
    _s("max_memory", "int", None, "cap the build's memory (4G, 512M): refused up front when the estimate is over "
       "it, int8 recovery attempts skipped once the build has peaked over it", metavar="SIZE", custom=True, ge=1),
    _s("quiet", "bool", False, "errors only on stderr", None),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def default(name: str) -> Any:
    """A setting's default (what a gate holds when no request names it)."""
    return BY_NAME[name].option.default


def builder_options() -> tuple[str, ...]:
    """The settings a target file's ``[build]`` table may also set (a value in the request wins)."""
    return tuple(s.name for s in SETTINGS if s.builder_option)


def check_names(settings: Mapping[str, Any]) -> None:
    """UsageError naming the first keyword that is no build setting (with the one did-you-mean)."""
    for key in settings:
        if key not in BY_NAME:
            raise UsageError(f"build() got an unknown setting {key!r}", did_you_mean(key, BY_NAME))


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting that has one and is not ``custom``: typed, choices from the option, help
    with the default; an unset flag arrives as None (or its bool default), so the request's applies."""
    for s in SETTINGS:
        if s.flag is None or s.custom:
            continue
        o = s.option
        if o.type == "bool":
            parser.add_argument(s.flag, dest=s.name, action="store_false" if o.default else "store_true",
                                help=o.help)
            continue
        shown = "" if o.default is None else f" (default {o.default})"
        parser.add_argument(s.flag, dest=s.name, type=_PARSE.get(o.type, str), default=None, metavar=s.metavar,
                            choices=list(o.choices) or None, help=o.help + shown)


_PARSE = {"int": int, "float": float}


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of :func:`add_flags` the command line set, by setting name (unset ones left out)."""
    out = {}
    for s in SETTINGS:
        if s.flag is None or s.custom or not hasattr(args, s.name):
            continue
        value = getattr(args, s.name)
        if value is not None and value != s.option.default:
            out[s.name] = value
    return out


class _RequestChecks:
    """The checks and normalising every :class:`BuildRequest` runs once, when made."""

    def __post_init__(self) -> None:
        for s in SETTINGS:
            value = getattr(self, s.name)
            if value is REQUIRED:
                raise UsageError(f"the build needs {s.flag or s.name}", f"give {s.name}")
            object.__setattr__(self, s.name, s.check(value))
        _normalise(self)

    def builder_overrides(self) -> dict[str, Any]:
        """The builder options this request sets (unset ones left out, so the target's apply)."""
        given_ = {k: getattr(self, k) for k in builder_options()}
        # None, False and no variants are what an unset keyword or flag looks like
        return {k: (list(v) if k == "variants" else v) for k, v in given_.items()
                if not (v is None or v is False or v == ())}


def _field(s: Setting) -> tuple[str, Any, Any]:
    d = s.option.default
    if isinstance(d, (dict, list)):
        return s.name, Any, field(default_factory=lambda d=d: type(d)(d))
    return s.name, Any, field(default=d)


BuildRequest = make_dataclass(
    "BuildRequest", [_field(s) for s in SETTINGS], bases=(_RequestChecks,), frozen=True,
    namespace={"__doc__": "Everything one ``edgekit build`` needs: one field per row of "
                          ":data:`edgekit.builders.request.SETTINGS` (its type, default, range and help)."},
)
BuildRequest.__module__ = __name__


# A bundle is written to <out>/<name>-<target>: the name must stay one plain file name
# (no separator, no "..", not hidden), or `--name ../x` would write outside --out.
_NAME = re.compile(r"[^\W_][\w.+-]{0,99}")


def check_bundle_name(name: str, what: str = "--name") -> str:
    """``name`` if it makes a bundle directory name inside ``--out``; else UsageError."""
    if not _NAME.fullmatch(name):
        raise UsageError(f"{what} {name!r} cannot name a bundle directory",
                         "use letters, digits, '.', '_', '+' or '-' (at most 100, no path separators), "
                         "starting with a letter or digit")
    return name


def parse_input_size(value: str | tuple | list | None) -> tuple[int, int] | None:
    """``"224x224"``, ``"224"`` or ``(224, 224)`` -> ``(224, 224)`` (height, width); None stays None."""
    if value is None:
        return None
    pair = value
    if isinstance(value, str) and value.strip().isdigit():
        pair = f"{value}x{value}"  # one number: a square input
    elif isinstance(value, (tuple, list)) and len(value) == 1:
        pair = (value[0], value[0])
    try:
        # The frame-size parser reads "AxB" as (A, B), which --input-size calls height x width.
        height, width = parse_size(pair)
    except CameraError as exc:
        raise UsageError(f"--input-size {value!r} is not HxW",
                         "give the height and width, e.g. --input-size 224x224") from exc
    return height, width


def _names(value: Iterable[str | Path] | str | None) -> tuple[str, ...]:
    """``"a, b"`` or ``["a", "b"]`` -> ``("a", "b")``, blanks dropped."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    return tuple(str(s).strip() for s in items if str(s).strip())


def _normalise(request: Any) -> None:
    """Each field in the one shape every reader expects, and the checks that span fields or need a
    head: frozen, so through ``object.__setattr__``, once."""
    calib, labels = request.calib, request.labels
    norm = {
        "model": Path(request.model),
        "targets": _names(request.targets),
        # kept as given: calibration sources are recorded in the manifest by their spelling
        "calib": (calib,) if isinstance(calib, (str, Path)) else tuple(calib or ()),
        "out": Path(request.out),
        "eval_dir": None if request.eval_dir is None else Path(request.eval_dir),
        "labels": Path(labels) if isinstance(labels, str) else (
            tuple(labels) if labels is not None and not isinstance(labels, Path) else labels),
        "preprocess": dict(request.preprocess or {}),
        "task_options": dict(request.task_options or {}),
        "variants": None if request.variants is None else _names(request.variants),
        "input_size": parse_input_size(request.input_size),
    }
    for key, value in norm.items():
        object.__setattr__(request, key, value)
    if request.task_options and request.task not in (None, *OPTION_TASKS):
        raise UsageError("--task-option applies to --task detect, landmarks or segment",
                         "add --task detect (or landmarks, segment), or leave the options out")
    if request.variants == ():
        raise UsageError("--variants names no variant", "give e.g. --variants fp32,int8, or leave it out")
    if request.name is not None:
        check_bundle_name(request.name)
    if request.task in ("landmarks", "segment"):
        head_config(request.task, request.task_options)  # the head's own check of its -T options


def head_config(task: str, options: Mapping[str, Any]) -> Any:
    """The ``-T`` options of a ``landmarks`` or ``segment`` build checked by the head itself (UsageError,
    one line), before any model is loaded: a landmarks head's config, a segment head's decoder."""
    if task == "landmarks":
        from edgekit.heads.landmarks import OPTIONS, LandmarkConfig
        from edgekit.heads.options import check_head_options

        check_head_options("landmarks", OPTIONS, options, skip=("landmarks", "presence"))
        return LandmarkConfig.from_options(options.get("landmarks"), options.get("presence"))
    from edgekit.heads.segment import SegmentDecoder

    return SegmentDecoder(None, (), (), **dict(options))
