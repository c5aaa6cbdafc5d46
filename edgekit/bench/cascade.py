"""``edgekit bench --then``: a cascade's second model, opened once for the whole bench.

Every variant of the first model (a detector) feeds the same second stage, so the table's
``second_*`` rows and ``second_stage@k=N`` compare like with like.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgekit.errors import UsageError
from edgekit.model import OpenModel, open_model


@dataclass
class SecondModel:
    """A cascade's second model, open for the whole bench, and the stage every variant feeds."""

    model: OpenModel
    stage: Any


def open_second(opened: list[OpenModel], then: str | None, roi: Any, options: Mapping[str, Any],
                progress: Callable[[str], None] | None = None) -> SecondModel | None:
    """``then`` opened once with ``options`` (None without a cascade); every first model must be a detector."""
    if not then:
        return None
    for m in opened:
        if m.task != "detect":
            raise UsageError(f"--then needs detectors first; {m.name} is a {m.task} model",
                             "bench detect bundles (or --task detect) with --then")
    from edgekit.cascade import second_stage

    model = open_model(then, **dict(options))
    try:
        stage = second_stage(model, roi)
    except BaseException:
        model.close()
        raise
    if progress:
        progress(f"cascade: every variant feeds {model.name}" + (f":{model.variant}" if model.variant else "")
                 + f" ({model.task}); its stages are second_* in the table")
    return SecondModel(model, stage)
