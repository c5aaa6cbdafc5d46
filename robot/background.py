"""Background ("nothing held up") images for training and evaluating a sign model (host side).

A closed-set softmax cannot say "nothing there": shown a plain scene, the 10-class stand-in
said "bag" at a median score of 0.99. The seed's sign model has a 27th class, background,
for this reason; this module makes that class's images from real photos that install with
packages, plus procedural clutter, and keeps the photos used for training apart from the
ones used for evaluation:

- training: Debian's ``gnome-backgrounds`` wallpapers, scikit-learn's ``load_sample_images``
  (2 photos), Matplotlib's ``grace_hopper.jpg``; whichever of them is installed.
- evaluation (held out, never trained on): scikit-image's bundled sample photos.

Every image is gray uint8, a window of a scene as the seed's centre crop would see it when
nothing is held up: random position and scale, flips, gamma, blur and noise stretch a few
photos a long way; procedural clutter and regular tilings (bricks, tiles, stripes, dots) add
what the few photos lack.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from edgekit.errors import CalibrationError
from edgekit.imaging.image import ImageReadError, read_image

WALLPAPERS = Path("/usr/share/backgrounds/gnome")  # Debian's gnome-backgrounds
# scikit-image's sample photos that ship inside the wheel (others download at run time).
HELDOUT_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "moon", "page", "text", "brick",
                  "grass", "gravel", "cell", "clock", "hubble_deep_field", "immunohistochemistry", "horse",
                  "retina", "colorwheel")
_LONGEST = 1024  # photos are shrunk to this first: crops of 4096-pixel wallpapers stay cheap


def _gray(img: np.ndarray) -> np.ndarray:
    if img.ndim == 3:
        img = cv2.cvtColor(img[..., :3], cv2.COLOR_RGB2GRAY)
    img = img.astype(np.uint8) if img.dtype == np.uint8 else cv2.normalize(img, None, 0, 255, cv2.NORM_MINMAX)
    scale = _LONGEST / max(img.shape[:2])
    if scale < 1:
        img = cv2.resize(img, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(img.astype(np.uint8))


def training_photos() -> dict[str, np.ndarray]:
    """The training photos that are installed here, by name (gray uint8).

    Raises CalibrationError when none is: ``apt install gnome-backgrounds`` or
    ``pip install scikit-learn`` gives some.
    """
    photos: dict[str, np.ndarray] = {}
    for path in sorted(WALLPAPERS.glob("*.webp")) + sorted(WALLPAPERS.glob("*.jpg")):
        try:
            photos[f"gnome:{path.stem}"] = _gray(read_image(path))
        except ImageReadError:
            continue
    try:
        from sklearn.datasets import load_sample_images

        sample = load_sample_images()
        for name, img in zip(sample.filenames, sample.images, strict=True):
            photos[f"sklearn:{Path(name).stem}"] = _gray(img)
    except ImportError:
        pass
    try:
        from matplotlib import cbook

        with cbook.get_sample_data("grace_hopper.jpg") as f:
            raw = np.frombuffer(f.read(), np.uint8)
        photos["matplotlib:grace_hopper"] = _gray(cv2.imdecode(raw, cv2.IMREAD_GRAYSCALE))
    except (ImportError, OSError, ValueError):
        pass
    if not photos:
        raise CalibrationError("no background photos installed for training",
                               "apt install gnome-backgrounds, or pip install scikit-learn")
    return photos


def heldout_photos() -> dict[str, np.ndarray]:
    """scikit-image's bundled sample photos (gray uint8): for evaluation only, never for training."""
    from skimage import data

    photos = {}
    for name in HELDOUT_PHOTOS:
        try:
            photos[f"skimage:{name}"] = _gray(getattr(data, name)())
        except Exception:  # noqa: S112, BLE001 - a photo that needs a download here is skipped
            continue
    return photos


def scene_crop(photo: np.ndarray, rng: np.random.Generator, size: int = 96) -> np.ndarray:
    """A random square window of ``photo`` (side 12-100 % of its shorter edge) at ``size``, jittered."""
    h, w = photo.shape[:2]
    side = int(min(h, w) * rng.uniform(0.12, 1.0))
    top, left = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
    img = cv2.resize(photo[top : top + side, left : left + side], (size, size), interpolation=cv2.INTER_AREA)
    return jitter(img, rng)


def jitter(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Flips, a gamma/contrast change, sometimes blur and sensor noise: one photo, many scenes."""
    if rng.random() < 0.5:
        img = img[:, ::-1]
    if rng.random() < 0.3:
        img = img[::-1]
    x = img.astype(np.float32) / 255.0
    x = x ** rng.uniform(0.5, 2.0)
    x = (x - 0.5) * rng.uniform(0.6, 1.4) + 0.5 + rng.uniform(-0.2, 0.2)
    out = np.clip(x * 255.0, 0, 255).astype(np.uint8)
    if rng.random() < 0.3:
        out = cv2.GaussianBlur(out, (0, 0), rng.uniform(0.5, 2.5))
    if rng.random() < 0.3:
        noise = rng.normal(0, rng.uniform(2, 10), out.shape)
        out = np.clip(out + noise, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(out)


def clutter(rng: np.random.Generator, size: int = 96) -> np.ndarray:
    """Procedural clutter: a gradient with random lines, boxes, ellipses and text (no centred object)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    a, b, c = rng.uniform(-1, 1, 3)
    img = np.clip((a * xx + b * yy + c) * 127 + 128, 0, 255).astype(np.uint8)
    for _ in range(rng.integers(3, 15)):
        colour = int(rng.integers(0, 256))
        p1 = tuple(int(v) for v in rng.integers(-size // 4, size + size // 4, 2))
        p2 = tuple(int(v) for v in rng.integers(-size // 4, size + size // 4, 2))
        kind = rng.integers(0, 4)
        if kind == 0:
            cv2.line(img, p1, p2, colour, int(rng.integers(1, 6)))
        elif kind == 1:
            cv2.rectangle(img, p1, p2, colour, int(rng.choice([-1, 1, 2, 3])))
        elif kind == 2:
            axes = tuple(int(v) for v in rng.integers(3, size // 2, 2))
            cv2.ellipse(img, p1, axes, float(rng.uniform(0, 180)), 0, 360, colour, int(rng.choice([-1, 1, 2])))
        else:
            cv2.putText(img, str(rng.integers(0, 10**4)), p1, cv2.FONT_HERSHEY_SIMPLEX, rng.uniform(0.3, 1.5),
                        colour, int(rng.integers(1, 3)))
    return jitter(img, rng)


def tiling(rng: np.random.Generator, size: int = 96) -> np.ndarray:
    """A regular man-made texture (bricks, tiles, stripes, a lattice of dots) at a random scale and
    angle: walls and floors are what a robot's camera sees most, and a periodic pattern is what a
    garment classifier most readily takes for fabric."""
    big = size * 2
    cell = int(rng.integers(4, 36))
    mortar = int(rng.integers(1, max(2, cell // 4)))
    fg, bg = (int(v) for v in rng.integers(0, 256, 2))
    img = np.full((big, big), bg, np.uint8)
    kind = rng.integers(0, 4)
    for row, y in enumerate(range(0, big, cell)):
        if kind == 0:  # bricks: rows of blocks, every other row offset by half a block
            width = 2 * cell
            for x in range(-(row % 2) * cell, big, width):
                cv2.rectangle(img, (x + mortar, y + mortar), (x + width - mortar, y + cell - mortar), fg, -1)
        elif kind == 1:  # square tiles
            for x in range(0, big, cell):
                cv2.rectangle(img, (x + mortar, y + mortar), (x + cell - mortar, y + cell - mortar), fg, -1)
        elif kind == 2:  # stripes
            cv2.rectangle(img, (0, y), (big, y + max(1, cell // 2)), fg, -1)
        else:  # dots
            for x in range(0, big, cell):
                cv2.circle(img, (x + cell // 2, y + cell // 2), max(1, cell // 3), fg, -1)
    turn = cv2.getRotationMatrix2D((big / 2, big / 2), float(rng.uniform(0, 180)), float(rng.uniform(1.0, 1.5)))
    img = cv2.warpAffine(img, turn, (big, big), borderMode=cv2.BORDER_REFLECT)
    img = cv2.resize(img[size // 2 : size // 2 + size, size // 2 : size // 2 + size], (size, size))
    return jitter(img, rng)


def background_images(n: int, photos: dict[str, np.ndarray], rng: np.random.Generator, size: int = 96,
                      clutter_share: float = 0.25) -> list[np.ndarray]:
    """``n`` background images: scene crops of ``photos`` (round robin) and a share of clutter
    (half of it random shapes, half regular tilings)."""
    ordered = [photos[name] for name in sorted(photos)]
    out = []
    for i in range(n):
        if not ordered or rng.random() < clutter_share:
            out.append(clutter(rng, size) if rng.random() < 0.5 else tiling(rng, size))
        else:
            out.append(scene_crop(ordered[i % len(ordered)], rng, size))
    return out


def camera_frame(photo: np.ndarray, rng: np.random.Generator, size: tuple[int, int] = (640, 360)) -> np.ndarray:
    """A camera-like ``size`` (w, h) frame: a random 16:9 window (60-100 % of the height) of ``photo``."""
    h, w = photo.shape[:2]
    ch = int(h * rng.uniform(0.6, 1.0))
    cw = int(min(w, ch * size[0] / size[1]))
    top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    return cv2.resize(photo[top : top + ch, left : left + cw], size, interpolation=cv2.INTER_AREA)


def hold_up(frame: np.ndarray, item: np.ndarray, size: int = 200) -> np.ndarray:
    """``frame`` with ``item`` (a Fashion-MNIST image: light on black) filling the centre window,
    as if held up to the camera."""
    out = frame.copy()
    h, w = out.shape[:2]
    top, left = (h - size) // 2, (w - size) // 2
    big = cv2.resize(item, (size, size), interpolation=cv2.INTER_LINEAR)
    out[top : top + size, left : left + size] = big if out.ndim == 2 else cv2.cvtColor(big, cv2.COLOR_GRAY2BGR)
    return out
