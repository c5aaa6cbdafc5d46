"""The task head table: task name -> the decoder factory that gives a model's outputs their meaning.

:data:`TASK_HEADS` maps a task name to the dotted path of a decoder factory, its install hint,
a summary and the dotted path of the options it takes (:class:`~edgekit.util.optionspec.Option`,
the same list the factory checks against), fsspec style: both resolved on first use, so a head's
dependencies load only when a model needs it, and this table imports no head. The heads import
:mod:`edgekit.heads.tensors` and :mod:`edgekit.heads.options`, which lie below every head (the
detect package's too), never this module. :func:`make_decoder` builds a decoder, refusing options
the head does not take. The pipeline picks its decoder from this table, never by ``if task == ...``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

import numpy as np

from edgekit.errors import UsageError
from edgekit.heads.options import unknown_option
from edgekit.util.optionspec import Option
from edgekit.util.plugins import resolve


class TaskResult(Protocol):
    """What a decoder returns for one frame: anything with a JSON form."""

    def to_dict(self) -> dict[str, Any]: ...


OutputDecoder = Callable[[Sequence[np.ndarray]], TaskResult]
"""A decoder: a runtime's outputs (one array per model output) -> a :class:`TaskResult`."""


@dataclass(frozen=True)
class TaskHead:
    """One row of :data:`TASK_HEADS` (the row shape of every plug-in table: dotted path, install
    hint, summary, options).

    ``path`` is ``"package.module:callable"``, called as ``factory(labels, runtime, **options)``
    and returning an :data:`OutputDecoder`; ``declared_options`` are the options it accepts, or
    the dotted path of its module's list (``"package.module:OPTIONS"``, read on first use as
    :attr:`options`); ``install_hint`` is shown when its module cannot be imported.
    """

    path: str
    install_hint: str | None
    summary: str
    declared_options: str | tuple[Option, ...]

    @property
    def options(self) -> tuple[Option, ...]:
        """The options the head accepts (its module's own list, the one its factory checks against)."""
        spec = self.declared_options
        return _options(spec) if isinstance(spec, str) else tuple(spec)

    @property
    def option_names(self) -> tuple[str, ...]:
        """The names of :attr:`options`, in order."""
        return tuple(o.name for o in self.options)


DEFAULT_TASK = "classify"

TASK_HEADS: dict[str, TaskHead] = {
    "classify": TaskHead(
        "edgekit.heads.classify:classifier", None,
        "top-k classes with labels (softmax auto|always|never)", "edgekit.heads.classify:OPTIONS",
    ),
    "raw": TaskHead(
        "edgekit.heads.raw:raw", None,
        "every output's name, shape, dtype and min/max/mean/std (tensors=True: the values too)",
        "edgekit.heads.raw:OPTIONS",
    ),
    "detect": TaskHead(
        "edgekit.detect.head:detector", "pip install opencv-python-headless (NMS)",
        "boxes, labels and scores after class-aware NMS, in source-frame pixels "
        "(YOLO, SSD with anchors, or NMS in the graph)", "edgekit.detect.config:OPTIONS",
    ),
    "landmarks": TaskHead(
        "edgekit.heads.landmarks:landmarks", None,
        "N points (x, y, z) in source-frame pixels, gated by an optional presence score "
        "(MediaPipe TensorsToLandmarks option names)", "edgekit.heads.landmarks:OPTIONS",
    ),
    "segment": TaskHead(
        "edgekit.heads.segment:segment", None,
        "probability masks (MediaPipe's selfie, hair and multiclass conventions): per class its area and box "
        "in source-frame pixels (masks=True: the masks too)", "edgekit.heads.segment:OPTIONS",
    ),
}
"""Task name -> :class:`TaskHead`. Add a task by adding a row and a factory module."""


@cache
def _options(path: str) -> tuple[Option, ...]:
    return tuple(resolve(path))


def default_task(output_shapes: Sequence[Sequence[Any]]) -> str:
    """The task of a model that does not say: ``classify`` for one output holding one vector
    per image (``[1, N]`` or ``[N]``), ``raw`` for anything else."""
    if len(output_shapes) != 1:
        return "raw"
    dims = list(output_shapes[0])
    batch = len(dims) == 2 and (not isinstance(dims[0], int) or dims[0] in (1, -1))  # symbolic or 1
    return "classify" if len(dims) == 1 or batch else "raw"


def make_decoder(
    task: str = DEFAULT_TASK, labels: Sequence[str] = (), runtime: Any = None, **options: Any
) -> OutputDecoder:
    """Build the decoder of ``task`` from :data:`TASK_HEADS` for a model's outputs.

    Args:
        task: a key of :data:`TASK_HEADS`.
        labels: class names in output order.
        runtime: the open runtime (its output quantisation is read), or None for float outputs.
        options: the head's options, e.g. ``k=3, softmax="never"`` for ``classify``.

    Raises UsageError naming an unknown task or an option the head does not accept (a typo
    must not silently do nothing), BackendUnavailable when the head's module cannot load.
    """
    head = TASK_HEADS.get(task)
    if head is None:
        raise UsageError(f"unknown task {task!r}", f"known tasks: {', '.join(TASK_HEADS)}")
    unknown = sorted(set(options) - set(head.option_names))
    if unknown:
        raise unknown_option(task, unknown[0], head.option_names)
    factory = resolve(head.path, head.install_hint)
    return factory(labels, runtime, **options)
