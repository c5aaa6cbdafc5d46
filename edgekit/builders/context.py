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
    ``reference`` holds, per data set, the original model's outputs (one array per output).
    ``task`` is the bundle's task head (``classify`` or ``raw``); ``class_output`` the index
    of the class scores among the source's outputs (None for ``raw``).
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
    task: str = "classify"
    class_output: int | None = 0
    reference: dict[str, list[np.ndarray]] = field(default_factory=dict)
    converted_outputs: list[dict] = field(default_factory=list)
    _saved: Path | None = None

    def __post_init__(self) -> None:
        self._float = Preprocessor(self.float_spec)
        # what converted TFLite models take: channels-last, whatever the original's layout
        self._nhwc = Preprocessor(InputSpec.from_dict(
            {**self.float_spec.to_dict(), "layout": "NHWC", "shape": [1, *self.source.input_hwc]}))
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
        """A static batch-1 NHWC SavedModel of the source, made once per build; its signature
        outputs are keyed by the source outputs' keys (ONNX: through onnx2tf)."""
        if self._saved is None and self.source.kind == "onnx":
            from edgekit.builders.onnx_to_tf import onnx_to_saved_model

            with self.log.step(f"convert ONNX ({self.source.layout}) to a TensorFlow SavedModel with onnx2tf "
                               "(its log goes to build.log)"):
                self._saved, result = onnx_to_saved_model(self.source, self.representative(), self.workdir,
                                                          self.log)
                self.converted_outputs = result["outputs"]
        elif self._saved is None:
            with self.log.step("export SavedModel (static batch 1)"):
                self._saved = self.source.export_static(self.workdir / "saved_model")
        return self._saved

    def representative(self) -> np.ndarray:
        """Float NHWC tensors of the calibration images, for int8 conversion."""
        return self.calib.tensors(self._nhwc)

    def verify(self, variant: str, run: Callable[[np.ndarray], np.ndarray], spec: InputSpec) -> dict:
        """Run a converted variant on the eval and held-back images and compare every output with the original.

        ``run`` maps a batch of input tensors (for ``spec``) to float outputs: one array per
        source output, in the source's order, one row per image.
        """
        prep = Preprocessor(spec)
        out: dict[str, Any] = {}
        names = self.source.output_names
        with self.log.step(f"verify {variant}"):
            for dataset, images in (("eval", self.evalset), ("holdout", self.holdout)):
                if images is None or not images.images:
                    continue
                labelled = dataset == "eval" and self.class_output is not None
                res = compare(self.reference[dataset], run(images.tensors(prep)),
                              images.labels if labelled else None, images.class_names if labelled else None,
                              names=names, class_output=self.class_output)
                if labelled:
                    res["passed"] = res.get("ratio") is not None and res["ratio"] >= self.min_ratio
                elif self.task == "raw":
                    res["passed"] = res["cosine"] is not None and res["cosine"] >= self.request.min_cosine
                out[dataset] = res
                self.log.info(f"  {variant} on {res['n']} {dataset} images: " + _summary(res))
        return out


def _summary(res: dict) -> str:
    """One log line of a comparison: the task metric, then every output's cosine and SQNR."""
    head = ""
    if res.get("ratio") is not None:
        head = f"top-1 original {res['original']:.4f} converted {res['converted']:.4f} ratio {res['ratio']}; "
    if res.get("agreement") is not None:
        head += f"agreement {res['agreement']:.4f}; "
    return head + "; ".join(f"{n}: cosine {m['cosine']} SQNR {m['sqnr_db']} dB" for n, m in res["outputs"].items())


class Builder(Protocol):
    """The callable a target file names as ``builder = "module:function"`` (the builder contract)."""

    def __call__(self, ctx: BuildContext, target: Target, out_dir: Path) -> BuilderOutput: ...
