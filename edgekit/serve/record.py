"""One result as the daemon's outputs see it: built once per frame from the pipeline's typed result.

The JSON-lines sink, MQTT (result topic, state, publish policy), the object tracker and ``/stats``
all read the same :class:`ResultRecord`. It carries what they decide on as typed fields (the
classifier's top-k or the detector's boxes as :class:`Seen` tuples, the frame's time) and its JSON
body, made once from the task head's ``to_dict()``; :meth:`ResultRecord.to_json` is the one
encoder of a result for every output. No output looks a result's keys up by name.

A Python caller (a test, robot glue) may still hand the outputs a plain dict: :func:`as_record`
turns it into a record once, at the door.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekit.util.finite_json import to_json

#: latency stages a result carries in ``ms`` (a detector's postprocess split into decode and nms; a
#: cascade's second stage, all its regions)
RECORD_STAGES = ("preprocess", "inference", "end_to_end", "decode", "nms", "second_stage")  # + a cascade's


@dataclass(frozen=True)
class Seen:
    """One thing a result names: a classifier's class or a detector's object, with its score
    rounded as its JSON says (so a policy decides on the number a subscriber reads) and, for a
    detector, its box ``(x1, y1, x2, y2)`` in frame pixels."""

    label: str
    score: float
    box: tuple[float, float, float, float] | None = None


@dataclass(frozen=True)
class ResultRecord:
    """What one frame's result is for the outputs (see the module docstring).

    ``top`` is a classifier's top-k, best first; ``detections`` a detector's objects, best
    first, or None when the result is not a detector's (a classifier's, a raw head's).
    ``doc`` is the JSON-ready body written to the outputs, in its published key order.
    ``camera`` is the name of the camera the frame came from ("" for the one unnamed camera).
    """

    frame: int
    time: float
    top: tuple[Seen, ...] = ()
    detections: tuple[Seen, ...] | None = None
    camera: str = ""
    doc: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    timings_ms: Mapping[str, float] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def is_detector(self) -> bool:
        """Whether a detector made it (its state is a set of labels, not one label)."""
        return self.detections is not None

    @property
    def scores(self) -> tuple[Seen, ...]:
        """What the result names, best first: the detector's objects, else the classifier's top-k."""
        items = self.detections if self.detections is not None else self.top
        return tuple(sorted(items, key=lambda s: -s.score))

    @property
    def top_score(self) -> float:
        """The best score (a classifier's top-1 or a detector's best box; 0 when none)."""
        return round(max((s.score for s in self.scores), default=0.0), 4)

    def to_dict(self) -> dict[str, Any]:
        """The record as published (a copy: the record stays frozen)."""
        return dict(self.doc)

    def to_json(self, **extra: Any) -> str:
        """The one JSON line of this result for every output; ``extra`` keys go last (MQTT's state)."""
        return to_json({**self.doc, **extra} if extra else dict(self.doc))

    def last_result(self) -> dict[str, Any]:
        """``/stats``' ``last_result``: the frame, its time, the task head's JSON and every stage's ms."""
        body = {k: v for k, v in self.doc.items() if k not in _IDENTITY}
        return {"frame": self.frame, "time": self.time, **body,
                "ms": {k: round(v, 4) for k, v in self.timings_ms.items()}}


_IDENTITY = ("device", "time", "model", "variant", "bundle_sha256", "frame", "ms")


def record_from(result: Any, device: str, identity: Mapping[str, Any], now: float | None = None,
                camera: str = "") -> ResultRecord:
    """The record of a :class:`~edgekit.pipeline.FrameResult` made by the model ``identity``
    (``bundle``, ``variant``, ``sha256``) on ``device``; ``now`` is the epoch time (default: now).
    A named ``camera`` is the record's ``camera`` key, right after ``device`` (the one unnamed
    camera's results have no such key, as before several cameras)."""
    from edgekit.detect.boxes import Detections
    from edgekit.heads.classify import Classification

    stamp = round(time.time() if now is None else now, 3)
    head = result.result
    top: tuple[Seen, ...] = ()
    detections: tuple[Seen, ...] | None = None
    if isinstance(head, Classification):
        top = tuple(Seen(p.label, round(float(p.score), 6)) for p in head.predictions)
    elif isinstance(head, Detections):
        detections = tuple(Seen(d.label, round(float(d.score), 6), tuple(round(float(v), 2) for v in d.box))
                           for d in head.detections)
    ms = result.timings_ms
    doc = {
        "device": device, **({"camera": camera} if camera else {}), "time": stamp,
        "model": identity.get("bundle", ""), "variant": identity.get("variant", ""),
        "bundle_sha256": identity.get("sha256", ""),
        "frame": result.index, **({"source": result.source} if getattr(result, "source", None) else {}),
        **head.to_dict(),
        "ms": {k: round(ms[k], 3) for k in RECORD_STAGES if k in ms},
    }
    return ResultRecord(frame=result.index, time=stamp, top=top, detections=detections, camera=camera, doc=doc,
                        timings_ms=dict(ms))


def as_record(record: ResultRecord | Mapping[str, Any]) -> ResultRecord:
    """A record as is; a plain dict (a Python caller's, in the published shape) read once into one."""
    if isinstance(record, ResultRecord):
        return record
    doc = dict(record)
    boxes = doc.get("detections")
    detections = None
    if isinstance(boxes, list):
        detections = tuple(_seen(d) for d in boxes if isinstance(d, Mapping))
    top = tuple(_seen(p) for p in (doc.get("top") or []) if isinstance(p, Mapping))
    stamp, frame, camera = doc.get("time"), doc.get("frame"), doc.get("camera")
    return ResultRecord(frame=frame if isinstance(frame, int) else 0,
                        time=float(stamp) if isinstance(stamp, (int, float)) else round(time.time(), 3),
                        top=top, detections=detections, camera=camera if isinstance(camera, str) else "", doc=doc)


def seen_of(item: Seen | Mapping[str, Any]) -> Seen | None:
    """A :class:`Seen` as is; a ``{"label", "score", "box"}`` dict read into one; None for anything else."""
    if isinstance(item, Seen):
        return item
    return _seen(item) if isinstance(item, Mapping) else None


def _seen(item: Mapping[str, Any]) -> Seen:
    box = item.get("box")
    typed_box = tuple(float(v) for v in box) if isinstance(box, (list, tuple)) and len(box) == 4 else None
    return Seen(str(item.get("label", "")), float(item.get("score", 0.0)), typed_box)  # type: ignore[arg-type]
