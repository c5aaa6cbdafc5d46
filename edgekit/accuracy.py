"""Accuracy mode of ``edgekit bench``: top-1 of every variant on the same ImageFolder,
through the same pipeline the device runs, with the agreement between variants.

    edgekit bench dist/demo-cpu --variants all --eval data/eval
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bench import expand_variants
from edgekit.bench_report import short_runtime
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
    from edgekit.image import IMAGE_SUFFIXES

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
    """Top-1 accuracy of one variant on an ImageFolder."""

    name: str
    images: int
    unreadable: int
    accuracy: float
    per_class: dict[str, float]
    predictions: list[int]
    runtime: dict[str, Any]
    agreement: float | None = None


def evaluate(
    models: Sequence[str],
    directory: str | Path,
    variants: str = "default",
    runtime_options: dict[str, Any] | None = None,
    labels: str | None = None,
) -> list[EvalResult]:
    """Top-1 accuracy of every variant on the same images, through the same pipeline.

    ``agreement`` is the share of images where a variant's top-1 equals the first variant's.
    Unreadable or truncated images are skipped and counted.
    """
    from edgekit.camera import Frame
    from edgekit.image import ImageReadError, read_image

    out: list[EvalResult] = []
    for path, variant in expand_variants(models, variants):
        with open_model(path, variant, labels, **(runtime_options or {})) as m:
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
            names = {c: label for c, label in enumerate(m.labels)}
            per_class = {names.get(int(c), str(c)): float((p[t == c] == c).mean()) for c in np.unique(t)}
            out.append(
                EvalResult(
                    m.name, len(preds), unreadable, float((p == t).mean()), per_class, preds, m.runtime.describe()
                )
            )
    ref = out[0].predictions
    for r in out:
        if len(r.predictions) == len(ref):
            r.agreement = float(np.mean(np.array(r.predictions) == np.array(ref)))
    return out


def format_eval(results: list[EvalResult]) -> str:
    """Accuracy table with the ratio to the first variant."""
    head = f"{'variant':<28}{'runtime':<34}{'images':>8}{'top-1':>8}{'ratio':>8}{'agree':>8}"
    lines = [head, "-" * len(head)]
    ref = results[0].accuracy
    for r in results:
        ratio = r.accuracy / ref if ref else float("nan")
        agree = f"{r.agreement:.1%}" if r.agreement is not None else "n/a"
        lines.append(
            f"{r.name[:27]:<28}{short_runtime(r.runtime)[:33]:<34}{r.images:>8}{r.accuracy:>8.1%}"
            f"{ratio:>8.3f}{agree:>8}"
        )
        if r.unreadable:
            lines.append(f"  ({r.unreadable} unreadable image(s) skipped)")
    lines.append("ratio = top-1 / first variant's top-1; agree = same top-1 as the first variant")
    return "\n".join(lines)
