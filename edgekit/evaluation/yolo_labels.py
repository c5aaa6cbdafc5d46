"""YOLO txt labels read into a :class:`~edgekit.evaluation.dataset.DetectionSet` (COCO form).

Layout (Ultralytics'): ``images/`` and ``labels/`` side by side, ``labels/<path>.txt`` for
``images/<path>.<ext>`` (sub-folders such as ``val/`` mirrored), one object per line:
``class cx cy w h``, the box normalised to [0, 1] by the image's width and height. An image
without a label file holds no object (a negative); a label file without its image is an error.
Class names: the ``labels`` given, else ``classes.txt`` (in the set or in ``labels/``), else
``names`` in ``data.yaml`` / ``dataset.yaml`` (a list, or a ``{id: name}`` table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.errors import UsageError, first_line
from edgekit.evaluation.labelset import (
    DetectionImage,
    DetectionSet,
    annotation,
    check_box,
    check_degenerate,
    class_map,
    image_files,
    image_size,
)


def _names_from_yaml(path: Path) -> dict[int, str] | None:
    try:
        import yaml
    except ImportError as exc:
        raise UsageError(f"reading class names from {path.name} needs PyYAML",
                         "pip install pyyaml, or put the names in classes.txt (one per line)") from exc
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read {path}: {first_line(exc)}", "fix the YAML file") from exc
    except RecursionError as exc:  # PyYAML's composer recurses once per nesting level
        raise UsageError(f"cannot read {path}: nested too deeply to be a dataset file", "fix the YAML file") from exc
    names = data.get("names") if isinstance(data, dict) else None
    # a name is a scalar: str() of a nested (or alias-multiplied) structure could be enormous
    scalar = (str, int, float)
    if isinstance(names, list) and all(isinstance(n, scalar) for n in names):
        return {i: str(n) for i, n in enumerate(names)}
    if isinstance(names, dict) and all(isinstance(k, int) and isinstance(v, scalar) for k, v in names.items()):
        return {int(k): str(v) for k, v in names.items()}
    if names is not None:
        raise UsageError(f"{path}: names is neither a list of names nor an {{id: name}} table", "fix the YAML file")
    return None


def set_names(root: Path) -> dict[int, str] | None:
    """The class names a YOLO set declares, by id (None when it declares none)."""
    for txt in (root / "classes.txt", root / "labels" / "classes.txt"):
        if txt.is_file():
            lines = [ln.strip() for ln in txt.read_text(encoding="utf-8").splitlines()]
            return {i: n for i, n in enumerate(ln for ln in lines if ln)}
    for yml in (root / "data.yaml", root / "dataset.yaml"):
        if yml.is_file():
            names = _names_from_yaml(yml)
            if names is not None:
                return names
    return None


def _class_names(root: Path, labels: list[str] | None) -> tuple[dict[int, int], list[str]]:
    names = set_names(root)
    if names is None:
        if labels is None:
            raise UsageError(f"{root}: no class names (no classes.txt, no names in data.yaml)",
                             "add classes.txt (one name per line, class 0 first) or give --labels")
        return {i: i for i in range(len(labels))}, labels
    return class_map(names, labels, str(root))


def _parse_line(line: str, where: str, cmap: dict[int, int]) -> tuple[int, list[float]]:
    parts = line.split()
    try:
        values = [float(v) for v in parts]
    except ValueError:
        values = []
    if len(parts) != 5 or len(values) != 5:
        extra = " (a segmentation polygon?)" if len(parts) > 5 else ""
        raise UsageError(f"{where}: {line.strip()[:60]!r} is not 5 numbers 'class cx cy w h'{extra}",
                         "write one object per line: class index, then the box centre and size normalised to [0, 1]")
    cls = values[0]
    if cls != int(cls) or int(cls) not in cmap:
        raise UsageError(f"{where}: class {parts[0]} is outside the labels (0 to {max(cmap, default=-1)})",
                         "use class indices of classes.txt / --labels")
    return cmap[int(cls)], values[1:]


def load_yolo(root: Path, labels: list[str] | None) -> DetectionSet:
    """Read and check a YOLO set under ``root`` (see the module doc)."""
    cmap, names = _class_names(root, labels)
    images_dir, labels_dir = root / "images", root / "labels"
    files = image_files(images_dir)
    by_label = {(labels_dir / f.relative_to(images_dir)).with_suffix(".txt"): f for f in files}
    orphans = [t for t in sorted(labels_dir.rglob("*.txt")) if t not in by_label and t.name != "classes.txt"]
    if orphans:
        raise UsageError(f"{len(orphans)} label file(s) in {labels_dir} name no image in {images_dir}: "
                         f"{', '.join(str(t.relative_to(labels_dir)) for t in orphans[:3])}",
                         "put each image in images/ under the label file's name, or remove the label file")
    if not files:
        raise UsageError(f"{images_dir} holds no images", "put the images of the set there")
    images: list[DetectionImage] = []
    anns: list[dict[str, Any]] = []
    clipped = 0
    for iid, (txt, file) in enumerate(by_label.items(), 1):
        w, h = image_size(file)
        image = DetectionImage(iid, file, w, h)
        images.append(image)
        if not txt.is_file():
            continue
        for n, line in enumerate(txt.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{txt}:{n}"
            cls, (cx, cy, bw, bh) = _parse_line(line, where, cmap)
            box = [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
            bbox, was_clipped = check_box(box, image, where)
            clipped += was_clipped
            anns.append(annotation(len(anns) + 1, iid, cls, bbox))
    if not anns:
        raise UsageError(f"{labels_dir} holds no annotations", "label at least one object (mAP needs ground truth)")
    return DetectionSet(root, "yolo", tuple(images), tuple(names), tuple(anns), clipped,
                        check_degenerate(anns, str(labels_dir)))
