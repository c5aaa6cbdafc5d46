"""Cascades: a detector feeds a second model through MediaPipe-exact regions (docs/pipelines.md).

>>> from edgekit.cascade import open_cascade                           # doctest: +SKIP
>>> with open_cascade("o/bf-cpu", "o/fl-cpu", roi={"scale_x": 1.5, "scale_y": 1.5,
...                   "square_long": True}) as cascade, open_camera("v4l2:0") as cam:
...     for result in cascade.pipeline.run(cam, max_frames=100):
...         for face in result.result.detections:
...             print(face.box, len(face.landmarks or ()))

:mod:`~edgekit.cascade.region` turns a detection into a rotated region, :mod:`~edgekit.cascade.warp`
crops the frame there and maps points back, :mod:`~edgekit.cascade.stage` runs the second model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekit.cascade.region import ROI_OPTIONS, Region, RoiOptions, parse_roi, region_for
from edgekit.cascade.stage import SecondStage

__all__ = ["ROI_OPTIONS", "Cascade", "Region", "RoiOptions", "SecondStage", "open_cascade", "parse_roi",
           "region_for"]


@dataclass
class Cascade:
    """Two open models and the pipeline that runs them in turn; a context manager that closes both."""

    first: Any
    second: Any
    stage: SecondStage
    pipeline: Any
    models: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for model in self.models:
            model.close()

    def __enter__(self) -> Cascade:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_cascade(detector: Any, second: Any, roi: str | Mapping[str, Any] | RoiOptions | None = None,
                 track: str | Mapping[str, Any] | RoiOptions | None = None, **pipeline_options: Any) -> Cascade:
    """Open ``detector`` and ``second`` (each ``BUNDLE[:VARIANT]`` or a bare model, as
    :func:`edgekit.model.open_model` takes them, or an already open model) and chain them.

    ``roi``: the region options (JSON text, a mapping or :class:`RoiOptions`); ``track``: the same for
    following last frame's landmarks instead of detecting (MediaPipe's tracking); ``pipeline_options``
    go to :class:`~edgekit.pipeline.Pipeline` (``warmup``, ``window``, ``max_corrupt``...).
    """
    from edgekit.model import open_model
    from edgekit.pipeline import Pipeline

    opened: list[Any] = []
    try:
        first = detector if hasattr(detector, "runtime") else _keep(open_model(detector), opened)
        then = second if hasattr(second, "runtime") else _keep(open_model(second), opened)
        stage = second_stage(then, roi, track)
        pipeline = Pipeline(first.runtime, first.labels, task=first.task, task_options=first.task_options,
                            then=stage, **pipeline_options)
    except BaseException:
        for model in opened:
            model.close()
        raise
    return Cascade(first, then, stage, pipeline, opened)


def second_stage(model: Any, roi: str | Mapping[str, Any] | RoiOptions | None = None,
                 track: str | Mapping[str, Any] | RoiOptions | None = None) -> SecondStage:
    """The :class:`SecondStage` of an open model (its task, labels and task options); ``track``: the
    region options that follow last frame's landmarks (``--track-roi``; None: detect every frame)."""
    options = roi if isinstance(roi, RoiOptions) else parse_roi(roi)
    follow = track if isinstance(track, RoiOptions) or track is None else parse_roi(track, "--track-roi")
    return SecondStage(model.runtime, model.task, model.labels, model.task_options, options, follow)


def _keep(model: Any, opened: list[Any]) -> Any:
    opened.append(model)
    return model
