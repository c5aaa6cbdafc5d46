"""What every target's builder shares in one build: the request, the loaded model, the images,
the original model's reference outputs and the log.

The model is loaded, exported and run on the evaluation and held-back images once per build,
however many targets there are. Images and outputs go through a chunk at a time
(:func:`edgekit.builders.host.resources.chunk_size`): the original model's reference outputs are
spooled to a temporary file and read back beside each variant's, so a build's memory does not
grow with the number of images (benchmarks/build_scaling.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgekit.builders.contract import BuilderOutput
from edgekit.builders.gate.detect import as_reference, detect_result
from edgekit.builders.gate.landmarks import log_text as landmark_text
from edgekit.builders.gate.openset import background_of, fit_variant
from edgekit.builders.gate.segment import log_text as mask_text
from edgekit.builders.gate.verify import Comparison, weak_original_warning
from edgekit.builders.host.resources import chunk_size
from edgekit.builders.log import BuildLog
from edgekit.builders.request import BuildRequest
from edgekit.builders.sources.images import ImageSet, TensorStream
from edgekit.builders.sources.load import SourceModel
from edgekit.builders.sources.spool import Spool
from edgekit.imaging.image import InputSpec, Preprocessor
from edgekit.target import Target


@dataclass
class BuildContext:
    """The shared state of one build, handed to each target's builder.

    ``calib`` holds the images drawn for int8 calibration (the converter sees
    ``converter_calib``: the first ``--calib-steps`` of them), ``holdout`` those held back to
    measure agreement, ``calib_all`` both (what the manifest's provenance describes).
    ``reference`` holds, per data set, the original model's outputs (one spool per output).
    ``task`` is the bundle's task head (``classify``, ``detect``, ``raw``, ``landmarks``); ``class_output``
    the index of the class scores among the source's outputs (None for ``raw`` and ``detect``).
    ``detect`` (a :class:`~edgekit.builders.gate.detect.DetectGate`, detect only) decodes every
    model's outputs the same way and keeps the original's detections per data set. ``landmarks``
    (a :class:`~edgekit.builders.gate.landmarks.LandmarkGate`) decodes both models' points and
    judges each variant by their distance in pixels; ``segment`` (a
    :class:`~edgekit.builders.gate.segment.SegmentGate`) by their masks' IoU.
    ``background``: the index of the class meaning "nothing there" (classify); with an eval
    set, each variant's open-set thresholds are fitted in :meth:`verify` (builders/gate/openset.py).
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
    detect: Any = None
    landmarks: Any = None  # a LandmarkGate (builders/gate/landmarks.py), landmarks only
    segment: Any = None  # a SegmentGate (builders/gate/segment.py), segment only
    planned: dict[str, Any] = field(default_factory=dict)  # target name -> BuildTarget (builders/targets.py)
    reference: dict[str, list[Spool]] = field(default_factory=dict)
    converted_outputs: list[dict] = field(default_factory=list)
    chunk: int = field(default=1, init=False)  # images per chunk (set from the input size)
    converter_calib: ImageSet | None = field(default=None, init=False)  # what int8 calibration sees
    background: int | None = field(default=None, init=False)  # the no-sign class (classify; builders/gate/openset.py)
    # each recipe's own intermediate products, by recipe (the TFLite recipe's: builders/int8/recipe.py
    # FloatGraphs), made once per build and reused by its targets; the context only holds the slot
    products: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _saved: Path | None = None

    def __post_init__(self) -> None:
        if self.task == "classify":  # before any work: a --background-class that is not a label is one line
            self.background = background_of(self.labels, self.request.background_class)
        self._float = Preprocessor(self.float_spec)
        # what converted TFLite models take: channels-last, whatever the original's layout, except
        # a .tflite source, whose variants are made on its own graph and keep its layout
        h, w, c = self.source.input_hwc
        nchw = self.source.kind == "tflite" and self.source.layout == "NCHW"
        self._nhwc = Preprocessor(InputSpec.from_dict(
            {**self.float_spec.to_dict(), "layout": "NCHW" if nchw else "NHWC",
             "shape": [1, c, h, w] if nchw else [1, h, w, c]}))
        self.chunk = chunk_size(*self.source.input_hwc[:2])
        steps = self.request.calib_steps or len(self.calib)
        self.converter_calib = self.calib.subset(np.arange(min(steps, len(self.calib))))
        if len(self.converter_calib) < len(self.calib):
            self.log.info(f"int8 calibration: the converter sees the first {steps} of the {len(self.calib)} "
                          "calibration images (--calib-steps; it runs the float model once per image)")
        with self.log.step("reference outputs of the original model"):
            for dataset, images in (("eval", self.evalset), ("holdout", self.holdout)):
                if images is not None and len(images):
                    self.reference[dataset] = self._reference(images, dataset)
        # builders/gate/verify.py: the gate cannot see it
        if "eval" in self.reference and self.class_output is not None:
            warning = weak_original_warning(self.reference["eval"][self.class_output].chunks(self.chunk),
                                            self.evalset.labels, self.float_spec)
            if warning:
                self.log.warn(warning)
        if self.detect is not None and (weak := self.detect.weak_original_warning()):
            self.log.warn(weak)

    def _reference(self, images: ImageSet, dataset: str) -> list[Spool]:
        """The original model's outputs for ``images``, one spool per output, a chunk at a time
        (a detector's are also decoded: its detections are kept for the mAP)."""
        spools = [Spool(dtype=np.float32) for _ in self.source.outputs]
        for batch in images.batches(self._float, self.chunk):
            outputs = self.source.predict(batch, batch_size=self.chunk)
            if self.segment is not None:  # a logit read as a probability: one line now, not a gate that lies
                self.segment.check_reference(outputs)
            for spool, out in zip(spools, outputs):
                spool.extend(out)
            if self.detect is not None:
                self.detect.add_reference(dataset, outputs)
        return spools

    def _fidelity_warning(self, variant: str, dataset: str, res: dict) -> None:
        warning = _detect_fidelity(variant, dataset, res)
        if warning:
            self.log.warn(warning)

    @property
    def nhwc_spec(self) -> InputSpec:
        """The float input spec as a converted TFLite model takes it: channels-last, whatever
        the original's layout (onnx2tf turns NCHW into NHWC)."""
        return self._nhwc.spec

    @property
    def min_ratio(self) -> float:
        """Converted/original top-1 (a detector: mAP@[.5:.95]) below this fails a variant."""
        return self.request.min_map_ratio if self.task == "detect" else self.request.min_accuracy_ratio

    def options_for(self, target: Target) -> dict[str, Any]:
        """The builder options for ``target``: its ``[build]`` table, with what the request gives laid over
        (merged once, when the build resolved its targets; merged here for a builder called on its own)."""
        planned = self.planned.get(target.name)
        if planned is not None and planned.target is target:
            return dict(planned.options)
        return target.build_options(self.request.builder_overrides())

    def saved_model(self) -> Path:
        """A static batch-1 NHWC SavedModel of the source, made once per build; its signature
        outputs are keyed by the source outputs' keys (ONNX: through onnx2tf)."""
        if self._saved is None and self.source.kind == "onnx":
            from edgekit.builders.convert.onnx_to_tf import onnx_to_saved_model

            with self.log.step(f"convert ONNX ({self.source.layout}) to a TensorFlow SavedModel with onnx2tf "
                               "(its log goes to build.log)"):
                # a failed conversion's log outlives the build's temporary folder (the error names it)
                failed_log = self.request.out / f"{self.name}-onnx2tf.failed.log"
                self._saved, result = onnx_to_saved_model(self.source, self.representative().head(20), self.workdir,
                                                          self.log, failed_log)
                self.converted_outputs = result["outputs"]
        elif self._saved is None:
            with self.log.step("export SavedModel (static batch 1)"):
                self._saved = self.source.export_static(self.workdir / "saved_model")
        return self._saved

    def representative(self) -> TensorStream:
        """Float NHWC tensors of the calibration images, for int8 conversion: a sized stream,
        decoded a chunk at a time each time it is walked."""
        return self.converter_calib.stream(self._nhwc, self.chunk)

    def verify(self, variant: str, run: Callable[[np.ndarray], np.ndarray], spec: InputSpec,
               expect: Sequence[Callable | None] | None = None) -> dict:
        """Run a converted variant on the eval and held-back images and compare every output with the original.

        ``run`` maps a batch of input tensors (for ``spec``) to float outputs: one array per
        source output, in the source's order, one row per image. It is called once per chunk
        of images (:attr:`chunk` of them at most). ``expect``: per source output, what turns the
        original's output into what this variant is meant to give (a graph rewrite that changed
        it, builders/graph/rewrite.py :func:`source_expect`), so cosine and SQNR compare like with
        like; the detections are decoded from the original's own outputs either way.
        """
        prep = Preprocessor(spec)
        out: dict[str, Any] = {}
        with self.log.step(f"verify {variant}"):
            for dataset, images in (("eval", self.evalset), ("holdout", self.holdout)):
                if images is None or not len(images):
                    continue
                labelled = dataset == "eval" and self.class_output is not None
                comparison = Comparison(self.source.output_names, self.class_output)
                references = [spool.chunks(self.chunk) for spool in self.reference[dataset]]
                found: list = []
                head = self.landmarks or self.segment  # a gate in the head's own units (pixels, IoU)
                points = head.tally(getattr(images, "names", None)) if head is not None else None
                class_rows: list[np.ndarray] = []  # the open-set fit's input (a few KB: N x classes)
                for batch in images.batches(prep, self.chunk):
                    refs, outputs = [next(r) for r in references], run(batch)
                    comparison.add(_expected(refs, expect), outputs)
                    if points is not None:  # the device decodes the variant's own outputs: so does the gate
                        points.add(refs, outputs)
                    if labelled and self.background is not None:
                        class_rows.append(np.asarray(outputs[self.class_output]).reshape(len(batch), -1))
                    if self.detect is not None:
                        found += self.detect.decode(dataset, [as_reference(r, o) for r, o in zip(refs, outputs)],
                                                    len(found))
                res = comparison.result(images.labels if labelled else None,
                                        images.class_names if labelled else None)
                if self.detect is not None:
                    res.update(detect_result(self.detect, dataset, found, self.min_ratio, res, self.request))
                    self._fidelity_warning(variant, dataset, res)
                elif labelled:
                    res.update(Comparison.gate(res, self.min_ratio, self.request.min_top1_agreement))
                if class_rows:
                    res["openset"] = fit_variant(np.concatenate(class_rows), images.labels, self.background)
                elif points is not None:
                    res.update(points.result())
                    if dataset == "eval" or self.evalset is None:  # the set the gate judges; else reported
                        res.update(head.judge(res))
                elif self.task == "raw":
                    res.update(Comparison.raw_gate(res, self.request.min_cosine))
                out[dataset] = res
                self.log.info(f"  {variant} on {res['n']} {dataset} images: " + _summary(res))
        return out


def _expected(refs: list[np.ndarray], expect: Sequence[Callable | None] | None) -> list[np.ndarray]:
    """The original's outputs as the variant is meant to give them (see :meth:`BuildContext.verify`)."""
    if not expect:
        return refs
    return [f(r) if f is not None else r for r, f in zip(refs, [*expect, *[None] * len(refs)])]


def _detect_fidelity(variant: str, dataset: str, res: dict) -> str | None:
    """A warning when a converted detector's figures look better or worse than they are."""
    from edgekit.builders.gate.detect import GAIN_MARGIN, LOW_AGREEMENT

    if res.get("suspicious_gain"):
        return (f"{variant}: mAP {res['ratio']:.2f}x the original's on the eval set (over {1 + GAIN_MARGIN:.2f}x): "
                "a conversion does not improve a model; its scores or boxes moved (compare agreement and cosine)")
    agreement = res.get("agreement")
    if dataset == "holdout" and agreement is not None and agreement < LOW_AGREEMENT:
        return (f"{variant}: agrees with the original's detections at mAP {agreement:.2f} on the held-back images "
                f"(under {LOW_AGREEMENT}): its scores or boxes lost resolution, whatever the eval-set ratio says")
    return None


def _summary(res: dict) -> str:
    """One log line of a comparison: the task metric, then every output's cosine and SQNR."""
    head = ""
    if res.get("metric") == "map":
        head = "; ".join(f"{name} original {_fmt(m['original'])} converted {_fmt(m['converted'])} "
                         f"ratio {_fmt(m['ratio'])}" for name, m in (("mAP@[.5:.95]", res),
                                                                     ("mAP@.5", res.get("map50") or {}))) + "; "
    elif res.get("metric") == "map_agreement":
        head = (f"mAP@[.5:.95] against the original's detections {_fmt(res.get('agreement'))}; "
                f"mAP@.5 {_fmt((res.get('map50') or {}).get('converted'))}; ")
    elif res.get("ratio") is not None:
        head = f"top-1 original {res['original']:.4f} converted {res['converted']:.4f} ratio {res['ratio']}; "
    if res.get("keypoints"):
        kp = res["keypoints"]
        head += (f"keypoint error vs the original {_fmt(kp['mean'])} of the box size (max {_fmt(kp['max'])}, "
                 f"{kp['matched']}/{kp['reference']} matched); ")
    head += landmark_text(res) + mask_text(res)
    if res.get("agreement") is not None and not res.get("metric"):
        head += f"agreement {res['agreement']:.4f}; "
    return head + "; ".join(f"{n}: cosine {m['cosine']} SQNR {m['sqnr_db']} dB" + _mae(m)
                            for n, m in res["outputs"].items())


def _mae(metrics: dict) -> str:
    """`` MAE 0.0123`` (the output's own units) when measured, else nothing."""
    mae = metrics.get("mean_abs_diff")
    return f" MAE {mae:.4g}" if isinstance(mae, (int, float)) else ""


class Builder(Protocol):
    """The callable a target file names as ``builder = "module:function"`` (the builder contract)."""

    def __call__(self, ctx: BuildContext, target: Target, out_dir: Path) -> BuilderOutput: ...


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4f}"
