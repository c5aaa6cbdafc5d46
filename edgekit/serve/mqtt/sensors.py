"""What Home Assistant's sensors read: ``<topic>/sensors``, one JSON kept fresh, and per-label counts.

In ``change`` mode ``<topic>/result`` is sent only when the set of labels changes, so a score
sensor reading it went stale for hours. :class:`SensorFeed` decides when ``<topic>/sensors``
(``{"state", "score", "count", "counts", "time"}``) is due: at once when the state or a count
changes, else at least every ``interval_s`` while results flow (Home Assistant's
``expire_after`` then marks the sensors unknown when they stop: a camera that is down). For a tracked
detector ``count`` and ``counts`` are its objects in view (from their ``new`` event to their
``end``, :mod:`edgekit.serve.objects`), the same the state and label topics are made from; each
label's count is also on its own retained topic ``<topic>/count/<slug>``, sent when it changes
(Frigate's ``<camera>/<label>``). Without ``[events]`` ``count`` is the boxes at ``min_score``.

Keys of ``counts`` are slugs (``[a-z0-9_]``): labels come from a bundle, which is untrusted, and
a slug is the only form of a label that may enter a Home Assistant template.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from edgekit.serve.mqtt.discovery import label_topics
from edgekit.serve.record import ResultRecord, as_record


class SensorFeed:
    """When ``<topic>/sensors`` is due, and the per-label counts (not thread-safe: the
    publisher calls it under its lock).

    Args:
        topic: the device's topic prefix.
        interval_s: the longest time between two sensor messages while results flow.
        count_labels: labels with a count topic and a count sensor (a detector's; empty for a classifier).
        min_score: a box counts in ``count`` from this score.
    """

    def __init__(self, topic: str, interval_s: float, count_labels: tuple[str, ...] = (),
                 min_score: float = 0.5, clock: Callable[[], float] = time.monotonic):
        self.topic = f"{topic}/sensors"
        self.interval_s = interval_s
        self.min_score = min_score
        self.count_topics = label_topics(topic, count_labels, kind="count")
        self.counts = dict.fromkeys(count_labels, 0)
        self.payload: str | None = None  # the newest sensor message (sent again on connect)
        self._clock = clock
        self._due = True
        self._last = 0.0
        self._count: int | None = None  # the last "count" offered: a change is sent at once

    def set_counts(self, counts: dict[str, int]) -> list[tuple[str, str]]:
        """Take the objects in view per label; returns ``(count topic, text)`` for each that changed."""
        changed = []
        for label, topic in self.count_topics.items():
            n = int(counts.get(label, 0))
            if n != self.counts[label]:
                self.counts[label] = n
                changed.append((topic, str(n)))
        self._due |= bool(changed)
        return changed

    def count_messages(self) -> list[tuple[str, str]]:
        """Every count topic with its current value (retained again on each connect)."""
        return [(topic, str(self.counts[label])) for label, topic in self.count_topics.items()]

    def offer(self, record: ResultRecord | Mapping[str, Any], state: str, changed: bool,
              count: int | None = None) -> str | None:
        """The sensor JSON when one is due after this result (a changed state or count, or
        ``interval_s`` since the last), else None. ``record`` is the daemon's typed record (a
        plain dict in the published shape is read into one); ``count``: a tracked detector's
        objects in view (None: the record's boxes at ``min_score``, a detector without ``[events]``)."""
        record = as_record(record)
        if count is None and record.detections is not None:
            count = sum(1 for d in record.detections if d.score >= self.min_score)
        changed |= count != self._count
        self._count = count
        now = self._clock()
        if not (changed or self._due or now - self._last >= self.interval_s):
            return None
        self._due, self._last = False, now
        body: dict[str, Any] = {"state": state, "score": record.top_score}
        if count is not None:
            body["count"] = count
        if self.count_topics:
            body["counts"] = {topic.rsplit("/", 1)[1]: self.counts[label] for label, topic in self.count_topics.items()}
        body["time"] = record.time
        self.payload = json.dumps(body, separators=(",", ":"))
        return self.payload

