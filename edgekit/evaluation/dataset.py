"""Detection eval sets: images with boxes, from COCO JSON or YOLO txt labels, checked and held
in one form (COCO's, category id = class index + 1) that :mod:`edgekit.evaluation.evaluate` scores.

    set = load_detection_set("eval/detect", labels=["cat", "dog"])
    set.images[0].path, set.images[0].width, set.annotation_count, set.coco_gt()

Accepted layouts (``path``):

- a COCO ``.json`` file, or a directory holding ``annotations.json`` (else one
  ``instances*.json``); image ``file_name`` s are looked up beside the JSON, then in ``images/``;
- a YOLO directory: ``images/`` and ``labels/`` side by side, one ``labels/<image stem>.txt``
  per image (same sub-folders) with lines ``class cx cy w h`` normalised to [0, 1]; an image
  without a label file holds no object. Class names come from the ``labels`` given, else
  ``classes.txt`` (beside images/ or in labels/), else ``names`` in ``data.yaml``.

Everything read is checked, and each problem is one line (UsageError): annotations naming
images that are not there, no annotation at all, categories or class ids outside the labels,
boxes outside their image, unreadable JSON, YOLO lines that are not five numbers, an image
whose file size disagrees with the annotated width/height. A box may pass the image edge by
:data:`EDGE_TOLERANCE` (annotation tools round; the excess is clipped off); beyond that it is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import edgekit.util.userjson as userjson
from edgekit.errors import UsageError
from edgekit.evaluation.labelset import (
    DetectionImage,
    DetectionSet,
    annotation,
    check_box,
    check_degenerate,
    class_map,
    image_size,
    safe_relative,
)
from edgekit.evaluation.yolo_labels import load_yolo

__all__ = ["DetectionImage", "DetectionSet", "is_detection_set", "load_detection_set"]


def is_detection_set(path: str | Path) -> bool:
    """Whether ``path`` looks like a detection set (COCO JSON or images/ + labels/), not an ImageFolder."""
    p = Path(path)
    if p.is_file():
        return p.suffix.lower() == ".json"
    return p.is_dir() and (_coco_file(p, strict=False) is not None
                           or ((p / "images").is_dir() and (p / "labels").is_dir()))


def load_detection_set(path: str | Path, labels: Sequence[str] | None = None) -> DetectionSet:
    """Load and check a COCO or YOLO detection set (see the module doc); ``labels`` are the
    model's class names in order (categories are matched to them by name), else the set's own."""
    p = Path(path)
    labels = [str(x) for x in labels] if labels else None
    if p.is_file():
        if p.suffix.lower() != ".json":
            raise UsageError(f"detection set {p} is not a COCO .json file",
                             "give a COCO annotations .json, or a folder with annotations.json or images/ + labels/")
        return _load_coco(p, labels)
    if not p.is_dir():
        raise UsageError(f"detection set {p} does not exist",
                         "give a folder with annotations.json or images/ + labels/")
    found = _coco_file(p, strict=True)
    if found is not None:
        return _load_coco(found, labels)
    if (p / "images").is_dir() and (p / "labels").is_dir():
        return load_yolo(p, labels)
    raise UsageError(f"{p} holds no detection annotations (no annotations.json, instances*.json, "
                     "or images/ + labels/ folders)",
                     "give COCO annotations.json beside the images, or YOLO images/ and labels/ folders")


def _coco_file(folder: Path, strict: bool) -> Path | None:
    if (folder / "annotations.json").is_file():
        return folder / "annotations.json"
    found = sorted(folder.glob("instances*.json")) + sorted(folder.glob("annotations/instances*.json"))
    if len(found) > 1 and strict:
        raise UsageError(f"{folder} holds {len(found)} annotation files ({', '.join(f.name for f in found[:4])})",
                         "give the one to use as the path (--eval FILE.json)")
    return found[0] if found else None


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", "give a UTF-8 COCO annotations file") from exc
    if not text.strip():
        raise UsageError(f"{path} is empty: no annotations", "give a COCO file with images, annotations, categories")
    try:
        return userjson.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})",
                         "fix or re-export the annotations file") from exc


def _list(data: dict, key: str, path: Path) -> list:
    value = data.get(key)
    if not isinstance(value, list):
        raise UsageError(f"{path}: '{key}' is missing or not a list", "give a COCO detection file "
                         "(images, annotations, categories)")
    return value


def _int(value: Any, what: str, path: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise UsageError(f"{path}: {what} {value!r} is not a whole number", "fix the annotations file")
    return int(value)


def _categories(data: dict, path: Path, labels: list[str] | None) -> tuple[dict[int, int], list[str]]:
    names: dict[int, str] = {}
    for c in _list(data, "categories", path):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise UsageError(f"{path}: category {c!r} has no name", "give each category an id and a name")
        cid = _int(c.get("id"), "category id", path)
        if cid in names:
            raise UsageError(f"{path}: category id {cid} appears twice", "give each category its own id")
        names[cid] = c["name"]
    if not names:
        raise UsageError(f"{path} has no categories", "list the classes under 'categories'")
    return class_map(names, labels, str(path))


def _images(data: dict, path: Path) -> dict[int, DetectionImage]:
    folder = path.parent
    out: dict[int, DetectionImage] = {}
    missing = []
    for entry in _list(data, "images", path):
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: image entry {entry!r} is not an object", "fix the annotations file")
        iid = _int(entry.get("id"), "image id", path)
        if iid in out:
            raise UsageError(f"{path}: image id {iid} appears twice", "give each image its own id")
        rel = safe_relative(entry.get("file_name"), str(path))
        file = next((c for c in (folder / rel, folder / "images" / rel, folder / "images" / rel.name) if c.is_file()),
                    None)
        if file is None:
            missing.append(str(rel))
            continue
        w, h = image_size(file)
        for key, real in (("width", w), ("height", h)):
            if entry.get(key) is not None and _int(entry[key], f"image {iid} {key}", path) != real:
                raise UsageError(f"{path}: image {rel} is annotated as {entry.get('width')}x{entry.get('height')} "
                                 f"but the file is {w}x{h}", "annotate the images as they are (resized after "
                                 "annotation?)")
        out[iid] = DetectionImage(iid, file, w, h)
    if missing:
        raise UsageError(f"{path} names {len(missing)} image(s) that are not there: {', '.join(missing[:3])}"
                         f"{', ...' if len(missing) > 3 else ''} (looked in {folder} and {folder / 'images'})",
                         "put the images beside the annotations file or in images/, or remove their entries")
    return out


def _load_coco(path: Path, labels: list[str] | None) -> DetectionSet:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a COCO annotations object", "give images, annotations and categories")
    cmap, names = _categories(data, path, labels)
    images = _images(data, path)
    raw = _list(data, "annotations", path)
    if not raw:
        raise UsageError(f"{path} holds no annotations", "annotate at least one object (mAP needs ground truth)")
    anns, clipped = [], 0
    for n, a in enumerate(raw, 1):
        where = f"{path} annotation {a.get('id', n) if isinstance(a, dict) else n}"
        if not isinstance(a, dict):
            raise UsageError(f"{where} is not an object", "fix the annotations file")
        iid = _int(a.get("image_id"), "image_id", path)
        if iid not in images:
            raise UsageError(f"{where} names image id {iid}, which is not among the images", "fix the image_id")
        cid = _int(a.get("category_id"), "category_id", path)
        if cid not in cmap:
            raise UsageError(f"{where} has category_id {cid}, outside the categories ({', '.join(map(str, cmap))})",
                             "use a category id listed under 'categories'")
        bbox, was_clipped = check_box(a.get("bbox"), images[iid], where)
        clipped += was_clipped
        anns.append(annotation(n, iid, cmap[cid], bbox, 1 if a.get("iscrowd") else 0))
    return DetectionSet(path.parent, "coco", tuple(images[i] for i in sorted(images)), tuple(names),
                        tuple(anns), clipped, check_degenerate(anns, str(path)))
