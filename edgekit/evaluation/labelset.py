"""The checked form of a detection eval set (:class:`DetectionSet`: images, class names,
COCO-form annotations) and the checks every loader applies to what it reads
(:mod:`edgekit.evaluation.dataset` for COCO, :mod:`edgekit.evaluation.yolo_labels` for YOLO txt).

A box may pass its image's edge by :data:`EDGE_TOLERANCE` of that side (at least 1 pixel):
annotation tools round, and the excess is clipped off. Beyond that it is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.evaluation.evaluate import CATEGORY_OFFSET, categories, coco_object
from edgekit.imaging.image import IMAGE_SUFFIXES

EDGE_TOLERANCE = 0.01
"""How far a box may pass its image's edge, as a share of that side (at least 1 pixel): clipped, not refused."""


@dataclass(frozen=True)
class DetectionImage:
    """One image of the set: COCO id, file, and its size in pixels as the file holds it."""

    id: int
    path: Path
    width: int
    height: int


@dataclass(frozen=True)
class DetectionSet:
    """Images, class names in the model's order, and COCO-form annotations (checked, clipped).

    ``annotations`` are COCO dicts: ``image_id``, ``category_id`` (class index + 1), ``bbox``
    ``[x, y, w, h]`` in the image's pixels, ``area``, ``iscrowd``, ``id``.
    """

    root: Path
    format: str  # "coco" or "yolo"
    images: tuple[DetectionImage, ...]
    labels: tuple[str, ...]
    annotations: tuple[dict, ...]
    clipped: int = 0  # boxes that passed an edge within EDGE_TOLERANCE and were clipped
    degenerate: int = 0  # boxes under MIN_BOX_SIDE or repeating another exactly (check_degenerate)

    @property
    def annotation_count(self) -> int:
        return len(self.annotations)

    def to_coco(self, image_ids: Sequence[int] | None = None) -> dict[str, Any]:
        """The set as a COCO dict, optionally only ``image_ids`` (and their annotations)."""
        keep = None if image_ids is None else set(int(i) for i in image_ids)
        images = [{"id": im.id, "width": im.width, "height": im.height, "file_name": im.path.name}
                  for im in self.images if keep is None or im.id in keep]
        anns = [dict(a) for a in self.annotations if keep is None or a["image_id"] in keep]
        return {"images": images, "annotations": anns, "categories": categories(self.labels)}

    def coco_gt(self, image_ids: Sequence[int] | None = None) -> Any:
        """A pycocotools ``COCO`` of the set (or of ``image_ids``), made without printing."""
        return coco_object(self.to_coco(image_ids))


def norm_name(name: str) -> str:
    """Label names compared without case, spaces or punctuation (``Traffic light`` == ``traffic_light``)."""
    return re.sub(r"[^0-9a-z]", "", str(name).lower())


def class_map(names: dict[int, str], labels: list[str] | None, where: str) -> tuple[dict[int, int], list[str]]:
    """Map the set's class ids (named) to class indices of ``labels`` (by name), or to the set's
    own names in id order when no labels are given."""
    if labels is None:
        order = sorted(names)
        return {cid: i for i, cid in enumerate(order)}, [names[c] for c in order]
    index = {norm_name(n): i for i, n in enumerate(labels)}
    unknown = [n for n in names.values() if norm_name(n) not in index]
    if unknown:
        raise UsageError(f"{where}: categories {', '.join(map(repr, unknown[:5]))} are not among the model's "
                         f"labels ({', '.join(labels[:10])}{', ...' if len(labels) > 10 else ''})",
                         "name the categories after labels.txt, or give the right --labels")
    return {cid: index[norm_name(n)] for cid, n in names.items()}, list(labels)


def safe_relative(name: Any, where: str) -> Path:
    """An annotation's image file name as a relative path inside the set (no ``..``, not absolute)."""
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: image file_name {name!r} is not a file name", "fix the annotations file")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise UsageError(f"{where}: image file_name {name!r} points outside the data set",
                         "give file names relative to the annotations file")
    return rel


def image_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` of an image file, from its header (imagesize; Pillow for other formats),
    else by decoding it. ImageTooLarge past imagesize.MAX_PIXELS, before anything is decoded."""
    from edgekit.imaging.image import ImageReadError, read_image
    from edgekit.util.imagesize import file_size

    try:
        size = file_size(path)
        if size is not None:
            return int(size[0]), int(size[1])
        h, w = read_image(path).shape[:2]
        return int(w), int(h)
    except (OSError, ImageReadError, ValueError) as exc:
        raise UsageError(f"{path} is not a readable image", "replace or remove it from the annotations") from exc


def check_box(box: Sequence[float], image: DetectionImage, where: str) -> tuple[list[float], bool]:
    """``[x, y, w, h]`` checked against its image: finite, positive size, inside it within
    :data:`EDGE_TOLERANCE` (clipped). Returns the box and whether it was clipped."""
    if not (isinstance(box, (list, tuple)) and len(box) == 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)):
        raise UsageError(f"{where}: bbox {box!r} is not 4 numbers [x, y, width, height]", "fix the annotation")
    x, y, w, h = (float(v) for v in box)
    if w <= 0 or h <= 0:
        raise UsageError(f"{where}: bbox {list(box)} has no area (width and height must be > 0)", "fix or drop it")
    tx, ty = max(1.0, EDGE_TOLERANCE * image.width), max(1.0, EDGE_TOLERANCE * image.height)
    if x < -tx or y < -ty or x + w > image.width + tx or y + h > image.height + ty:
        raise UsageError(f"{where}: bbox {[round(v, 2) for v in (x, y, w, h)]} lies outside its image "
                         f"{image.path.name} ({image.width}x{image.height})",
                         "fix the annotation (boxes are x, y, width, height in the image's pixels)")
    x1, y1 = max(0.0, x), max(0.0, y)
    x2, y2 = min(float(image.width), x + w), min(float(image.height), y + h)
    clipped = (x1, y1, x2, y2) != (x, y, x + w, y + h)
    if x2 <= x1 or y2 <= y1:
        raise UsageError(f"{where}: bbox {list(box)} lies on the edge of its image, no area inside it", "drop it")
    return [x1, y1, x2 - x1, y2 - y1], clipped


MIN_BOX_SIDE = 1.0
"""A box narrower or lower than this many pixels is degenerate: at the image's own resolution it
marks no object a detector could find (annotation noise, or normalised YOLO numbers taken as pixels)."""


def check_degenerate(anns: Sequence[dict], where: str) -> int:
    """How many boxes of ``anns`` are degenerate: under :data:`MIN_BOX_SIDE` pixels, or the exact
    repeat of another box of the same class on the same image (a set whose every object is
    iscrowd is refused: nothing in it is scored). A few are counted (and warned
    about by the caller); when they are most of the set, its mAP would measure them and not the
    model (20,000 such boxes passed the gate): UsageError with the counts."""
    if anns and all(a.get("iscrowd") for a in anns):
        raise UsageError(f"{where}: all {len(anns)} objects are iscrowd, which COCO's mAP ignores: the mAP is "
                         "undefined on this set", "give an eval set with objects that are not iscrowd")
    tiny = sum(1 for a in anns if min(a["bbox"][2], a["bbox"][3]) < MIN_BOX_SIDE)
    seen: set[tuple] = set()
    repeats = 0
    for a in anns:
        key = (a["image_id"], a["category_id"], *(round(v, 2) for v in a["bbox"]))
        repeats += key in seen
        seen.add(key)
    if 2 * (tiny + repeats) > len(anns):
        raise UsageError(f"{where}: {tiny} of its {len(anns)} boxes are under {MIN_BOX_SIDE:g} pixel wide or high "
                         f"and {repeats} repeat another box exactly: an mAP on this set would measure them, "
                         "not the model",
                         "fix the annotations (COCO bbox: x, y, width, height in the image's pixels; YOLO: class "
                         "cx cy w h normalised to [0, 1]) and drop the repeats")
    return tiny + repeats


def annotation(aid: int, image_id: int, cls: int, bbox: list[float], iscrowd: int = 0) -> dict[str, Any]:
    """One COCO ground-truth annotation of class index ``cls``."""
    return {"id": aid, "image_id": image_id, "category_id": cls + CATEGORY_OFFSET, "bbox": bbox,
            "area": bbox[2] * bbox[3], "iscrowd": iscrowd}


def image_files(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursively), sorted; hidden files left out."""
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
