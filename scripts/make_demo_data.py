"""Make the bundled demo's image sets (run by ``make data``; the outputs are committed).

- calib/fashion/: 400 Fashion-MNIST training images (28x28 gray png), seed 0.
- calib/frames/: 64 camera-like 640x360 frames made from scikit-image's bundled photos, some
  with a demo object in the centre window, so int8 calibration also sees what a camera sends
  (calibration only sets value ranges; no training image comes from these photos).
- eval/fashion/<class>/: 50 Fashion-MNIST test (t10k) images per class, disjoint from calib.
- eval/fashion/background/: 50 centre windows (200x200) of camera-like frames cut from
  scikit-image's sample photos, which no training or calibration image comes from.

Sources: Fashion-MNIST (Zalando, MIT licence) from Debian's dataset-fashion-mnist; photos
from scikit-image's data module (public domain / CC0, see skimage.data docs). The photos the
model's background class is trained on (robot.background.training_photos) are not copied here.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import cv2
import numpy as np

from robot.background import camera_frame, heldout_photos
from robot.datasets import FASHION_CLASSES, load_fashion

EVAL_BACKGROUND = 50

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "moon", "page", "text", "brick",
          "grass", "gravel", "cell", "clock", "hubble_deep_field", "immunohistochemistry")


def photo_frames(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n`` 640x360 BGR frames cut and scaled from scikit-image's bundled photos."""
    from skimage import data

    photos = []
    for name in PHOTOS:
        try:
            img = getattr(data, name)()
        except Exception:  # noqa: S112 - some images need optional downloads: skip them
            continue
        code = cv2.COLOR_GRAY2BGR if img.ndim == 2 else cv2.COLOR_RGB2BGR
        img = cv2.cvtColor(img if img.ndim == 2 else img[..., :3], code)
        photos.append(img.astype(np.uint8))
    frames = []
    for i in range(n):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        scale = rng.uniform(0.6, 1.0)
        ch, cw = int(h * scale), int(min(w, h * scale * 16 / 9))
        top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        frames.append(cv2.resize(img[top : top + ch, left : left + cw], (640, 360), interpolation=cv2.INTER_AREA))
    return frames


def paste_object(frame: np.ndarray, item: np.ndarray, size: int = 200) -> np.ndarray:
    """Put a Fashion-MNIST item (light on black) into the centre window, as if held up to the camera."""
    out = frame.copy()
    h, w = out.shape[:2]
    top, left = (h - size) // 2, (w - size) // 2
    big = cv2.resize(item, (size, size), interpolation=cv2.INTER_LINEAR)
    out[top : top + size, left : left + size] = cv2.cvtColor(big, cv2.COLOR_GRAY2BGR)
    return out




def write_eval(root: Path, test_x: np.ndarray, test_y: np.ndarray) -> Path:
    """eval/fashion/<class>/: 50 test items per class."""
    ev = root / "eval" / "fashion"
    shutil.rmtree(ev, ignore_errors=True)
    for c, name in enumerate(FASHION_CLASSES):
        (ev / name).mkdir(parents=True)
        for i in np.flatnonzero(test_y == c)[:50]:
            cv2.imwrite(str(ev / name / f"t10k_{i:05d}.png"), test_x[i])
    return ev


def write_background(ev: Path, rng: np.random.Generator) -> None:
    """eval/fashion/background/: the seed's centre 200x200 window of held-out camera-like frames."""
    (ev / "background").mkdir(exist_ok=True)
    photos = heldout_photos()
    names = sorted(photos)
    for i in range(EVAL_BACKGROUND):
        name = names[i % len(names)]
        window = camera_frame(photos[name], rng)[80:280, 220:420]
        cv2.imwrite(str(ev / "background" / f"{name.split(':')[1]}_{i:03d}.png"), window)


def main() -> None:
    """Write calib/ and eval/ under --root."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="repository root")
    args = ap.parse_args()
    root = Path(args.root)
    rng = np.random.default_rng(0)
    train_x, train_y, _ = load_fashion("train")
    test_x, test_y, _ = load_fashion("t10k")
    calib = root / "calib" / "fashion"
    shutil.rmtree(calib, ignore_errors=True)
    calib.mkdir(parents=True)
    for i in rng.permutation(len(train_x))[:400]:
        cv2.imwrite(str(calib / f"train_{i:05d}.png"), train_x[i])
    ev = write_eval(root, test_x, test_y)
    frames_dir = root / "calib" / "frames"
    shutil.rmtree(frames_dir, ignore_errors=True)
    frames_dir.mkdir(parents=True)
    for i, frame in enumerate(photo_frames(64, rng)):
        if i % 2:  # half the frames show an object in the crop window, half only the scene
            frame = paste_object(frame, train_x[rng.integers(len(train_x))])
        cv2.imwrite(str(frames_dir / f"frame_{i:03d}.jpg"), frame, [cv2.IMWRITE_JPEG_QUALITY, 80])
    # its own generator, so adding this set left every earlier image as it was
    write_background(ev, np.random.default_rng(1))
    print(f"wrote {calib}, {ev}, {frames_dir}")


if __name__ == "__main__":
    import sys

    from edgekit.errors import EdgekitError

    try:
        main()
    except EdgekitError as exc:  # no dataset: one line and the apt line, before anything is removed
        print(f"make data: error: {exc.message}" + (f"\n  fix: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        sys.exit(2)
