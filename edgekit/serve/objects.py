"""A detector's objects as events: one object held in view is one ``new`` ... ``end`` story.

Frigate users build automations on object events, not on per-frame boxes: "a person arrived",
"the car left". :class:`ObjectTracker` links a detector's boxes from frame to frame with a
greedy IoU match (same label only, best overlap first) and turns each linked chain into events:

- ``new``: the object was seen in ``min_frames`` frames (one-frame flickers never become events);
- ``update``: while it stays, at most every ``update_interval_s`` (0: never), with its box now
  and the top score so far;
- ``end``: it was missing for ``max_missing`` frames in a row (or the daemon stops), with
  ``end_time``, the time of the last frame it was seen in.

Each event: ``{"type", "id", "label", "score" (top so far), "box" (frame pixels, latest),
"start_time", "end_time" (on end), "frames" (frames it was seen in), "model", "bundle_sha256"}``.
:func:`counts` gives the confirmed objects per label (``<topic>/count/<label>``).

Pure Python on lists of boxes (a device sees a handful of objects per frame: the O(n*m) match
costs microseconds); not thread-safe, the daemon's inference loop is the only caller.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from edgekit.serve.record import Seen, seen_of

EVENT_TYPES = ("new", "update", "end")  # object events; a model hot-swap's is "model_swap"
MAX_TRACKS = 256  # a runaway detector (hundreds of boxes a frame) must not grow memory without bound


def iou(a: list[float] | tuple, b: list[float] | tuple) -> float:
    """Intersection over union of two ``[x1, y1, x2, y2]`` boxes (0 when either is empty)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


@dataclass
class Track:
    """One object followed across frames."""

    label: str
    box: list[float]
    score: float  # top so far
    start_time: float
    last_time: float
    id: str = ""
    frames: int = 1  # frames it was seen in
    missing: int = 0  # frames in a row without it
    started: bool = False  # "new" was sent
    last_event: float = 0.0  # time of the last new/update sent
    changed: bool = False  # box or top score changed since the last event
    best_now: bool = True  # this frame gave its top score so far (its snapshot is this frame)


@dataclass
class ObjectTracker:
    """Follows a detector's boxes and says when objects start, move on and end.

    Args mirror ``[events]``: ``min_score`` (weaker boxes are ignored), ``min_frames``,
    ``max_missing``, ``iou`` (the least overlap that links a box to a track),
    ``update_interval_s``, ``labels`` (only these; empty: all).
    """

    min_score: float = 0.5
    min_frames: int = 2
    max_missing: int = 5
    iou: float = 0.3
    update_interval_s: float = 5.0
    labels: tuple[str, ...] = ()
    tracks: list[Track] = field(default_factory=list)

    def update(self, detections: Iterable[Seen | dict[str, Any]], now: float) -> list[dict[str, Any]]:
        """Feed one frame's detections (a record's :class:`~edgekit.serve.record.Seen` boxes, or
        ``{"label", "score", "box"}`` dicts, read once) seen at ``now`` (epoch s); returns the
        events it caused, oldest object first."""
        boxes = [d for d in map(seen_of, detections) if d is not None and self._wanted(d)]
        for track in self.tracks:
            track.best_now = False
        matched = self._match(boxes)
        events = []
        for track in list(self.tracks):
            det = matched.get(id(track))
            if det is None:
                track.missing += 1
                if track.missing >= self.max_missing:
                    self.tracks.remove(track)
                    if track.started:
                        events.append(self._event("end", track))
                continue
            self._extend(track, det, now)
            if not track.started and track.frames >= self.min_frames:
                track.started, track.last_event, track.changed = True, now, False
                events.append(self._event("new", track))
            elif track.started and track.changed and self.update_interval_s > 0 \
                    and now - track.last_event >= self.update_interval_s:
                track.last_event, track.changed = now, False
                events.append(self._event("update", track))
        taken = {id(d) for d in matched.values()}
        for det in boxes:
            if id(det) not in taken and len(self.tracks) < MAX_TRACKS:
                self.tracks.append(self._new_track(det, now))
                if self.min_frames <= 1:
                    track = self.tracks[-1]
                    track.started, track.last_event = True, now
                    events.append(self._event("new", track))
        return events

    def end_all(self) -> list[dict[str, Any]]:
        """``end`` events for every started object (the daemon stops or the model changes)."""
        events = [self._event("end", t) for t in self.tracks if t.started]
        self.tracks.clear()
        return events

    def counts(self, min_score: float = 0.0) -> dict[str, int]:
        """Started (confirmed) objects in view per label whose top score reached ``min_score``; a
        label with none is absent."""
        out: dict[str, int] = {}
        for t in self.tracks:
            if t.started and t.score >= min_score:
                out[t.label] = out.get(t.label, 0) + 1
        return out

    def _wanted(self, d: Seen) -> bool:
        return d.box is not None and d.score >= self.min_score and (not self.labels or d.label in self.labels)

    def _match(self, boxes: list[Seen]) -> dict[int, Seen]:
        """Greedy IoU matching, best overlap first, same label only: ``id(track) -> detection``."""
        pairs = []
        for t in self.tracks:
            for n, d in enumerate(boxes):
                if d.label == t.label:
                    overlap = iou(t.box, d.box)
                    if overlap >= self.iou:
                        pairs.append((-overlap, id(t), n))
        pairs.sort()
        out: dict[int, Seen] = {}
        used: set[int] = set()
        for _, tid, n in pairs:
            if tid not in out and n not in used:
                out[tid] = boxes[n]
                used.add(n)
        return out

    @staticmethod
    def _extend(track: Track, det: Seen, now: float) -> None:
        box = [round(float(v), 2) for v in det.box or ()]
        score = det.score
        track.changed |= box != track.box or score > track.score
        track.best_now = score > track.score
        track.box, track.score = box, max(track.score, score)
        track.frames += 1
        track.missing = 0
        track.last_time = now

    @staticmethod
    def _new_track(det: Seen, now: float) -> Track:
        # Frigate's id shape (start time + random suffix): unique across restarts without any state on disk
        return Track(label=det.label, box=[round(float(v), 2) for v in det.box or ()],
                     score=det.score, start_time=now, last_time=now,
                     id=f"{now:.3f}-{secrets.token_hex(3)}")

    @staticmethod
    def _event(kind: str, t: Track) -> dict[str, Any]:
        event = {"type": kind, "id": t.id, "label": t.label, "score": round(t.score, 4), "box": list(t.box),
                 "start_time": round(t.start_time, 3), "frames": t.frames}
        if kind == "end":
            event["end_time"] = round(t.last_time, 3)
        return event


def tracker_from_config(events: Any) -> ObjectTracker:
    """An :class:`ObjectTracker` with the values of an ``[events]`` table."""
    return ObjectTracker(min_score=events.min_score, min_frames=events.min_frames, max_missing=events.max_missing,
                         iou=events.iou, update_interval_s=events.update_interval_s, labels=tuple(events.labels))
