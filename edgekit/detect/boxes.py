"""Detections as results.

A detector sees the frame after :class:`~edgekit.imaging.image.Preprocessor` cropped, letterboxed or
stretched it; its boxes are in that input's pixels, and :func:`edgekit.imaging.geometry.box_map`
undoes exactly those steps, so a box lands on the frame where the object is, clipped to the part of
the frame the model saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Detection:
    """One object: class index and label, score, and box ``(x1, y1, x2, y2)`` in pixels; and
    ``keypoints``, ``((x, y), ...)`` in the same pixels, for models that regress them (a face
    detector's eyes, nose, mouth, ears), else empty."""

    index: int
    label: str
    score: float
    box: tuple[float, float, float, float]
    keypoints: tuple[tuple[float, float], ...] = ()
    landmarks: tuple[tuple[float, float, float], ...] | None = None
    landmark_score: float | None = None
    landmark_visibility: tuple[float, ...] | None = None
    sub_label: str | None = None
    sub_label_score: float | None = None
    region: tuple[float, ...] | None = None
    second: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``keypoints`` ``[[x, y], ...]`` only when there are any (a detector without
        keypoints gives the same JSON as before they existed); a cascade's second stage adds
        ``region`` (cx, cy, w, h, degrees), ``landmarks`` ``[[x, y, z], ...]`` in frame pixels and
        ``landmark_score``, or ``sub_label`` and ``sub_label_score``, or ``second`` (another head's result)."""
        d: dict[str, Any] = {"index": self.index, "label": self.label, "score": round(self.score, 6),
                             "box": [round(v, 2) for v in self.box]}
        if self.keypoints:
            d["keypoints"] = [[round(x, 2), round(y, 2)] for x, y in self.keypoints]
        if self.region is not None:
            d["region"] = list(self.region)
        if self.landmarks is not None:
            d["landmarks"] = [[round(x, 2), round(y, 2), round(z, 2)] for x, y, z in self.landmarks]
        if self.landmark_visibility is not None:
            d["landmark_visibility"] = [round(v, 4) for v in self.landmark_visibility]
        for key in ("landmark_score", "sub_label_score"):
            value = getattr(self, key)
            if value is not None:
                d[key] = round(value, 6)
        if self.sub_label is not None:
            d["sub_label"] = self.sub_label
        if self.second is not None:
            d["second"] = self.second
        return d


@dataclass(frozen=True)
class Detections:
    """What the ``detect`` head returns for one frame: objects best first.

    ``size`` is ``(width, height)`` of the image the boxes are in: the source frame when the
    decoder was given its shape, else the model input.
    """

    detections: tuple[Detection, ...]
    size: tuple[int, int] | None = None

    @property
    def top(self) -> Detection | None:
        """The highest-scoring object, or None when nothing was detected."""
        return self.detections[0] if self.detections else None

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels present, each once, sorted (what an event compares between frames)."""
        return tuple(sorted({d.label for d in self.detections}))

    def __len__(self) -> int:
        return len(self.detections)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"detections": [x.to_dict() for x in self.detections], "count": len(self.detections)}
        if self.size is not None:
            d["image_size"] = list(self.size)
        return d

    def __str__(self) -> str:
        if not self.detections:
            return "nothing detected"
        return "  ".join(f"{d.label} {d.score:.2f} [{', '.join(f'{v:.0f}' for v in d.box)}]{_second(d)}"
                         for d in self.detections)


def _second(d: Detection) -> str:
    """What a cascade's second stage made of a detection, in words (empty without one)."""
    if d.sub_label is not None:
        return f" -> {d.sub_label} {d.sub_label_score or 0:.2f}"
    if d.landmarks is not None:
        score = f" ({d.landmark_score:.2f})" if d.landmark_score is not None else ""
        return f" -> {len(d.landmarks)} landmarks{score}"
    return " -> second stage" if d.second is not None else ""
