"""The build contract: what ``edgekit build`` is asked for, and what a target's builder hands back.

A :class:`BuildRequest` holds everything one build needs (model, targets, images, gate,
preprocessing and builder overrides); it is checked when made, so a bad number fails before
TensorFlow is imported. A builder named by a target file (``builder = "module:function"``,
see ``context.Builder``) is called as ``builder(ctx, target, out_dir)`` with the shared
:class:`~edgekit.builders.context.BuildContext`, writes its model files into ``out_dir`` and
returns a :class:`BuilderOutput` of verified :class:`BuiltModel` entries. The orchestrator
turns that into the bundle manifest and returns one :class:`TargetBuild` per target.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.builders.gate.fidelity import check_thresholds
from edgekit.builders.gate.landmarks import check_request as check_landmarks
from edgekit.builders.gate.segment import check_request as check_segment
from edgekit.camera.base import parse_size
from edgekit.errors import CameraError, EdgekitError, UsageError
from edgekit.imaging.image import InputSpec

# Request fields a target's [build] table may also set; a value given in the request wins.
BUILDER_OPTIONS = ("variants", "io_dtype", "compiler", "min_runtime_version", "min_tpu_ops", "strict_tpu_ops")


TASKS = ("classify", "detect", "raw", "landmarks", "segment")
OPTION_TASKS = ("detect", "landmarks", "segment")
"""The tasks whose head takes ``-T`` options (checked by the head at build time)."""

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


@dataclass(frozen=True)
class BuildRequest:
    """Everything one ``edgekit build`` needs; see :func:`edgekit.builders.build.build` for each field.

    Strings are accepted where the CLI gives them (``targets="cpu,rpi"``, ``calib="calib/"``)
    and normalised; numbers are checked here, before any work is done. ``None`` (or False
    for ``strict_tpu_ops``) for a builder option means "not given": the target's TOML value
    applies.
    """

    model: Path
    targets: tuple[str, ...]
    calib: tuple[str | Path, ...]
    out: Path = Path("dist")
    eval_dir: Path | None = None
    name: str | None = None
    labels: tuple[str, ...] | Path | None = None
    preprocess: dict[str, Any] = field(default_factory=dict)
    min_accuracy_ratio: float = 0.99
    calib_count: int | None = 500
    holdout_fraction: float = 0.2
    seed: int = 0
    variants: tuple[str, ...] | None = None
    io_dtype: str | None = None
    compiler: str | None = None
    min_runtime_version: int | None = None
    min_tpu_ops: float | None = None
    strict_tpu_ops: bool = False
    quiet: bool = False
    task: str | None = None
    input_size: tuple[int, int] | None = None
    min_cosine: float = 0.98
    calib_steps: int | None = 150
    memory_check: bool = True
    max_memory: int | None = None  # bytes: --max-memory, the user's cap on the build's peak
    min_map_ratio: float = 0.99
    task_options: dict[str, Any] = field(default_factory=dict)
    background_class: str | None = None
    allow_partial: bool = False
    recover: bool = True  # an int8 that misses the gate is retried (builders/int8/recovery.py)
    # the detect gate beyond mAP (builders/gate/fidelity.py: FidelityGate holds the same defaults)
    min_detect_agreement: float = 0.9
    min_score_levels: int = 20
    min_score_cosine: float = 0.95
    max_map_gain: float = 0.05
    min_top1_agreement: float = 0.97  # classify, when the original is accurate (builders/gate/verify.py: classify_gate)
    # landmarks (builders/gate/landmarks.py): pixels of the model input, None: 1 % / 2.5 % of its longer side
    max_landmark_error: float | None = None
    max_landmark_p95: float | None = None
    min_presence_agreement: float = 0.97
    # segment (builders/gate/segment.py): mask IoU against the original's, mean and 5th percentile over images
    min_mask_iou: float = 0.9
    min_mask_iou_p5: float = 0.7

    def __post_init__(self) -> None:
        # Frozen: normalise through object.__setattr__, once, so every reader sees one shape.
        calib = self.calib
        labels = self.labels
        norm = {
            "model": Path(self.model),
            "targets": _names(self.targets),
            # kept as given: calibration sources are recorded in the manifest by their spelling
            "calib": (calib,) if isinstance(calib, (str, Path)) else tuple(calib or ()),
            "out": Path(self.out),
            "eval_dir": None if self.eval_dir is None else Path(self.eval_dir),
            "labels": Path(labels) if isinstance(labels, str) else (
                tuple(labels) if labels is not None and not isinstance(labels, Path) else labels),
            "preprocess": dict(self.preprocess or {}),
            "task_options": dict(self.task_options or {}),
            "variants": None if self.variants is None else _names(self.variants),
            "input_size": parse_input_size(self.input_size),
        }
        for key, value in norm.items():
            object.__setattr__(self, key, value)
        self._check_numbers()

    def _check_numbers(self) -> None:
        if not 0 < self.min_accuracy_ratio <= 1.5:  # NaN fails this too
            raise UsageError(f"--min-accuracy-ratio {self.min_accuracy_ratio} makes no sense",
                             "use a ratio like 0.99 (converted top-1 / original top-1)")
        if not 0 < self.min_map_ratio <= 1.5:
            raise UsageError(f"--min-map-ratio {self.min_map_ratio} makes no sense",
                             "use a ratio like 0.99 (converted mAP@[.5:.95] / original mAP@[.5:.95])")
        if self.task_options and self.task not in (None, *OPTION_TASKS):
            raise UsageError("--task-option applies to --task detect, landmarks or segment",
                             "add --task detect (or landmarks, segment), or leave the options out")
        if self.calib_count is not None and self.calib_count < 1:
            raise UsageError(f"--calib-count {self.calib_count}: need at least one calibration image",
                             "use e.g. 500")
        if self.calib_steps is not None and self.calib_steps < 1:
            raise UsageError(f"--calib-steps {self.calib_steps}: the int8 converter needs at least one image",
                             "use e.g. 300")
        if not 0 <= self.holdout_fraction < 1:
            raise UsageError(f"holdout fraction {self.holdout_fraction} must be in [0, 1)")
        if not 0 < self.min_cosine <= 1:
            raise UsageError(f"--min-cosine {self.min_cosine} makes no sense", "use a similarity like 0.98")
        if self.task not in (None, *TASKS):
            raise UsageError(f"unknown task {self.task!r}", f"use --task {' or '.join(TASKS)}")
        if self.variants == ():
            raise UsageError("--variants names no variant", "give e.g. --variants fp32,int8, or leave it out")
        if self.min_tpu_ops is not None and not 0 <= self.min_tpu_ops <= 1:
            raise UsageError(f"--min-tpu-ops {self.min_tpu_ops} is not a share", "use a share like 0.9 (90 % of ops)")
        if self.name is not None:
            check_bundle_name(self.name)
        check_thresholds(self)  # the detect gate's own flags
        check_landmarks(self)  # the landmark gate's flags, and with --task landmarks the head's options
        check_segment(self)  # the mask IoU limits, and with --task segment the head's options

    def builder_overrides(self) -> dict[str, Any]:
        """The builder options this request sets (unset ones left out, so the target's apply)."""
        given = {k: getattr(self, k) for k in BUILDER_OPTIONS}
        # None, False and no variants are what an unset keyword or flag looks like
        unset = [k for k, v in given.items() if v is None or v is False or v == ()]
        return {k: (list(v) if k == "variants" else v) for k, v in given.items() if k not in unset}


def task_extra(class_output: int | None, order: list[int]) -> dict[str, Any]:
    """A model entry's ``task_options``: which of the runtime's outputs holds the class scores.

    ``order[j]`` is the runtime output holding the source's output ``j``; a converter may
    reorder outputs, so each model file records its own index. Empty for ``raw``.
    """
    if class_output is None:
        return {}
    return {"task_options": {"output_index": int(order[class_output])}}


@dataclass(frozen=True)
class BuiltModel:
    """One model file a builder wrote into the bundle directory, with its verification.

    ``verification`` is per data set (``eval``, ``holdout``) what
    :func:`edgekit.builders.gate.verify.compare` measured against the original model.
    ``runtime_options`` (None: the target's) and ``extra`` (other manifest keys, e.g.
    ``tensorrt``) go into the model's manifest entry as they are.
    """

    name: str
    file: str
    format: str
    precision: str
    input: InputSpec
    outputs: tuple[dict, ...]
    convert_seconds: float
    bytes: int
    verification: dict[str, Any]
    runtime_options: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def manifest_entry(self) -> dict[str, Any]:
        """The model's entry in ``edgekit.json`` (``models``)."""
        entry: dict[str, Any] = {
            "name": self.name, "file": self.file, "format": self.format, "precision": self.precision,
            "input": self.input.to_dict(), "outputs": [dict(o) for o in self.outputs],
            "convert_seconds": self.convert_seconds, "bytes": self.bytes,
        }
        if self.runtime_options is not None:
            entry["runtime_options"] = dict(self.runtime_options)
        entry.update(self.extra)
        return entry


@dataclass(frozen=True)
class BuilderOutput:
    """What a target's builder returns: its verified models and which one a device opens.

    ``delegation`` (measured delegate coverage per model) and ``edgetpu`` (the Edge TPU
    compiler report) are copied into the manifest when set; ``runtime_options`` are laid
    over the target's ``[runtime.options]`` for the whole bundle.
    """

    models: tuple[BuiltModel, ...]
    default_model: str
    delegation: dict[str, Any] | None = None
    edgetpu: dict[str, Any] | None = None
    runtime_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        names = [m.name for m in self.models]
        # A custom builder's mistake, caught before a bundle that cannot be opened is written.
        if len(set(names)) != len(names) or self.default_model not in names:
            raise EdgekitError(f"builder returned models {names} with default {self.default_model!r}",
                               "model names must be unique and include the default")

    @property
    def default(self) -> BuiltModel:
        """The model a device opens when it names none."""
        return next(m for m in self.models if m.name == self.default_model)

    @property
    def verification(self) -> dict[str, dict[str, Any]]:
        """Per model name, its verification (the manifest's ``verification.models``)."""
        return {m.name: m.verification for m in self.models}


@dataclass(frozen=True)
class TargetBuild:
    """What one target's build produced: the bundle (None when rejected) and its manifest.

    ``passed`` is True when every variant passed the gate. A partial bundle (``passed`` False,
    ``bundle`` set) holds the variants that passed; ``rejected`` names those that did not
    (kept in ``<bundle>.rejected``), ``error`` says why.
    """

    target: str
    bundle: Path | None
    passed: bool
    seconds: float
    manifest: dict = field(default_factory=dict)
    error: str | None = None
    rejected: tuple[str, ...] = ()

    @property
    def partial(self) -> bool:
        """A bundle was written, without the variants that missed the gate."""
        return self.bundle is not None and not self.passed
