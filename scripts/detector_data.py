"""The bundled demo detector's synthetic data: shapes composited onto real photos, made offline.

Four classes (:data:`CLASSES`: circle, triangle, square, star) are drawn at random positions,
scales, rotations and aspect ratios onto real photos that install with the project's packages
(scikit-image's bundled sample photos, scikit-learn's ``load_sample_images``, Matplotlib's
``grace_hopper.jpg``), nothing downloaded. What keeps the task from being trivial: fills that
are flat colours, lighting gradients, stripes or a patch of another photo (so colour never
tells the class), outlines, drop shadows, partial occlusion by later shapes, unlabelled
distractor strokes, then global gamma, blur and sensor noise.

Boxes are COCO's: ``[x, y, w, h]`` in pixels around the *visible* part of each shape (an
object hidden more than :data:`MAX_HIDDEN` by later ones is never placed). Everything is
deterministic: image ``i`` of a set with seed ``s`` is drawn from ``default_rng([s, i])``.

The photos are split: the training photos (:data:`TRAIN_PHOTOS`) are never backgrounds or
fills in the committed evaluation set (:data:`EVAL_PHOTOS`), so eval measures unseen scenes.

``python -m scripts.detector_data`` (run by ``make detector``) rewrites ``eval/detect/``
(COCO ``annotations.json`` + JPEGs) and ``calib/detect/`` (unlabelled JPEGs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("circle", "triangle", "square", "star")
TRAIN_PHOTOS = ("skimage:brick", "skimage:grass", "skimage:gravel", "skimage:coins", "skimage:moon",
                "skimage:page", "skimage:text", "skimage:cell", "skimage:colorwheel", "sklearn:china",
                "sklearn:flower", "matplotlib:grace_hopper")
EVAL_PHOTOS = ("skimage:astronaut", "skimage:coffee", "skimage:chelsea", "skimage:rocket", "skimage:camera",
               "skimage:clock", "skimage:hubble_deep_field", "skimage:immunohistochemistry", "skimage:retina")
SIZES = ((320, 240), (320, 240), (320, 240), (240, 320), (256, 256), (320, 180))
"""Scene sizes (width, height) drawn from: mostly 4:3, some portrait, square and 16:9, so the
letterbox of the model's preprocessing is exercised both ways."""
MIN_SIDE, MAX_SIDE = 24, 0.5  # object size: >= 24 px, <= half the scene's shorter side
MAX_HIDDEN = 0.45  # an object may lose at most this share of its pixels to later ones
EVAL_SEED, CALIB_SEED, TRAIN_SEED = 13, 14, 1000
JPEG_QUALITY = 75
CALIB_QUALITY = 65  # calibration only sets value ranges: smaller files


@dataclass(frozen=True)
class Scene:
    """One generated image (BGR uint8) and its objects: ``boxes`` ``[M, 4]`` COCO ``x, y, w, h``
    pixels of the visible part, ``classes`` ``[M]`` indices into :data:`CLASSES`, ``areas`` visible pixels."""

    image: np.ndarray
    boxes: np.ndarray
    classes: np.ndarray
    areas: np.ndarray


def _bgr(img: np.ndarray) -> np.ndarray:
    if img.dtype != np.uint8:
        img = (np.asarray(img, np.float32) * 255).clip(0, 255).astype(np.uint8)
    if img.ndim == 2:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    return cv2.cvtColor(np.ascontiguousarray(img[..., :3]), cv2.COLOR_RGB2BGR)


def _load_photo(name: str) -> np.ndarray | None:
    source, _, item = name.partition(":")
    try:
        if source == "skimage":
            from skimage import data

            return _bgr(getattr(data, item)())
        if source == "sklearn":
            from sklearn.datasets import load_sample_images

            sample = load_sample_images()
            for path, img in zip(sample.filenames, sample.images, strict=True):
                if Path(path).stem == item:
                    return _bgr(img)
            return None
        if source == "matplotlib":
            from matplotlib import cbook

            with cbook.get_sample_data(f"{item}.jpg") as f:
                raw = np.frombuffer(f.read(), np.uint8)
            return cv2.imdecode(raw, cv2.IMREAD_COLOR)
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    return None


@lru_cache(maxsize=4)
def photos(names: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """The named photos that are installed here (BGR uint8, longest side <= 640), in order."""
    out = []
    for name in names:
        img = _load_photo(name)
        if img is None:
            continue
        scale = 640 / max(img.shape[:2])
        if scale < 1:
            img = cv2.resize(img, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
        out.append(np.ascontiguousarray(img))
    if not out:
        raise SystemExit("no background photo is installed: pip install scikit-image scikit-learn")
    return tuple(out)


def _crop(photo: np.ndarray, rng: np.random.Generator, w: int, h: int, least: float = 0.3) -> np.ndarray:
    """A random window of ``photo`` with the aspect of ``w x h`` (``least``-100 % of what fits), resized."""
    ph, pw = photo.shape[:2]
    fit = min(ph / h, pw / w)
    scale = fit * rng.uniform(least, 1.0)
    ch, cw = max(2, int(h * scale)), max(2, int(w * scale))
    top, left = int(rng.integers(0, ph - ch + 1)), int(rng.integers(0, pw - cw + 1))
    out = cv2.resize(photo[top : top + ch, left : left + cw], (w, h), interpolation=cv2.INTER_AREA)
    if rng.random() < 0.5:
        out = out[:, ::-1]
    return np.ascontiguousarray(out)


def _tiling(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """A man-made colour texture (tiles, stripes, dots) at a random scale and angle."""
    big = 2 * max(w, h)
    cell = int(rng.integers(6, 40))
    fg, bg = (tuple(int(v) for v in rng.integers(0, 256, 3)) for _ in range(2))
    img = np.empty((big, big, 3), np.uint8)
    img[:] = bg
    kind = rng.integers(0, 3)
    for y in range(0, big, cell):
        if kind == 1:
            cv2.rectangle(img, (0, y), (big, y + max(1, cell // 2)), fg, -1)
            continue
        for x in range(0, big, cell):
            if kind == 0:
                cv2.rectangle(img, (x + 1, y + 1), (x + cell - 2, y + cell - 2), fg, -1)
            else:
                cv2.circle(img, (x + cell // 2, y + cell // 2), max(1, cell // 3), fg, -1)
    turn = cv2.getRotationMatrix2D((big / 2, big / 2), float(rng.uniform(0, 180)), 1.0)
    img = cv2.warpAffine(img, turn, (big, big), borderMode=cv2.BORDER_REFLECT)
    return np.ascontiguousarray(img[(big - h) // 2 : (big - h) // 2 + h, (big - w) // 2 : (big - w) // 2 + w])


def _background(rng: np.random.Generator, pool: tuple[np.ndarray, ...], w: int, h: int) -> np.ndarray:
    tiles = rng.random() < 0.12
    base = _tiling(rng, w, h) if tiles else _crop(pool[int(rng.integers(len(pool)))], rng, w, h)
    if rng.random() < 0.2:  # two scenes blended: busier backgrounds
        other = _crop(pool[int(rng.integers(len(pool)))], rng, w, h)
        base = cv2.addWeighted(base, 0.6, other, 0.4, 0)
    return base


def outline(cls: int, size: float, aspect: float, angle: float, rng: np.random.Generator) -> np.ndarray:
    """The polygon ``[K, 2]`` (float, centred on 0) of a class-``cls`` shape whose larger side is ~``size``."""
    r = size / 2
    if cls == 0:  # circle (an ellipse once the aspect is applied)
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        pts = np.stack([np.cos(t), np.sin(t)], 1) * r
    elif cls == 1:  # triangle, corners jittered a little
        t = np.pi / 2 + np.array([0, 2, 4]) * np.pi / 3 + rng.uniform(-0.15, 0.15, 3)
        pts = np.stack([np.cos(t), np.sin(t)], 1) * r
    elif cls == 2:  # square
        pts = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float64) * r * 0.75
    else:  # five-pointed star
        inner = rng.uniform(0.38, 0.55)
        t = np.pi / 2 + np.arange(10) * np.pi / 5
        pts = np.stack([np.cos(t), np.sin(t)], 1) * r * np.where(np.arange(10) % 2, inner, 1.0)[:, None]
    pts = pts * np.array([aspect, 1.0 / aspect])
    c, s = np.cos(angle), np.sin(angle)
    return pts @ np.array([[c, -s], [s, c]]).T


def _fill(rng: np.random.Generator, pool: tuple[np.ndarray, ...], w: int, h: int) -> np.ndarray:
    """The paint of one shape (BGR float32 0-255): flat, a gradient, stripes, or a patch of a photo."""
    kind = rng.choice(4, p=[0.35, 0.25, 0.15, 0.25])
    c1 = rng.uniform(0, 255, 3)
    if kind == 0:
        return np.broadcast_to(c1, (h, w, 3)).astype(np.float32)
    if kind == 1:
        c2 = rng.uniform(0, 255, 3)
        t = np.linspace(0, 1, w)[None, :, None] * np.ones((h, 1, 1))
        if rng.random() < 0.5:
            t = np.linspace(0, 1, h)[:, None, None] * np.ones((1, w, 1))
        return (c1 * (1 - t) + c2 * t).astype(np.float32)
    if kind == 2:
        return _tiling(rng, w, h).astype(np.float32)
    tint = rng.uniform(0.6, 1.3, 3)
    return np.clip(_crop(pool[int(rng.integers(len(pool)))], rng, w, h, 0.1) * tint, 0, 255).astype(np.float32)


def _mask(pts: np.ndarray, w: int, h: int) -> np.ndarray:
    """Anti-aliased coverage (float32 0-1) of polygon ``pts`` (pixels) in a ``w x h`` image."""
    m = np.zeros((h, w), np.uint8)
    cv2.fillPoly(m, [np.round(pts * 16).astype(np.int32)], 255, cv2.LINE_AA, shift=4)
    return m.astype(np.float32) / 255.0


def _distractor(img: np.ndarray, rng: np.random.Generator) -> None:
    """An unlabelled stroke (a line or an open arc): edges that are no object."""
    h, w = img.shape[:2]
    colour = tuple(float(v) for v in rng.uniform(0, 255, 3))
    p1 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
    if rng.random() < 0.5:
        p2 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        cv2.line(img, p1, p2, colour, int(rng.integers(1, 5)), cv2.LINE_AA)
    else:
        axes = (int(rng.integers(8, w // 3)), int(rng.integers(8, h // 3)))
        start = float(rng.uniform(0, 360))
        cv2.ellipse(img, p1, axes, float(rng.uniform(0, 180)), start, start + float(rng.uniform(60, 200)), colour,
                    int(rng.integers(1, 5)), cv2.LINE_AA)


def _place(img: np.ndarray, owner: np.ndarray, full: list[int], rng: np.random.Generator,
           pool: tuple[np.ndarray, ...]) -> int | None:
    """Draw one random shape into ``img`` (float32) where no earlier one (``full``: their whole
    areas) loses more than :data:`MAX_HIDDEN` of itself; the shape's class, or None when no such
    place was found."""
    index = len(full)
    h, w = owner.shape
    cls = int(rng.integers(len(CLASSES)))
    top_size = max(MIN_SIDE + 1, MAX_SIDE * min(w, h))
    size = float(np.exp(rng.uniform(np.log(MIN_SIDE), np.log(top_size))))
    aspect = float(np.exp(rng.uniform(-0.2, 0.2)))
    pts = outline(cls, size, aspect, float(rng.uniform(0, 2 * np.pi)), rng)
    lo, hi = pts.min(0), pts.max(0)
    for _ in range(8):
        centre = rng.uniform(-lo, np.array([w, h]) - hi)
        # work in the shape's window (plus room for its shadow): full-frame passes cost 10x more
        x0, y0 = (int(v) for v in np.maximum(np.floor(centre + lo) - 12, 0))
        x1, y1 = (int(v) for v in np.minimum(np.ceil(centre + hi) + 12, [w, h]))
        mask = _mask(pts + centre - [x0, y0], x1 - x0, y1 - y0)
        solid = mask > 0.5
        taken = owner[y0:y1, x0:x1][solid]
        visible = np.bincount(owner[owner >= 0], minlength=index) - np.bincount(taken[taken >= 0], minlength=index)
        if np.all(visible >= (1 - MAX_HIDDEN) * np.asarray(full[:index], np.float64)):
            break
    else:
        return None
    win = img[y0:y1, x0:x1]
    ww, wh = x1 - x0, y1 - y0
    if rng.random() < 0.5:  # drop shadow: the shape's blurred silhouette, offset, darkens what is below
        shift = np.float32([[1, 0, rng.uniform(-6, 6)], [0, 1, rng.uniform(2, 8)]])
        shadow = cv2.GaussianBlur(cv2.warpAffine(mask, shift, (ww, wh)), (0, 0), rng.uniform(1.5, 4))
        win *= (1 - rng.uniform(0.25, 0.6) * shadow)[..., None]
    paint = _fill(rng, pool, ww, wh)
    light = 1 + rng.uniform(-0.35, 0.35) * (np.linspace(-1, 1, ww)[None, :] * np.ones((wh, 1)))
    paint = paint * light[..., None].astype(np.float32)
    win[:] = win * (1 - mask[..., None]) + paint * mask[..., None]
    if rng.random() < 0.35:  # an outline in a contrasting colour
        ring = np.zeros((wh, ww), np.uint8)
        cv2.polylines(ring, [np.round((pts + centre - [x0, y0]) * 16).astype(np.int32)], True, 255,
                      int(rng.integers(1, 3)), cv2.LINE_AA, shift=4)
        a = ring.astype(np.float32)[..., None] / 255
        win[:] = win * (1 - a) + rng.uniform(0, 255, 3).astype(np.float32) * a
    owner[y0:y1, x0:x1][solid] = index
    full.append(int(solid.sum()))
    return cls


def scene(rng: np.random.Generator, pool: tuple[np.ndarray, ...], size: tuple[int, int] | None = None,
          max_objects: int = 6) -> Scene:
    """One composited image and its visible-part boxes."""
    w, h = size or SIZES[int(rng.integers(len(SIZES)))]
    img = _background(rng, pool, w, h).astype(np.float32)
    owner = np.full((h, w), -1, np.int32)
    full: list[int] = []  # whole area of each placed shape (its owner index)
    placed: list[tuple[int, int]] = []  # (owner index, class)
    n = int(rng.integers(0, max_objects + 1)) if rng.random() < 0.08 else int(rng.integers(1, max_objects + 1))
    for _ in range(n):
        cls = _place(img, owner, full, rng, pool)
        if cls is not None:
            placed.append((len(full) - 1, cls))
    for _ in range(int(rng.integers(0, 3))):
        _distractor(img, rng)
    img = _finish(img, rng)
    boxes, classes, areas = [], [], []
    for index, cls in placed:
        ys, xs = np.nonzero(owner == index)
        if len(xs) == 0:
            continue
        boxes.append([xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()])
        classes.append(cls)
        areas.append(len(xs))
    return Scene(img, np.array(boxes, np.float32).reshape(-1, 4), np.array(classes, np.int64),
                 np.array(areas, np.float32))


def _finish(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Scene-wide lighting and camera: colour cast, gamma, contrast, blur, noise -> uint8."""
    x = np.clip(img, 0, 255) / 255.0
    x = x * rng.uniform(0.85, 1.15, 3).astype(np.float32)
    x = np.clip(x, 0, 1) ** rng.uniform(0.7, 1.4)
    x = (x - 0.5) * rng.uniform(0.7, 1.2) + 0.5 + rng.uniform(-0.12, 0.12)
    out = np.clip(x * 255, 0, 255).astype(np.uint8)
    if rng.random() < 0.3:
        out = cv2.GaussianBlur(out, (0, 0), rng.uniform(0.5, 1.3))
    if rng.random() < 0.4:
        out = np.clip(out + rng.normal(0, rng.uniform(2, 8), out.shape), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(out)


def scenes(seed: int, count: int, names: tuple[str, ...], start: int = 0) -> Iterator[Scene]:
    """Scenes ``start .. start+count-1`` of the set with ``seed`` (each from ``default_rng([seed, i])``)."""
    pool = photos(names)
    for i in range(start, start + count):
        yield scene(np.random.default_rng([seed, i]), pool)


def coco(items: list[tuple[str, Scene]]) -> dict:
    """COCO detection annotations for ``(file_name, scene)`` pairs (ids from 1)."""
    images, annotations = [], []
    for image_id, (name, sc) in enumerate(items, start=1):
        h, w = sc.image.shape[:2]
        images.append({"id": image_id, "file_name": name, "width": w, "height": h})
        for box, cls, area in zip(sc.boxes, sc.classes, sc.areas, strict=True):
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": int(cls) + 1,
                                "bbox": [float(v) for v in box], "area": float(area), "iscrowd": 0})
    categories = [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(CLASSES)]
    return {"info": {"description": "edgekit demo detector: shapes on real photos (scripts/detector_data.py)"},
            "images": images, "annotations": annotations, "categories": categories}


def _write_images(dest: Path, items: list[tuple[str, Scene]], quality: int = JPEG_QUALITY) -> None:
    for name, sc in items:
        if not cv2.imwrite(str(dest / name), sc.image, [cv2.IMWRITE_JPEG_QUALITY, quality]):
            raise SystemExit(f"cannot write {dest / name}")


def _replace_dir(tmp: Path, dest: Path) -> None:
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def write_eval(dest: Path, count: int = 100, seed: int = EVAL_SEED) -> Path:
    """``dest``/annotations.json + ``dest``/NNN.jpg: the labelled evaluation set (held-out photos)."""
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    items = [(f"{i:03d}.jpg", sc) for i, sc in enumerate(scenes(seed, count, EVAL_PHOTOS))]
    _write_images(tmp, items)
    (tmp / "annotations.json").write_text(json.dumps(coco(items), indent=1) + "\n")
    _replace_dir(tmp, dest)
    return dest


def write_calib(dest: Path, count: int = 150, seed: int = CALIB_SEED) -> Path:
    """``dest``/NNN.jpg: unlabelled calibration scenes on every photo (calibration only sets ranges)."""
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    items = [(f"{i:03d}.jpg", sc) for i, sc in enumerate(scenes(seed, count, TRAIN_PHOTOS + EVAL_PHOTOS))]
    _write_images(tmp, items, CALIB_QUALITY)
    _replace_dir(tmp, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    """``python -m scripts.detector_data [--eval N] [--calib N]``: rewrite eval/detect and calib/detect."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", type=int, default=100, help="evaluation images (default 100)")
    ap.add_argument("--calib", type=int, default=150, help="calibration images (default 150)")
    ap.add_argument("--root", type=Path, default=ROOT, help="where eval/ and calib/ are (default: the checkout)")
    args = ap.parse_args(argv)
    print(write_eval(args.root / "eval" / "detect", args.eval))
    print(write_calib(args.root / "calib" / "detect", args.calib))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
