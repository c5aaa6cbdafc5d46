"""Calibration and evaluation images, preprocessed by the device's own code (edgekit.imaging.image).

int8 calibration must cover what the camera will really send: a model calibrated only on
clean in-distribution images can disagree with the float model on every real frame. So
``--calib`` may be given several times, mixing the labelled-style set with recorded
camera frames (an image folder or a video file, sampled evenly).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgekit.builders.log import BuildLog, progress
from edgekit.builders.sources.spool import Spool
from edgekit.errors import CalibrationError
from edgekit.imaging.image import IMAGE_SUFFIXES, ImageReadError, Preprocessor, read_image

VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v")
MIN_RECOMMENDED = 300


@dataclass
class ImageSet:
    """Shaped uint8 images (crop/colour/resize done, not yet normalised) and their origin.

    The images lie in a :class:`~edgekit.builders.sources.spool.Spool` (a temporary file), ``index``
    giving each one's row there in the set's order; they are read back a chunk at a time,
    so no step holds the whole set in memory, as uint8 or as float tensors.
    """

    spool: Spool
    index: np.ndarray
    sha256: str
    found: int
    skipped: int
    sources: dict[str, int] = field(default_factory=dict)
    labels: np.ndarray | None = None
    class_names: list[str] | None = None
    undersized: dict[str, int] = field(default_factory=dict)  # "tiny" / "under_crop": images counted
    names: list[str] | None = None  # an unlabelled eval set's files, relative to its folder (where a gate misses)

    def __len__(self) -> int:
        return len(self.index)

    def batches(self, prep: Preprocessor, size: int) -> Iterator[np.ndarray]:
        """The images as tensors for ``prep``'s input spec (float or quantised), ``size`` at a time."""
        for start in range(0, len(self), size):
            shaped = self.spool.read(self.index[start : start + size])
            yield np.concatenate([prep.finish(img) for img in shaped], axis=0)

    def stream(self, prep: Preprocessor, size: int) -> TensorStream:
        """A re-iterable, sized stream of single tensors (no batch axis), read ``size`` at a time."""
        return TensorStream(self, prep, size)

    def subset(self, idx: np.ndarray) -> ImageSet:
        """The images at ``idx`` (with their labels), under the whole set's sha256."""
        labels = None if self.labels is None else self.labels[idx]
        return ImageSet(self.spool, self.index[idx], self.sha256, len(idx), 0, {}, labels, self.class_names)


@dataclass
class TensorStream:
    """An image set's tensors one at a time, decoded a chunk at a time: TensorFlow's
    representative dataset walks it once per int8 conversion without holding it whole."""

    images: ImageSet
    prep: Preprocessor
    size: int

    def __len__(self) -> int:
        return len(self.images)

    def __iter__(self) -> Iterator[np.ndarray]:
        for batch in self.images.batches(self.prep, self.size):
            yield from batch

    def head(self, n: int) -> np.ndarray:
        """The first ``n`` tensors as one batch (a small sample)."""
        sub = self.images.subset(np.arange(min(n, len(self.images))))
        return next(sub.batches(self.prep, max(n, 1)), np.zeros((0, *self.prep.spec.shape[1:]), np.float32))


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def _video_frames(path: Path, limit: int, prep: Preprocessor, spool: Spool) -> dict[int, tuple[int, bytes]]:
    """Up to ``limit`` frames sampled evenly from a video, shaped and spooled as they are decoded.

    Returns, per sample number, the frame's row in ``spool`` and the sha256 of its raw pixels;
    the decoded frames themselves are dropped at once (a full-HD frame is 6 MB).
    """
    import cv2

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise CalibrationError(f"cannot open video {path}", "give an image folder or a video OpenCV can read")
    total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) or limit
    wanted = set(np.linspace(0, max(total - 1, 0), num=min(limit, total)).astype(int).tolist())
    frames: dict[int, tuple[int, bytes]] = {}
    i = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if i in wanted:
            frames[len(frames)] = (spool.append(prep.shaped(frame)), hashlib.sha256(frame.tobytes()).digest())
        i += 1
    cap.release()
    return frames


def load_calibration(
    sources: list[str | Path],
    prep: Preprocessor,
    count: int | None,
    seed: int,
    log: BuildLog,
    video_frames: int = 100,
) -> ImageSet:
    """Read calibration images from folders and/or videos, deterministically sampled.

    Every readable image of every source is listed (sorted), then ``count`` are drawn with
    ``seed`` (all of them when ``count`` is None). Unreadable and non-image files are
    skipped and counted. The returned sha256 covers the chosen files' bytes in order.
    """
    if not sources:
        raise CalibrationError("no calibration images given", "pass --calib DIR (a folder of png/jpg images)")
    entries, skipped_names = _calibration_entries(sources, video_frames)
    if not entries:
        raise CalibrationError(
            f"no images in {', '.join(map(str, sources))}", "put png/jpg files in the calibration folder"
        )
    order = np.random.default_rng(seed).permutation(len(entries))
    drawn = _draw(prep, [entries[i] for i in order], count, video_frames)
    if not len(drawn):
        raise CalibrationError(
            f"none of the {len(entries)} files in {', '.join(map(str, sources))} is a readable image",
            "check the files are real png/jpg images",
        )
    skipped = drawn.skipped + skipped_names
    if skipped:
        log.warn(f"skipped {skipped} calibration file(s): {drawn.skipped} unreadable/truncated, "
                 f"{skipped_names} not images")
    if len(drawn) < MIN_RECOMMENDED:
        log.warn(f"only {len(drawn)} calibration images; {MIN_RECOMMENDED}+ are recommended for int8")
    _warn_undersized(drawn, prep.spec.crop, log)
    mix = ", ".join(f"{Path(k).name}: {v}" for k, v in drawn.sources.items())
    log.info(f"calibration set: {len(drawn)} images ({mix}), sha256 {drawn.sha256[:12]}")
    return ImageSet(drawn.spool, drawn.index, drawn.sha256, len(entries), skipped, drawn.sources)


# (source as given, file, frame index for a video or None for an image file)
_Entry = tuple[str, Path, int | None]


def _calibration_entries(sources: list[str | Path], video_frames: int) -> tuple[list[_Entry], int]:
    """Every candidate image of every source, and how many files were skipped as not images."""
    entries: list[_Entry] = []
    skipped_names = 0
    for src in sources:
        src = Path(src)
        if src.is_dir():
            files = _image_files(src)
            images = [f for f in files if f.suffix.lower() in IMAGE_SUFFIXES]
            skipped_names += len(files) - len(images)
            entries += [(str(src), f, None) for f in images]
        elif src.is_file() and src.suffix.lower() in VIDEO_SUFFIXES:
            entries += [(str(src), src, i) for i in range(video_frames)]
        elif src.is_file():
            raise CalibrationError(f"calibration source {src} is a file", "give a folder of images or a video")
        else:
            raise CalibrationError(f"calibration folder {src} does not exist", "pass --calib DIR with images")
    return entries, skipped_names


def _draw(prep: Preprocessor, chosen: list[_Entry], count: int | None, video_frames: int) -> ImageSet:
    """Read ``chosen`` in order until ``count`` images are readable; ``skipped`` counts unreadable files.

    Each image is shaped and spooled as soon as it is read: memory holds one image at a time.
    """
    digest = hashlib.sha256()
    spool = Spool()
    rows: list[int] = []
    per_source: dict[str, int] = {}
    unreadable = 0
    undersized: dict[str, int] = {}
    videos: dict[Path, dict[int, tuple[int, bytes]]] = {}
    for src, path, frame_no in progress(chosen, "calibration images"):
        if count is not None and len(rows) >= count:
            break
        if frame_no is None:
            try:
                img = read_image(path)
            except ImageReadError:
                unreadable += 1
                continue
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
            _count_undersized(img, prep.spec.crop, undersized)
            rows.append(spool.append(prep.shaped(img)))
        else:
            if path not in videos:
                videos[path] = _video_frames(path, video_frames, prep, spool)
            if frame_no not in videos[path]:
                continue
            row, frame_digest = videos[path][frame_no]
            digest.update(f"{path.name}#{frame_no}".encode())
            digest.update(frame_digest)
            rows.append(row)
        per_source[src] = per_source.get(src, 0) + 1
    return ImageSet(spool, np.asarray(rows, dtype=np.int64), digest.hexdigest(), len(chosen), unreadable, per_source,
                    undersized=undersized)


TINY_SIDE = 8
"""An image side below this many pixels carries next to nothing for calibration."""


def _count_undersized(img: np.ndarray, crop: object, counts: dict[str, int]) -> None:
    """Count an image that is tiny, or smaller than a crop given in pixels (the crop then cannot fill)."""
    h, w = img.shape[:2]
    if min(h, w) < TINY_SIDE:
        counts["tiny"] = counts.get("tiny", 0) + 1
    if isinstance(crop, (list, tuple)) and (h < crop[0] or w < crop[1]):
        # the crop's own shape, only smaller (the demo's 28x28 items for a 200x200 window): already a
        # crop, used whole as the crop would be; another shape is cut differently from a camera frame
        same_shape = abs(h * crop[1] - w * crop[0]) <= 0.02 * h * crop[1]
        key = "crop_shaped" if same_shape else "under_crop"
        counts[key] = counts.get(key, 0) + 1


def _warn_undersized(drawn: ImageSet, crop: object, log: BuildLog) -> None:
    """Say when the images cannot stand for what the camera will show (they still build)."""
    n = len(drawn)
    if drawn.undersized.get("tiny"):
        log.warn(f"{drawn.undersized['tiny']} of {n} calibration images are under {TINY_SIDE} pixels on a side: "
                 "int8 ranges from them will not match camera frames; calibrate on full-size frames")
    shaped = drawn.undersized.get("crop_shaped", 0)
    filling = n - shaped - drawn.undersized.get("under_crop", 0)
    if shaped and filling > 0:  # beside camera frames that fill the crop, small crop-shaped images are crops
        log.info(f"{shaped} of {n} calibration images have the crop's shape, smaller than its {crop[0]}x{crop[1]} "
                 f"pixels, beside {filling} camera-sized ones: each is taken as an already cropped window, used whole")
    elif shaped:  # nothing fills the crop: whole scenes would be seen wider than the camera's crop shows them
        drawn.undersized["under_crop"] = drawn.undersized.get("under_crop", 0) + shaped
    if drawn.undersized.get("under_crop"):
        log.warn(f"{drawn.undersized['under_crop']} of {n} calibration images are smaller than the crop "
                 f"{crop[0]}x{crop[1]} (height x width), so it never fills: "
                 "give camera-sized images or a smaller --crop")


def load_images_eval(root: str | Path, prep: Preprocessor, log: BuildLog) -> ImageSet:
    """An evaluation set compared with the original model's own outputs (``raw``, ``landmarks``,
    ``segment``): every image under ``root``, class folders or none, by name (``names``)."""
    root = Path(root)
    if not root.is_dir():
        raise CalibrationError(f"evaluation folder {root} does not exist", "pass --eval DIR, a folder of images")
    spool, names, skipped = Spool(), [], 0
    digest = hashlib.sha256()
    files = _image_files(root)
    for path in progress(files, "evaluation images"):
        try:
            img = read_image(path) if path.suffix.lower() in IMAGE_SUFFIXES else None
        except ImageReadError:
            img = None
        if img is None:
            skipped += 1
            continue
        digest.update(path.read_bytes())
        spool.append(prep.shaped(img))
        names.append(path.relative_to(root).as_posix())
    if not names:
        raise CalibrationError(f"evaluation folder {root} has no readable images", "give a folder of images")
    if skipped:
        log.warn(f"skipped {skipped} unreadable or non-image evaluation file(s)")
    log.info(f"evaluation set: {len(names)} images (compared with the original model's outputs)")
    return ImageSet(spool, np.arange(len(names)), digest.hexdigest(), len(files), skipped, {str(root): len(names)},
                    names=names)


def load_eval(root: str | Path, prep: Preprocessor, class_names: list[str] | None, log: BuildLog) -> ImageSet:
    """An ImageFolder evaluation set: ``root/<class>/*.png``. Classes match the model's labels by name."""
    root = Path(root)
    if not root.is_dir():
        raise CalibrationError(f"evaluation folder {root} does not exist",
                               "pass --eval DIR with one subfolder per class")
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise CalibrationError(
            f"evaluation folder {root} has no class subfolders", "use the ImageFolder layout: DIR/<class>/*.png"
        )
    classes = class_names or folders
    unknown = [f for f in folders if f not in classes]
    if unknown:
        raise CalibrationError(
            f"evaluation classes {unknown[:5]} are not among the model's labels",
            "name the subfolders after the labels (labels.txt)",
        )
    spool, labels, skipped = Spool(), [], 0
    digest = hashlib.sha256()
    files = [(f, classes.index(name)) for name in folders for f in _image_files(root / name)]
    for path, label in progress(files, "evaluation images"):
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            skipped += 1
            continue
        try:
            img = read_image(path)
        except ImageReadError:
            skipped += 1
            continue
        digest.update(path.read_bytes())
        spool.append(prep.shaped(img))
        labels.append(label)
    if not labels:
        raise CalibrationError(f"evaluation folder {root} has no readable images")
    if skipped:
        log.warn(f"skipped {skipped} unreadable or non-image evaluation file(s)")
    log.info(f"evaluation set: {len(labels)} images in {len(folders)} classes")
    return ImageSet(spool, np.arange(len(labels)), digest.hexdigest(), len(files), skipped,
                    {str(root): len(labels)}, np.asarray(labels, dtype=np.int64), classes)
