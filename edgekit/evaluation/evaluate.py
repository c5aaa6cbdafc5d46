"""mAP of detections against ground truth, with pycocotools' COCOeval (no AP of our own).

:func:`coco_map` scores a model's :class:`~edgekit.detect.boxes.Detections` on a
:class:`~edgekit.evaluation.dataset.DetectionSet`: mAP@[.5:.95] and mAP@.5 (COCO's ``stats[0]``
and ``stats[1]``, 101-point interpolated, up to 100 detections per image) and the same per
class. :func:`agreement_map` scores one model's detections against another's taken as
ground truth (a converted model against the original, when no annotated set is given).

COCOeval prints its progress with ``print``; it is caught and sent to the DEBUG log, so a
command's stdout (``--json``) stays clean.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgekit.detect.boxes import Detections
from edgekit.errors import BackendUnavailable, CalibrationError

log = logging.getLogger(__name__)

MAP_HEAD_OPTIONS = {"score_threshold": 0.001, "max_detections": 100}
"""Detect head options for measuring mAP: keep every box scoring 0.001 or more, up to COCO's 100
per image (``maxDets``), as mAP is measured everywhere (Ultralytics' ``val`` uses 0.001 too): a
deployment threshold such as 0.25 cuts the precision-recall curve short and lowers the mAP."""

CATEGORY_OFFSET = 1
"""COCO category id of class index ``i`` is ``i + CATEGORY_OFFSET`` (COCO ids start at 1)."""


def categories(labels: Sequence[str]) -> list[dict[str, Any]]:
    """COCO categories for class names in model order (id = class index + 1)."""
    return [{"id": i + CATEGORY_OFFSET, "name": str(n)} for i, n in enumerate(labels)]


@contextlib.contextmanager
def _quiet():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield
    if buf.getvalue().strip():
        log.debug("pycocotools: %s", buf.getvalue().strip())


def _pycocotools():
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError as exc:
        raise BackendUnavailable("mAP needs pycocotools, which is not installed",
                                 "pip install 'edgekit-vision[eval]' (or pycocotools)") from exc
    return COCO, COCOeval


def coco_object(dataset: dict[str, Any]) -> Any:
    """A pycocotools ``COCO`` made from a COCO dict (indexed, without printing)."""
    COCO, _ = _pycocotools()  # noqa: N806
    coco = COCO()
    coco.dataset = dataset
    with _quiet():
        coco.createIndex()
    return coco


def results(detections_by_image: Mapping[int, Detections], num_classes: int) -> list[dict[str, Any]]:
    """COCO result entries (``bbox`` x, y, w, h) of every image's detections; classes outside
    the labels are dropped (they match no ground truth)."""
    out = []
    for image_id, found in detections_by_image.items():
        for d in found.detections:
            if not 0 <= d.index < num_classes:
                continue
            x1, y1, x2, y2 = d.box
            out.append({"image_id": int(image_id), "category_id": int(d.index) + CATEGORY_OFFSET,
                        "bbox": [x1, y1, max(0.0, x2 - x1), max(0.0, y2 - y1)], "score": float(d.score)})
    return out


def _evaluate(gt: dict[str, Any], dets: list[dict[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    """COCOeval (bbox) of ``dets`` on ``gt``: overall and per-class mAP@[.5:.95] and mAP@.5."""
    _, COCOeval = _pycocotools()  # noqa: N806
    coco_gt = coco_object(gt)
    with _quiet():
        if dets:
            coco_dt = coco_gt.loadRes(dets)
        else:  # loadRes cannot take an empty list: an empty result set scores 0
            coco_dt = coco_object({"images": gt["images"], "categories": gt["categories"], "annotations": []})
        ev = COCOeval(coco_gt, coco_dt, "bbox")
        ev.params.imgIds = sorted(im["id"] for im in gt["images"])
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    precision = ev.eval["precision"]  # [iou thresholds, recall, class, area, max dets]

    def mean(p: np.ndarray) -> float | None:
        # what COCOeval.summarize averages: every cell with ground truth (-1: none)
        valid = p[p > -1]
        return round(float(valid.mean()), 6) if valid.size else None

    per_class, per_class50 = {}, {}
    for k, cat_id in enumerate(ev.params.catIds):
        name = str(labels[cat_id - CATEGORY_OFFSET])
        ap = mean(precision[:, :, k, 0, -1])
        if ap is not None:
            per_class[name] = ap
            per_class50[name] = mean(precision[0, :, k, 0, -1])
    overall, overall50 = (float(v) for v in ev.stats[:2])
    # COCOeval's -1: no ground truth it scores (every object iscrowd): the mAP is undefined, not 0
    undefined = not (math.isfinite(overall) and overall >= 0)
    return {"map": None if undefined else round(overall, 6),
            "map50": None if undefined else round(max(overall50, 0.0), 6), "per_class": per_class,
            "per_class50": per_class50, "images": len(gt["images"]), "detections": len(dets),
            "objects": sum(1 for a in gt["annotations"] if not a.get("iscrowd"))}


def coco_map(dataset: Any, detections_by_image: Mapping[int, Detections]) -> dict[str, Any]:
    """mAP@[.5:.95] (``map``), mAP@.5 (``map50``) and per class (``per_class``, ``per_class50``;
    classes with ground truth only) of detections on ``dataset``, with pycocotools.

    ``detections_by_image``: image id -> that image's Detections, boxes in its own pixels.
    Only the images given are scored (an image skipped as unreadable does not count as
    missed); ``images`` says how many. Raises CalibrationError when none of them holds an
    annotated object.
    """
    ids = [im.id for im in dataset.images if im.id in detections_by_image]
    gt = dataset.to_coco(ids)
    if not gt["annotations"]:
        raise CalibrationError(f"none of the {len(ids)} images scored holds an annotated object",
                               "check the annotations and that the images can be read")
    keep = {i: detections_by_image[i] for i in ids}
    scores = _evaluate(gt, results(keep, len(dataset.labels)), dataset.labels)
    if scores["map"] is None:
        crowd = sum(1 for a in gt["annotations"] if a.get("iscrowd"))
        raise CalibrationError(f"mAP is undefined on {dataset.root}: none of the {len(gt['annotations'])} objects "
                               f"of the {len(ids)} images scored counts ({crowd} are iscrowd, which COCO ignores)",
                               "give an eval set with objects that are not iscrowd")
    return scores


def agreement_map(reference: Sequence[Detections], converted: Sequence[Detections], labels: Sequence[str],
                  min_score: float = 0.25) -> dict[str, Any] | None:
    """mAP of ``converted`` taking ``reference``'s detections scoring ``min_score`` or more as
    ground truth (image ``i`` of each is the same image). The reference scored against itself
    gives 1.0. None when the reference found nothing to agree on."""
    num_classes = len(labels) or 1 + max((d.index for r in (*reference, *converted) for d in r.detections),
                                         default=0)
    names = list(labels) or [str(i) for i in range(num_classes)]
    images, anns = [], []
    for i, found in enumerate(reference, 1):
        w, h = found.size or (1, 1)
        images.append({"id": i, "width": int(w), "height": int(h)})
        for d in found.detections:
            if d.score >= min_score and 0 <= d.index < num_classes:
                x1, y1, x2, y2 = d.box
                bw, bh = max(0.0, x2 - x1), max(0.0, y2 - y1)
                anns.append({"id": len(anns) + 1, "image_id": i, "category_id": d.index + CATEGORY_OFFSET,
                             "bbox": [x1, y1, bw, bh], "area": bw * bh, "iscrowd": 0})
    if not anns:
        return None
    gt = {"images": images, "annotations": anns, "categories": categories(names)}
    dets = results(dict(enumerate(converted, 1)), num_classes)
    return _evaluate(gt, dets, names)



def _area(boxes: np.ndarray) -> np.ndarray:
    return np.prod(np.clip(boxes[..., 2:] - boxes[..., :2], 0, None), axis=-1)


def _iou(box: Sequence[float], others: np.ndarray) -> np.ndarray:
    """IoU of one xyxy box with ``[M, 4]`` xyxy boxes."""
    inter = _area(np.concatenate([np.maximum(others[:, :2], box[:2]), np.minimum(others[:, 2:], box[2:])], axis=1))
    union = _area(np.asarray(box, np.float64)) + _area(others) - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _pair_error(ref: Any, found: Detections, boxes: np.ndarray, min_iou: float) -> float | None:
    """Mean keypoint distance / reference box size to ``ref``'s best match in ``found`` (None: no match)."""
    n = len(ref.keypoints)
    same = [j for j, c in enumerate(found.detections) if c.index == ref.index and len(c.keypoints) == n]
    if not same:
        return None
    ious = _iou(ref.box, boxes[same])
    # ties (boxes clipped to the same frame edge) go to the closest score: the same anchor's detection
    gaps = np.abs(np.asarray([found.detections[j].score for j in same]) - ref.score)
    best = int(np.lexsort((gaps, -np.round(ious, 6)))[0])
    if ious[best] < min_iou:
        return None
    gap = np.linalg.norm(np.subtract(found.detections[same[best]].keypoints, ref.keypoints), axis=1)
    x1, y1, x2, y2 = ref.box
    return float(gap.mean()) / math.sqrt(max((x2 - x1) * (y2 - y1), 1e-12))


def keypoint_error(reference: Sequence[Detections], converted: Sequence[Detections], min_score: float = 0.25,
                   min_iou: float = 0.5) -> dict[str, Any] | None:
    """How far ``converted``'s keypoints land from ``reference``'s (image ``i`` of each is the same image).

    Each reference detection scoring ``min_score`` or more is matched to the converted detection
    of the same class with the highest IoU (at least ``min_iou``); a pair's error is the mean
    distance between corresponding keypoints divided by the reference box's size (the square
    root of its area, as COCO's keypoint similarity scales by object size). Returns ``mean``,
    ``p95`` and ``max`` of the pairs' errors (None when nothing matched), ``matched`` and
    ``reference`` counts; None when the reference holds no detection with keypoints.
    """
    errors, total = [], 0
    for ref, found in zip(reference, converted):
        boxes = np.asarray([d.box for d in found.detections], np.float64).reshape(-1, 4)
        for d in ref.detections:
            if d.score >= min_score and d.keypoints:
                total += 1
                error = _pair_error(d, found, boxes, min_iou)
                errors += [] if error is None else [error]
    if not total:
        return None
    e = np.asarray(errors)
    mean, p95, most = ((round(float(v), 6) for v in (e.mean(), np.percentile(e, 95), e.max())) if e.size
                       else (None, None, None))
    return {"mean": mean, "p95": p95, "max": most, "matched": len(errors), "reference": total,
            "normalised_by": "sqrt(reference box area)"}
