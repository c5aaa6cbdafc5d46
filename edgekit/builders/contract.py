"""The build contract: what a target's builder hands back.

What a build is asked for is :class:`edgekit.builders.request.BuildRequest`. A builder named by a
target file (``builder = "module:function"``, see ``context.Builder``) is called as
``builder(ctx, target, out_dir)`` with the shared :class:`~edgekit.builders.context.BuildContext`,
writes its model files into ``out_dir`` and returns a :class:`BuilderOutput` of verified
:class:`BuiltModel` entries. The orchestrator turns that into the bundle manifest and returns one
:class:`TargetBuild` per target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.imaging.image import InputSpec


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
