"""The ``detect`` task in a build: the eval set, the detect head, and the mAP gate.

The original model's outputs and every converted variant's are decoded by the same detect
head (:class:`edgekit.detect.head.Detector`, the layout chosen once from the original's
output shapes), boxes mapped to each eval image's own pixels, and scored with pycocotools
(:func:`edgekit.evaluation.evaluate.coco_map`) against the annotations. A variant fails when its
mAP@[.5:.95] is below ``--min-map-ratio`` x the original's. Without an eval set the held-back
calibration images are scored with the original's own detections as ground truth
(:func:`~edgekit.evaluation.evaluate.agreement_map`): reported, not gated.

For mAP the head keeps every box scoring :data:`EVAL_OPTIONS` ``score_threshold`` or more, up
to COCO's 100 per image (as mAP is measured everywhere: a high threshold cuts the
precision-recall curve short); the bundle's own threshold is the head's default.
Only detections are kept per image (a few dozen boxes), never the raw outputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.builders.gate.verdict import Verdict
from edgekit.builders.log import BuildLog, progress
from edgekit.builders.sources.images import ImageSet
from edgekit.builders.sources.spool import Spool
from edgekit.detect.boxes import Detections
from edgekit.errors import CalibrationError, ModelError, UsageError
from edgekit.evaluation.dataset import DetectionSet, load_detection_set
from edgekit.evaluation.evaluate import MAP_HEAD_OPTIONS
from edgekit.imaging.image import ImageReadError, InputSpec, Preprocessor, read_image

EVAL_OPTIONS = MAP_HEAD_OPTIONS
"""Head options for scoring mAP (:data:`edgekit.evaluation.evaluate.MAP_HEAD_OPTIONS`)."""

AGREEMENT_MIN_SCORE = 0.25
"""Without an eval set: the original's detections at or above this score are the ground truth
(and with keypoints, those whose keypoints each variant's are compared with)."""

WEAK_MAP = 0.05
"""An original model scoring a lower mAP@[.5:.95] on the eval set than this is warned about."""


@dataclass
class DetectEval:
    """An eval set as the build holds it: the annotations, and per row of the eval ImageSet the
    image id and its original ``(height, width)`` (boxes are mapped back to it)."""

    dataset: DetectionSet
    ids: list[int]
    shapes: list[tuple[int, int]]


def load_detection_eval(root: str | Path, prep: Preprocessor, labels: Sequence[str] | None,
                        log: BuildLog) -> tuple[ImageSet, DetectEval]:
    """Load a COCO/YOLO detection set and shape its images for the model (spooled, one at a time).

    Unreadable images are skipped with a warning and left out of the mAP (not counted as missed).
    """
    dataset = load_detection_set(root, labels)
    spool, ids, shapes, skipped = Spool(), [], [], 0
    digest = hashlib.sha256()
    for image in progress(dataset.images, "evaluation images"):
        try:
            img = read_image(image.path)
        except ImageReadError:
            skipped += 1
            continue
        if img.shape[:2] != (image.height, image.width):
            raise UsageError(f"{image.path} decodes as {img.shape[1]}x{img.shape[0]}, but its header says "
                             f"{image.width}x{image.height}", "re-save the image")
        digest.update(image.path.name.encode())
        digest.update(image.path.read_bytes())
        spool.append(prep.shaped(img))
        ids.append(image.id)
        shapes.append((image.height, image.width))
    if not ids:
        raise CalibrationError(f"none of the {len(dataset.images)} images of {root} is readable",
                               "check the image files")
    if skipped:
        log.warn(f"skipped {skipped} unreadable evaluation image(s); they are left out of the mAP")
    if dataset.clipped:
        log.info(f"{dataset.clipped} box(es) passed their image's edge by a rounding margin and were clipped")
    if dataset.degenerate:
        log.warn(f"{dataset.degenerate} of the {dataset.annotation_count} boxes of {root} are under 1 pixel wide "
                 "or high, or repeat another box exactly: they count in the mAP (fix the annotations)")
    names = ", ".join(dataset.labels[:8]) + (", ..." if len(dataset.labels) > 8 else "")
    log.info(f"evaluation set ({dataset.format}): {len(ids)} images, {dataset.annotation_count} objects in "
             f"{len(dataset.labels)} classes ({names})")
    images = ImageSet(spool, np.arange(len(ids)), digest.hexdigest(), len(dataset.images), skipped,
                      {str(root): len(ids)}, None, list(dataset.labels))
    return images, DetectEval(dataset, ids, shapes)


def source_shapes(source: Any) -> list[tuple[int, ...]]:
    """The original model's output shapes with the batch of 1 (open dimensions as -1)."""
    return [(1, *(d if isinstance(d, int) and d > 0 else -1 for d in o.shape)) for o in source.outputs]


def as_reference(reference: np.ndarray, converted: np.ndarray) -> np.ndarray:
    """A converted output in the original's layout: one that onnx2tf made channels-last is
    transposed back (the inverse of :func:`edgekit.builders.gate.verify.align`), so both are decoded alike."""
    if reference.shape == converted.shape:
        return converted
    perm = {4: (0, 3, 1, 2), 3: (0, 2, 1)}.get(converted.ndim)
    if perm and converted.transpose(perm).shape == reference.shape:
        return converted.transpose(perm)
    return converted


def _source_roles(layout: str, shapes: list[tuple[int, ...]], config: Any) -> tuple[int, ...] | None:
    """Which of the original's outputs plays each part of the layout (boxes, scores, ...)."""
    from edgekit.util.plugins import resolve

    if layout.startswith("yolo"):
        return (0,)
    if layout == "postprocess":
        return resolve("edgekit.detect.postprocess:_roles")(shapes)
    return resolve("edgekit.detect.ssd:config_roles")(shapes, config)  # ssd, decoded: its num_coords too


@dataclass
class DetectGate:
    """The detect head of one build: layout, decoder for mAP, reference detections per data set."""

    layout: str
    labels: list[str]
    options: dict[str, Any]
    detector: Any
    roles: tuple[int, ...] | None
    output_names: list[str]
    evaluation: DetectEval | None = None
    reference: dict[str, list[Detections]] = field(default_factory=dict)
    original: dict[str, dict | None] = field(default_factory=dict)
    threshold: float = 0.25  # the bundle's own score threshold: the fidelity gate's agreement is taken there

    @classmethod
    def for_model(cls, source: Any, labels: Sequence[str], spec: InputSpec, options: dict[str, Any] | None,
                  evaluation: DetectEval | None) -> DetectGate:
        """Choose the layout from the original's output shapes (ModelError naming every layout
        tried when none fits) and make the decoder that scores every model alike."""
        from edgekit.detect.head import Detector, choose_layout, detect_config, with_preset

        opts = with_preset(options or {})  # the bundle records the preset's options, not only its name
        if "outputs" in opts:
            raise UsageError("the detect option outputs is set by edgekit build (from the converted model)",
                             "leave it out; give layout= if the layout must be named")
        layout = opts.pop("layout", "auto")
        nc = len(labels) or None
        shapes = source_shapes(source)
        try:
            chosen = choose_layout(layout, shapes, detect_config(spec, nc, opts))
        except ModelError as exc:
            message = f"--task detect: {exc.message}"  # say which choice led here (a classifier given detect)
            if not labels:
                raise ModelError(message, exc.hint) from exc
            # a COCO model scored on a few of its classes: the labels must still list them all
            raise ModelError(message, f"check that the {len(labels)} labels ({', '.join(labels[:4])}"
                             f"{', ...' if len(labels) > 4 else ''}) are all the model's classes in its order "
                             f"(--labels FILE; an eval set's categories may be fewer); {exc.hint}") from exc
        detector = Detector(detect_config(spec, nc, {**opts, **EVAL_OPTIONS}), chosen, labels, spec)
        return cls(chosen, list(labels), opts, detector, _source_roles(chosen, shapes, detector.config),
                   source.output_names, evaluation, threshold=detect_config(spec, nc, opts).score_threshold)

    def decode(self, dataset: str, outputs: Sequence[np.ndarray], start: int) -> list[Detections]:
        """Detections of each image of a chunk (``outputs``: one batch array per output, the
        original's layout); eval boxes in the image's own pixels, held-back ones in input pixels."""
        found = []
        for k in range(len(outputs[0])):
            shape = self.evaluation.shapes[start + k] if dataset == "eval" and self.evaluation else None
            found.append(self.detector([o[k : k + 1] for o in outputs], frame_shape=shape))
        return found

    def add_reference(self, dataset: str, outputs: Sequence[np.ndarray]) -> None:
        """Decode one chunk of the original model's outputs and keep its detections."""
        kept = self.reference.setdefault(dataset, [])
        kept.extend(self.decode(dataset, outputs, len(kept)))

    def score(self, dataset: str, found: list[Detections]) -> dict | None:
        """mAP figures of ``found`` (one per image, in order): on the eval set against the
        annotations, on the held-back images against the original's detections."""
        from edgekit.evaluation.evaluate import agreement_map, coco_map

        if dataset == "eval" and self.evaluation is not None:
            return coco_map(self.evaluation.dataset, dict(zip(self.evaluation.ids, found)))
        return agreement_map(self.reference.get(dataset, []), found, self.labels, AGREEMENT_MIN_SCORE)

    def original_scores(self, dataset: str) -> dict | None:
        """The original model's own figures on ``dataset`` (computed once)."""
        if dataset not in self.original:
            self.original[dataset] = self.score(dataset, self.reference.get(dataset, []))
        return self.original[dataset]

    def weak_original_warning(self) -> str | None:
        """A warning when the original model's own mAP on the eval set is under :data:`WEAK_MAP`:
        the ratio gate then compares noise with noise (wrong decode options or preprocessing)."""
        if self.evaluation is None or "eval" not in self.reference:
            return None
        found = (self.original_scores("eval") or {}).get("map")
        if found is None or found >= WEAK_MAP:
            return None
        return (f"the original model itself scores mAP@[.5:.95] {found:.4f} on the eval set (under {WEAK_MAP}); "
                "a passing ratio means nothing here: check the decode options (layout, ssd_anchors, ssd_decode, "
                "box_format, box_units), the preprocessing (--mean, --std, --colour, --resize) and that the eval "
                "set's classes are the model's")

    def task_options(self, outputs: Sequence[dict]) -> dict[str, Any]:
        """A converted model's ``task_options``: the layout, the options given, and when the
        converter reordered the outputs, which runtime output plays each part (``outputs``)."""
        names = [o.get("name") for o in outputs]
        order = [names.index(n) if n in names else j for j, n in enumerate(self.output_names)]
        opts: dict[str, Any] = {"layout": self.layout, **self.options}
        if order != list(range(len(order))) and self.roles is not None:
            opts["outputs"] = [order[r] for r in self.roles]
        return opts


def _ratio(converted: float | None, original: float | None) -> float | None:
    return round(converted / original, 4) if converted is not None and original else None


def detect_result(gate: DetectGate, dataset: str, found: list[Detections], min_ratio: float,
                  compared: dict | None = None, request: Any = None) -> dict[str, Any]:
    """A variant's detection figures on ``dataset`` for its verification: on the eval set mAP
    original / converted / ratio (and mAP@.5, per class) and the gate; on the held-back images
    the mAP against the original's detections (``agreement``), not gated. With keypoints, also
    ``keypoints``: their error against the original's on the same images
    (:func:`edgekit.evaluation.evaluate.keypoint_error`), reported, not gated.

    ``fidelity`` (builders/gate/fidelity.py): agreement at the bundle's threshold, distinct
    score levels and the score output's cosine (from ``compared``, the outputs' comparison);
    on the eval set (without one: on the held-back images) they are gated with ``request``'s
    thresholds, and ``gate_failures`` (flag -> line) says which figure failed and which flag
    governs it."""
    from edgekit.builders.gate.fidelity import FidelityGate, failures, figures, score_output
    from edgekit.evaluation.evaluate import keypoint_error

    res = _map_result(gate, dataset, found, min_ratio)
    keypoints = keypoint_error(gate.reference.get(dataset, []), found, AGREEMENT_MIN_SCORE)
    if keypoints is not None:
        res["keypoints"] = keypoints
    scores = score_output(gate.layout, gate.roles)
    name = gate.output_names[scores] if scores < len(gate.output_names) else None
    res["fidelity"] = figures(gate.reference.get(dataset, []), found, gate.threshold,
                              (compared or {}).get("outputs"), name)
    # the eval set with its annotations is what the gate judges; without one, the held-back images
    # (their fidelity to the original's detections: there is no mAP ratio to hold)
    if res["metric"] == "map" or (dataset == "holdout" and gate.evaluation is None):
        # one place decides, the mAP ratio among the other figures (failures names each one missed);
        # an eval set whose mAP ratio could not be taken (an original that scores 0) fails too
        lines = failures(res["fidelity"], res, FidelityGate.of(request), min_ratio)
        res.update(Verdict.judged(lines, also=res["metric"] != "map" or res.get("ratio") is not None).fields())
    return res


def _map_result(gate: DetectGate, dataset: str, found: list[Detections], min_ratio: float) -> dict[str, Any]:
    original = gate.original_scores(dataset)
    converted = gate.score(dataset, found)
    if dataset != "eval" or gate.evaluation is None:
        if converted is None:
            return {"metric": "map_agreement", "agreement": None,
                    "note": f"the original model detects nothing scoring {AGREEMENT_MIN_SCORE} or more here"}
        return {"metric": "map_agreement", "agreement": converted["map"],
                "map50": {"original": 1.0, "converted": converted["map50"]},
                "ground_truth": f"the original model's detections scoring {AGREEMENT_MIN_SCORE} or more"}
    o, c = original or {}, converted or {}
    ratio = _ratio(c.get("map"), o.get("map"))
    per_class = {name: {"original": ap, "converted": c["per_class"].get(name),
                        "original50": o["per_class50"].get(name), "converted50": c["per_class50"].get(name)}
                 for name, ap in o.get("per_class", {}).items()}
    res = {"metric": "map", "original": o.get("map"), "converted": c.get("map"), "ratio": ratio,
           "map50": {"original": o.get("map50"), "converted": c.get("map50"),
                     "ratio": _ratio(c.get("map50"), o.get("map50"))},
           "per_class": per_class, "images": c.get("images"), "objects": c.get("objects")}
    if o.get("map") is not None and o["map"] < WEAK_MAP:
        res["original_weak"] = True  # the log says why (DetectGate.weak_original_warning)
    if ratio is not None and ratio > 1 + GAIN_MARGIN:
        res["suspicious_gain"] = True  # flagged, not celebrated (BuildContext.verify warns)
    return res


GAIN_MARGIN = 0.05
"""A converted detector scoring more than this above the original on the same eval set is flagged:
quantisation does not make a model better; a gain that large says the scores or boxes moved (a
damaged BlazeFace int8 scored 1.16x its original)."""
LOW_AGREEMENT = 0.8
"""Held-back images on which a converted detector agrees with the original's detections under this
(mAP against them) get a warning whatever the eval-set ratio says."""
