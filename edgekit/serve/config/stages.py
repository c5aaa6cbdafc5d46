"""``[[stage]]``: a cascade in the daemon, a second model on each detection's region (docs/pipelines.md).

    [[stage]]
    model = "o/fl-cpu"                  # BUNDLE[:VARIANT] or a bare model file (relative to this file)
    roi = { rotation_vector_start_keypoint_index = 0, rotation_vector_end_keypoint_index = 1,
            rotation_vector_target_angle_degrees = 0, scale_x = 1.5, scale_y = 1.5, square_long = true }
    # task = "landmarks"; task_options = { ... }; labels = "sub.txt"   (a bare model's)

``edgekit serve DET --then SECOND --roi JSON`` is the same on the command line. One stage is supported
(a detector feeding one second model); the region options are checked as ``--roi`` checks them,
before anything opens. The second model is opened once and serves every camera; it stays open across
hot-swaps of the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.util.optionspec import close_match

_KEYS = ("model", "task", "task_options", "labels", "roi")


@dataclass(frozen=True)
class StageConfig:
    """One ``[[stage]]`` table: the second model and where it looks."""

    model: str = ""
    task: str = ""  # its task head ("" = the bundle's)
    task_options: dict = field(default_factory=dict)
    labels: str = ""  # a bare second model's labels file
    roi: dict = field(default_factory=dict)


def parse_stages(raw: Any, where: str, base_dir: Path | None = None) -> tuple[StageConfig, ...]:
    """The ``stage`` array of a serve.toml document, checked (UsageError, one line, naming ``where``)."""
    if isinstance(raw, Mapping):
        raise UsageError(f"{where}: [stage] must be an array of tables", "write it as [[stage]] model = ...")
    if not isinstance(raw, list) or not raw:
        raise UsageError(f"{where}: [[stage]] holds no stage", "write [[stage]] model = ... roi = { ... }")
    if len(raw) > 1:
        raise UsageError(f"{where}: {len(raw)} [[stage]] tables; one second stage is supported",
                         "keep one [[stage]] (a detector feeding one second model)")
    return (stage_from(raw[0], f"{where} [[stage]]", base_dir),)


def stage_from(table: Any, where: str, base_dir: Path | None = None) -> StageConfig:
    """One stage table (or the ``--then`` flags as a dict) checked into a :class:`StageConfig`."""
    from edgekit.cascade.region import parse_roi

    if not isinstance(table, Mapping):
        raise UsageError(f"{where} must be a table, got {table!r}", "write [[stage]] model = ... roi = { ... }")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        close = close_match(unknown[0], _KEYS)
        raise UsageError(f"{where}: unknown key {unknown[0]!r}",
                         f"did you mean {close!r}?" if close else f"known keys: {', '.join(_KEYS)}")
    for key, kind in (("model", str), ("task", str), ("labels", str), ("task_options", Mapping), ("roi", Mapping)):
        if key in table and not isinstance(table[key], kind):
            raise UsageError(f"{where}: {key} must be {'a table' if kind is Mapping else 'a string'}, "
                             f"got {table[key]!r}", "see docs/pipelines.md")
    if not table.get("model"):
        raise UsageError(f"{where}: no model", "set model = \"BUNDLE[:VARIANT]\" (the second model)")
    parse_roi(dict(table.get("roi") or {}), f"{where} roi")  # checked now, not at the first detection
    model, labels = str(table["model"]), str(table.get("labels") or "")
    if base_dir is not None:
        model = _relative(base_dir, model)
        labels = _relative(base_dir, labels) if labels else ""
    return StageConfig(model, str(table.get("task") or ""), dict(table.get("task_options") or {}), labels,
                       dict(table.get("roi") or {}))


def _relative(base_dir: Path, value: str) -> str:
    """A path in the config file, relative to its folder unless absolute (a ``:VARIANT`` tail kept)."""
    return value if Path(value).is_absolute() else str(base_dir / value)


def open_stage(stage: StageConfig, runtime_options: Mapping[str, Any]) -> tuple[Any, Any]:
    """Open the stage's model (``runtime_options``: device and threads, shared with the first model)
    and build its :class:`~edgekit.cascade.SecondStage`; returns ``(open model, stage)``."""
    from edgekit.cascade import second_stage
    from edgekit.model import open_model

    options = {"task": stage.task or None, "task_options": stage.task_options or None,
               "labels": stage.labels or None, **runtime_options}
    model = open_model(stage.model, **{k: v for k, v in options.items() if v is not None})
    try:
        return model, second_stage(model, stage.roi)
    except BaseException:
        model.close()
        raise
