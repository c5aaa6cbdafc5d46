"""When a result becomes an MQTT message: every frame, on a change of what is seen, or at a rate.

A camera at 15 fps that keeps seeing the same thing should not send 15 messages a second
(the daemon's old behaviour). :class:`PublishPolicy` turns the stream of results into a
*state* (the top label; for a detector, the set of labels with a box at ``min_score``, or the labels
of its objects in view when the daemon tracks them: then given to :meth:`PublishPolicy.decide`) and decides,
per result, whether to publish it:

- ``every``: each result (the firehose; the JSON-lines file always has every result anyway);
- ``change`` (default): when the state changes. Two guards stop flicker from turning into
  messages: score hysteresis (a label enters the state at ``min_score`` and stays while its
  score is at least ``min_score - hysteresis`` and no rival beats it by ``hysteresis``), and
  confirmation (a new state must be seen on ``confirm_frames`` results in a row);
- ``interval``: at most one result every ``min_interval_s`` seconds (the newest one).

The first result is always published, so a subscriber learns the starting state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from edgekit.serve.record import ResultRecord, as_record

PUBLISH_MODES = ("every", "change", "interval")
NOTHING = ""  # the state when no label reaches min_score


@dataclass
class PublishPolicy:
    """Decides which results are published; :meth:`decide` is called once per result.

    Not thread-safe: the daemon's inference loop is its only caller.
    """

    mode: str = "change"
    min_interval_s: float = 1.0
    min_score: float = 0.5
    hysteresis: float = 0.1
    confirm_frames: int = 2
    clock: Callable[[], float] = time.monotonic
    state: Hashable | None = None  # the published state (None before the first result)
    changes: int = 0  # state changes published
    suppressed: int = 0  # results not published because of the mode
    _pending: Hashable | None = None
    _pending_count: int = 0
    _last_publish: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in PUBLISH_MODES:
            raise ValueError(f"publish mode {self.mode!r} is not one of {', '.join(PUBLISH_MODES)}")

    def state_of(self, record: ResultRecord | dict[str, Any]) -> Hashable:
        """What a result shows, with hysteresis against the current state.

        A classifier's state is one label (or ``NOTHING``); a detector's is the frozenset of
        labels found.
        """
        record = as_record(record)
        pairs = [(s.label, s.score) for s in record.scores]
        keep = self.min_score - self.hysteresis
        if record.is_detector:
            current = self.state if isinstance(self.state, frozenset) else frozenset()
            return frozenset(label for label, score in pairs
                             if score >= self.min_score or (label in current and score >= keep))
        best_label, best = pairs[0] if pairs else (NOTHING, 0.0)
        if self.state not in (None, NOTHING):
            mine = next((score for label, score in pairs if label == self.state), 0.0)
            if mine >= keep and (best_label == self.state or best < mine + self.hysteresis):
                return self.state
        return best_label if best >= self.min_score else NOTHING

    def decide(self, record: ResultRecord | dict[str, Any], given: Hashable | None = None) -> tuple[bool, Hashable]:
        """``(publish, state)`` for one result; updates the published state when it changed.

        ``given``: the state decided elsewhere (a tracked detector's labels in view): taken at once,
        without hysteresis or confirmation, since the tracker's ``min_frames``/``max_missing`` already
        kept flicker out, and a second guard here would let the state lag its count topics."""
        state = self.state_of(record) if given is None else given
        if given is not None and state != self.state:
            self._pending, self._pending_count = None, 0  # confirmed by the tracker: nothing to wait for
            confirmed = True
        else:
            confirmed = self._confirmed(state)
        if self.state is None or confirmed:
            changed = state != self.state
            self.state = state
            self.changes += changed
            if self.mode == "change":
                return self._published(), state
        if self.mode == "every":
            return self._published(), self.state
        if self.mode == "interval":
            now = self.clock()
            if self._last_publish is None or now - self._last_publish >= self.min_interval_s:
                return self._published(now), self.state
        self.suppressed += 1
        return False, self.state

    def reset(self, state: Hashable) -> None:
        """Take ``state`` as the published state, forgetting a change being confirmed (detection
        paused: the state is ``NOTHING``, or no labels for a detector)."""
        self.state, self._pending, self._pending_count = state, None, 0

    def _confirmed(self, state: Hashable) -> bool:
        """Whether ``state`` differs from the published one for ``confirm_frames`` results in a row."""
        if state == self.state:
            self._pending, self._pending_count = None, 0
            return False
        if state == self._pending:
            self._pending_count += 1
        else:
            self._pending, self._pending_count = state, 1
        if self._pending_count >= self.confirm_frames:
            self._pending, self._pending_count = None, 0
            return True
        return False

    def _published(self, now: float | None = None) -> bool:
        self._last_publish = self.clock() if now is None else now
        return True


def state_text(state: Hashable | None) -> str:
    """The state as the text of ``<topic>/state``: a label, labels joined by ',', or 'none'."""
    if isinstance(state, frozenset):
        return ",".join(sorted(state)) or "none"
    return str(state) if state else "none"
