"""Accuracy mode of ``edgekit bench``: every variant on the same images, through the same
pipeline the device runs, beside its inference latency.

Classifiers: top-1 on an ImageFolder, with the agreement between variants. Detectors (bundle
task ``detect``): mAP@[.5:.95] and mAP@.5 (pycocotools) on a COCO or YOLO detection set.

    edgekit bench dist/demo-cpu --variants all --eval data/eval
    edgekit bench dist/detector-cpu --variants all --eval eval/detect
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bench.report import short_runtime
from edgekit.bench.variants import distinct_labels, expand_variants
from edgekit.errors import CalibrationError
from edgekit.model import open_model
from edgekit.pipeline import Pipeline


def _norm(name: str) -> str:
    # Folder names cannot hold every label character ("T-shirt/top"): compare letters and digits only.
    return re.sub(r"[^0-9a-z]", "", name.lower())


def eval_items(directory: str | Path, labels: Sequence[str]) -> tuple[list[tuple[Path, int]], list[str]]:
    """The images of an ImageFolder (one subfolder per class) with the class index of each.

    Subfolders are matched to ``labels`` by name (case, spaces and punctuation ignored);
    without labels, numeric folder names are taken as class indices.
    """
    from edgekit.imaging.image import IMAGE_SUFFIXES

    root = Path(directory)
    if not root.is_dir():
        raise CalibrationError(f"evaluation folder {root} does not exist", "give a folder with one subfolder per class")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    if not folders:
        raise CalibrationError(f"{root} has no class subfolders", "lay it out as DIR/<class name>/<image files>")
    index = {_norm(label): i for i, label in enumerate(labels)}
    items: list[tuple[Path, int]] = []
    unknown = []
    for folder in folders:
        cls = index.get(_norm(folder.name))
        if cls is None and not labels and folder.name.isdigit():
            cls = int(folder.name)
        if cls is None:
            unknown.append(folder.name)
            continue
        items.extend((f, cls) for f in sorted(folder.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES)
    if unknown:
        hint = f"labels are: {', '.join(labels)}" if labels else "give --labels FILE or name folders 0, 1, 2..."
        raise CalibrationError(f"class folder(s) {', '.join(unknown)} in {root} match no label of the model", hint)
    if not items:
        raise CalibrationError(f"{root} holds no images ({', '.join(IMAGE_SUFFIXES)})", "add images per class")
    return items, [f.name for f in folders]


@dataclass
class EvalResult:
    """Accuracy of one variant: top-1 on an ImageFolder, or mAP on a detection set
    (``metric`` says which ``accuracy`` is; ``map50`` is mAP@.5 for detectors)."""

    name: str
    images: int
    unreadable: int
    accuracy: float
    per_class: dict[str, float]
    predictions: list[int]
    runtime: dict[str, Any]
    agreement: float | None = None
    metric: str = "top-1"
    map50: float | None = None
    inference_p50_ms: float | None = None


def evaluate(
    models: Sequence[str],
    directory: str | Path,
    variants: str = "default",
    runtime_options: dict[str, Any] | None = None,
    labels: str | None = None,
    names: dict[str, str] | None = None,
) -> list[EvalResult]:
    """Top-1 accuracy of every variant on the same images, through the same pipeline; each row
    labelled as the bench's (:func:`edgekit.bench.variants.distinct_labels`, ``names``: ``--label``).

    ``agreement`` is the share of images where a variant's top-1 equals the first variant's.
    Unreadable or truncated images are skipped and counted.
    """
    from edgekit.camera import Frame
    from edgekit.imaging.image import ImageReadError, read_image

    out: list[EvalResult] = []
    seen: list[tuple[Path, str, str | None]] = []  # one per row of out: what labels it
    for path, variant in expand_variants(models, variants):
        with open_model(path, variant, labels, **(runtime_options or {})) as m:
            seen.append((m.path, m.name, m.variant))
            if m.task == "detect":
                out.append(evaluate_detector(m, directory))
                continue
            items, _ = eval_items(directory, m.labels)
            pipeline = Pipeline(m.runtime, m.labels, top_k=1, warmup=0)
            preds, truth, unreadable = [], [], 0
            for i, (file, cls) in enumerate(items):
                try:
                    image = read_image(file)
                except ImageReadError:
                    unreadable += 1
                    continue
                result = pipeline.step(Frame(image, time.perf_counter_ns(), i))
                if result is None:
                    unreadable += 1
                    continue
                preds.append(result.classification.top.index)
                truth.append(cls)
            if not preds:
                raise CalibrationError(f"no readable image in {directory}", "check the image files")
            p, t = np.array(preds), np.array(truth)
            class_names = {c: label for c, label in enumerate(m.labels)}
            per_class = {class_names.get(int(c), str(c)): float((p[t == c] == c).mean()) for c in np.unique(t)}
            out.append(
                EvalResult(
                    m.name, len(preds), unreadable, float((p == t).mean()), per_class, preds, m.runtime.describe(),
                    inference_p50_ms=pipeline.metrics.stages["inference"].summary().p50_ms,
                )
            )
    for r, label in zip(out, distinct_labels(seen, names)):
        r.name = label
    ref = out[0].predictions
    for r in out:
        if r.metric == "top-1" and len(r.predictions) == len(ref):
            r.agreement = float(np.mean(np.array(r.predictions) == np.array(ref)))
    return out


def evaluate_detector(m: Any, directory: str | Path) -> EvalResult:
    """mAP@[.5:.95] and mAP@.5 of one open detector on a detection set (COCO or YOLO labels),
    its boxes in each image's own pixels, scored as the build's gate scores them (every box
    above :data:`~edgekit.evaluation.evaluate.MAP_HEAD_OPTIONS`' threshold)."""
    from edgekit.camera import Frame
    from edgekit.evaluation.dataset import load_detection_set
    from edgekit.evaluation.evaluate import MAP_HEAD_OPTIONS, coco_map
    from edgekit.imaging.image import ImageReadError, read_image

    dataset = load_detection_set(directory, m.labels)
    # mAP is measured over the whole precision-recall curve, as the build's gate measures it:
    # the bundle's deployment threshold (e.g. 0.25) would cut the curve short and lower the figure
    options = {**m.task_options, **MAP_HEAD_OPTIONS}
    pipeline = Pipeline(m.runtime, m.labels, warmup=0, task="detect", task_options=options)
    found, unreadable = {}, 0
    for i, entry in enumerate(dataset.images):
        try:
            result = pipeline.step(Frame(read_image(entry.path), time.perf_counter_ns(), i))
        except ImageReadError:
            result = None
        if result is None:
            unreadable += 1
            continue
        found[entry.id] = result.result
    if not found:
        raise CalibrationError(f"no readable image in {directory}", "check the image files")
    scores = coco_map(dataset, found)
    return EvalResult(m.name, len(found), unreadable, float(scores["map"]),
                      {k: float(v) for k, v in (scores.get("per_class") or {}).items()
                       if isinstance(v, (int, float))},
                      [], m.runtime.describe(), metric="mAP", map50=float(scores["map50"]),
                      inference_p50_ms=pipeline.metrics.stages["inference"].summary().p50_ms)


def format_eval(results: list[EvalResult]) -> str:
    """Accuracy table, one row per variant: the metric, its ratio to the first variant's, and
    the inference p50 measured during the evaluation (one table, as ``yolo benchmark`` prints)."""
    detect = results[0].metric == "mAP"
    metric = f"{'mAP':>8}{'mAP50':>8}" if detect else f"{'top-1':>8}"
    head = f"{'variant':<28}{'runtime':<34}{'images':>8}{metric}{'ratio':>8}{'agree':>8}{'p50 ms':>9}"
    lines = [head, "-" * len(head)]
    ref = results[0].accuracy
    for r in results:
        # no ratio to a first variant that scored 0, nor an unknown mAP50: "n/a", never "nan"
        ratio = f"{r.accuracy / ref:>8.3f}" if ref else f"{'n/a':>8}"
        agree = f"{r.agreement:.1%}" if r.agreement is not None else "n/a"
        map50 = f"{r.map50:>8.4f}" if r.map50 is not None else f"{'n/a':>8}"
        value = f"{r.accuracy:>8.4f}{map50}" if detect else f"{r.accuracy:>8.1%}"
        p50 = f"{r.inference_p50_ms:>9.3f}" if r.inference_p50_ms is not None else f"{'n/a':>9}"
        lines.append(f"{r.name[:27]:<28}{short_runtime(r.runtime)[:33]:<34}{r.images:>8}{value}{ratio}{agree:>8}{p50}")
        if r.unreadable:
            lines.append(f"  ({r.unreadable} unreadable image(s) skipped)")
    if detect:
        lines.append("mAP = COCO mAP@[.5:.95], mAP50 = mAP@.5 (pycocotools); ratio = mAP / first variant's; "
                     "p50 = inference p50 during the evaluation")
    else:
        lines.append("ratio = top-1 / first variant's top-1; agree = same top-1 as the first variant; "
                     "p50 = inference p50 during the evaluation")
    return "\n".join(lines)
