"""What every target's builder shares in one build: the request, the loaded model, the images,
the original model's reference outputs and the log.

The model is loaded, exported and run on the evaluation and held-back images once per build,
however many targets there are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgekit.builders.calibration import ImageSet
from edgekit.builders.contract import BuilderOutput, BuildRequest
from edgekit.builders.log import BuildLog
from edgekit.builders.source import SourceModel
from edgekit.builders.verify import compare
from edgekit.image import InputSpec, Preprocessor
from edgekit.target import Target


@dataclass
class BuildContext:
    """The shared state of one build, handed to each target's builder.

    ``calib`` holds the images used for int8 calibration, ``holdout`` those held back to
    measure agreement, ``calib_all`` both (what the manifest's provenance describes).
    """

    request: BuildRequest
    source: SourceModel
    name: str
    labels: list[str]
    float_spec: InputSpec
    calib_all: ImageSet
    calib: ImageSet
    holdout: ImageSet
    evalset: ImageSet | None
    log: BuildLog
    workdir: Path
    reference: dict[str, np.ndarray] = field(default_factory=dict)
    _saved: Path | None = None

    def __post_init__(self) -> None:
        self._float = Preprocessor(self.float_spec)
        with self.log.step("reference outputs of the original model"):
            if self.evalset is not None:
                self.reference["eval"] = self.source.predict(self.evalset.tensors(self._float))
            if self.holdout.images:
                self.reference["holdout"] = self.source.predict(self.holdout.tensors(self._float))

    @property
    def min_ratio(self) -> float:
        """Converted/original top-1 below this fails a variant."""
        return self.request.min_accuracy_ratio

    def options_for(self, target: Target) -> dict[str, Any]:
        """The builder options for ``target``: its ``[build]`` table, with what the request gives laid over."""
        return target.build_options(self.request.builder_overrides())

    def saved_model(self) -> Path:
        """A static batch-1 SavedModel of the source, exported once per build."""
        if self._saved is None:
            with self.log.step("export SavedModel (static batch 1)"):
                self._saved = self.source.export_static(self.workdir / "saved_model")
        return self._saved

    def representative(self) -> np.ndarray:
        """Float tensors of the calibration images, for int8 conversion."""
        return self.calib.tensors(self._float)

    def verify(self, variant: str, run: Callable[[np.ndarray], np.ndarray], spec: InputSpec) -> dict:
        """Run a converted variant on the eval and held-back images and compare with the original.

        ``run`` maps a batch of input tensors (for ``spec``) to float outputs, one row per image.
        """
        prep = Preprocessor(spec)
        out: dict[str, Any] = {}
        with self.log.step(f"verify {variant}"):
            if self.evalset is not None:
                res = compare(self.reference["eval"], run(self.evalset.tensors(prep)), self.evalset.labels,
                              self.evalset.class_names)
                res["passed"] = res.get("ratio") is not None and res["ratio"] >= self.min_ratio
                out["eval"] = res
                self.log.info(f"  {variant}: top-1 original {res['original']:.4f} converted {res['converted']:.4f} "
                              f"ratio {res['ratio']} agreement {res['agreement']:.4f} SQNR {res['sqnr_db']} dB")
            if self.holdout.images:
                res = compare(self.reference["holdout"], run(self.holdout.tensors(prep)))
                out["holdout"] = res
                self.log.info(f"  {variant}: agreement on {res['n']} held-back calibration images "
                              f"{res['agreement']:.4f}, max abs diff {res['max_abs_diff']}")
        return out


class Builder(Protocol):
    """The callable a target file names as ``builder = "module:function"`` (the builder contract)."""

    def __call__(self, ctx: BuildContext, target: Target, out_dir: Path) -> BuilderOutput: ...
