"""Where a detector's objects go: events on MQTT and in the JSON lines, counts, and snapshots.

The daemon hands each result and its frame to :class:`ObjectFeed`; the tracker
(:mod:`edgekit.serve.objects`) says what happened, and the feed publishes it: each event on
``<topic>/events`` (and into the JSON lines with ``[events] jsonl``) named by the model that
saw it, the objects in view per label on ``<topic>/count/<label>``, and with ``[events]
snapshots`` the object's best frame (the one with its top score, its box drawn, scaled to
``snapshot_width``) as a retained JPEG on ``<topic>/snapshot/<label>`` at ``new`` and ``end``.

Only the inference loop calls it (not thread-safe).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from edgekit.errors import UsageError
from edgekit.serve.objects import ObjectTracker, Track, tracker_from_config
from edgekit.serve.record import ResultRecord, as_record

log = logging.getLogger("edgekit.serve")

MAX_SNAPSHOT_TRACKS = 16  # frames kept for snapshots at once: a crowd must not hold hundreds of frames
JPEG_QUALITY = 85  # a 640-px frame is then about 40-80 kB: fine for MQTT and a Home Assistant camera


class ObjectFeed:
    """Tracker, snapshots and outputs for one daemon.

    Args:
        config: the :class:`~edgekit.serve.config.load.ServeConfig` (``[events]``, device).
        identity: ``() -> dict`` of the running model (bundle, sha256), asked per event:
            a hot-swap changes it.
        mqtt, sink: the daemon's outputs (either may be None); set after construction.
        camera: the camera's name: its events say ``"camera": name``, its counts and snapshots go
            to its own topics ("" for the one unnamed camera: nothing added). One feed per camera,
            so the tracker links boxes of one camera's frames only.
    """

    def __init__(self, config: Any, identity: Callable[[], dict[str, Any]], mqtt: Any = None, sink: Any = None,
                 camera: str = ""):
        self.config = config.events
        self.device = config.device
        self.camera = camera
        self._named = {"camera": camera} if camera else {}  # the keyword the outputs take, and the events' key
        self.tracker: ObjectTracker = tracker_from_config(config.events)
        # what MQTT shows in view: objects whose top score reached [mqtt] min_score too, so a bar set
        # there keeps weak objects out of the state, the label and the count topics alike
        self.bar = float(getattr(getattr(config, "mqtt", None), "min_score", 0.0) or 0.0)
        self.snapshots = Snapshots(config.events.snapshot_width) if config.events.snapshots else None
        self.mqtt, self.sink = mqtt, sink
        self._identity = identity

    def frame(self, record: ResultRecord | dict[str, Any], image: Any = None) -> dict[str, int]:
        """One detector's result (its boxes and time) and the frame's picture (BGR array or None);
        returns the objects in view per label after it (from ``new`` to ``end``), the one notion
        of "in view" the state, label and count topics are all made from (publish_result)."""
        record = as_record(record)
        events = self.tracker.update(record.detections or (), record.time)
        if self.snapshots is not None and image is not None:
            self.snapshots.keep(self.tracker.tracks, image)
        self._emit(events)
        return self.tracker.counts(self.bar)

    def close(self) -> None:
        """``end`` every object still in view (the daemon stops)."""
        self._emit(self.tracker.end_all())

    def _emit(self, events: list[dict[str, Any]]) -> None:
        model = self._identity()
        for event in events:
            event = {"device": self.device, **self._named, **event, "model": model.get("bundle", ""),
                     "bundle_sha256": model.get("sha256", "")}
            if self.config.jsonl and self.sink is not None:
                self.sink.write(event)
            if self.mqtt is not None:
                self.mqtt.publish_event(event)
                if self.snapshots is not None and event["type"] in ("new", "end"):
                    jpeg = self.snapshots.jpeg(event["id"])
                    if jpeg is not None:
                        self.mqtt.publish_snapshot(event["label"], jpeg, **self._named)
        if self.mqtt is not None and self.config.counts:
            self.mqtt.publish_counts(self.tracker.counts(self.bar), **self._named)
        if self.snapshots is not None:
            self.snapshots.forget({t.id for t in self.tracker.tracks})


class Snapshots:
    """The best frame of each object (a copy: a source may reuse its buffers) and its JPEG."""

    def __init__(self, width: int = 640):
        from edgekit.util.quiet import import_cv2

        try:
            self._cv2 = import_cv2("[events] snapshots")
        except Exception as exc:  # BackendUnavailable: say so at start, not at the first event
            raise UsageError(str(getattr(exc, "message", exc)), "pip install 'edgekit-vision[opencv]', "
                             "or set [events] snapshots = false") from exc
        self.width = width
        self._best: dict[str, tuple[np.ndarray, list[float]]] = {}

    def keep(self, tracks: list[Track], image: np.ndarray) -> None:
        """Remember ``image`` for every track whose top score is from this frame."""
        for t in tracks:
            if t.best_now and (t.id in self._best or len(self._best) < MAX_SNAPSHOT_TRACKS):
                self._best[t.id] = (np.array(image, copy=True), list(t.box))

    def forget(self, live: set[str]) -> None:
        """Drop the frames of objects that are gone (after their ``end`` was published)."""
        for key in [k for k in self._best if k not in live]:
            del self._best[key]

    def jpeg(self, track_id: str) -> bytes | None:
        """The object's best frame with its box drawn, scaled to ``width``, as JPEG (None: no frame)."""
        got = self._best.get(track_id)
        if got is None:
            return None
        cv2 = self._cv2
        image, box = got
        h, w = image.shape[:2]
        scale = min(1.0, self.width / w)
        if scale < 1.0:
            image = cv2.resize(image, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA)
        else:
            image = image.copy()  # the rectangle must not be drawn into the kept frame
        x1, y1, x2, y2 = (round(v * scale) for v in box)
        try:
            cv2.rectangle(image, (x1, y1), (x2, y2), (0, 255, 0), max(1, round(2 * scale)))
            ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        except cv2.error as exc:  # an odd frame (dtype, channels): no snapshot, the event still goes out
            log.warning("snapshot of object %s not made: %s", track_id, exc)
            return None
        return data.tobytes() if ok else None
