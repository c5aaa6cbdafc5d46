"""Labelled image sets for training and evaluation (host side, numpy + OpenCV only).

Every loader returns ``(frames, labels, class_names)`` where ``frames`` is a list of
OpenCV-convention uint8 images (any size) and ``labels`` an int array; turning frames into
tensors is left to :class:`edgekit.imaging.image.Preprocessor`, the same code the device runs.

Layouts:
- ImageFolder: one subfolder per class (``data/signs/a/*.png``).
- Kaggle Vector sign set: flat files ``<letter>_<n>.png`` and ``background_<n>.png``.
- Sign-Language-MNIST CSV: ``label,pixel1..pixel784`` (28x28 gray, labels 0-25, J and Z absent).
- Fashion-MNIST IDX (the bundled demo's stand-in data, Debian ``dataset-fashion-mnist``).
"""

from __future__ import annotations

import csv
import gzip
import re
import string
from pathlib import Path

import numpy as np

from edgekit.errors import CalibrationError
from edgekit.imaging.image import IMAGE_SUFFIXES, ImageReadError, read_image

FASHION_CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                   "ankle-boot"]
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # where Debian's dataset-fashion-mnist installs
SIGN_CLASSES = list(string.ascii_lowercase) + ["background"]  # the seed's 27 classes, background last


def load_idx(images_gz: Path, labels_gz: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read an MNIST-style IDX pair (gzip) into ``(N, 28, 28) uint8`` images and labels."""
    with gzip.open(images_gz, "rb") as f:
        raw = f.read()
    magic, n, rows, cols = np.frombuffer(raw[:16], dtype=">u4")
    if magic != 2051:
        raise CalibrationError(f"{images_gz} is not an IDX image file")
    images = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(int(n), int(rows), int(cols))
    with gzip.open(labels_gz, "rb") as f:
        raw = f.read()
    labels = np.frombuffer(raw, dtype=np.uint8, offset=8).astype(np.int64)
    return images, labels


def load_fashion(split: str = "train", root: Path = FASHION_DIR):
    """Fashion-MNIST ``train`` (60,000) or ``t10k`` (10,000) as (frames array, labels, classes)."""
    if not (root / f"{split}-images-idx3-ubyte.gz").is_file():
        raise CalibrationError(f"Fashion-MNIST is not under {root}",
                               "sudo apt-get install dataset-fashion-mnist (Debian's package installs it there)")
    images, labels = load_idx(root / f"{split}-images-idx3-ubyte.gz", root / f"{split}-labels-idx1-ubyte.gz")
    return images, labels, list(FASHION_CLASSES)


def load_image_folder(root: str | Path, class_names: list[str] | None = None):
    """ImageFolder layout. Unreadable files are skipped and counted (returned last)."""
    root = Path(root)
    if not root.is_dir():
        raise CalibrationError(f"{root} is not a directory")
    classes = class_names or sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise CalibrationError(f"{root} has no class subfolders", "use one subfolder per class: DIR/<class>/*.png")
    frames, labels, skipped = [], [], 0
    for idx, name in enumerate(classes):
        folder = root / name
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                frames.append(read_image(path))
                labels.append(idx)
            except ImageReadError:
                skipped += 1
    return frames, np.asarray(labels, dtype=np.int64), classes, skipped


_KAGGLE_NAME = re.compile(r"^([a-z]|background)_\d+$", re.IGNORECASE)


def load_kaggle_vector(root: str | Path):
    """The Kaggle Vector sign set: ``<letter>_<n>.png`` / ``background_<n>.png`` in one folder."""
    root = Path(root)
    frames, labels, skipped = [], [], 0
    for path in sorted(root.iterdir()):
        m = _KAGGLE_NAME.match(path.stem)
        if not m or path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        try:
            frames.append(read_image(path))
            labels.append(SIGN_CLASSES.index(m.group(1).lower()))
        except ImageReadError:
            skipped += 1
    if not frames:
        raise CalibrationError(f"{root} has no <letter>_<n>.png files", "is this the Kaggle Vector layout?")
    return frames, np.asarray(labels, dtype=np.int64), list(SIGN_CLASSES), skipped


def load_sign_mnist_csv(path: str | Path):
    """Sign-Language-MNIST CSV (label, 784 pixels); labels index a-z (J=9 and Z=25 unused)."""
    frames, labels = [], []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        if not header or header[0].strip().lower() != "label":
            raise CalibrationError(f"{path} is not a Sign-Language-MNIST CSV (first column must be 'label')")
        for row in reader:
            if len(row) != 785:
                continue
            labels.append(int(row[0]))
            frames.append(np.asarray(row[1:], dtype=np.uint8).reshape(28, 28))
    return frames, np.asarray(labels, dtype=np.int64), list(string.ascii_lowercase), 0


def load_any(source: str | Path):
    """Pick the loader from what ``source`` looks like; returns (frames, labels, classes, skipped)."""
    source = Path(source)
    if source.is_file() and source.suffix.lower() == ".csv":
        return load_sign_mnist_csv(source)
    if not source.is_dir():
        raise CalibrationError(f"training data {source} does not exist")
    if any(p.is_dir() for p in source.iterdir()):
        return load_image_folder(source)
    return load_kaggle_vector(source)
