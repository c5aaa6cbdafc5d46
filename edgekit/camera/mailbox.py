"""The newest-frame mailbox: one slot between a producer thread and a consumer.

A camera that outruns the model overwrites the untaken frame instead of queueing it, so a
slow consumer always gets the latest frame and latency stays bounded however long it runs.
"""

from __future__ import annotations

import threading
from typing import Any


class FrameMailbox:
    """A one-slot mailbox between the capture thread and the inference loop.

    ``put`` replaces an untaken frame (and says so: that frame is skipped); ``take`` waits
    for a frame. No queue can build up, so a slow model never sees stale frames. ``close``
    is for a producer that has ended: unlike ``wake`` it is sticky, so a consumer that
    was about to wait does not sleep through it. All methods are thread-safe.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._frame: Any = None
        self._closed = False

    def put(self, frame: Any) -> bool:
        """Offer the newest frame; True when it replaced one that was never taken."""
        with self._cond:
            dropped = self._frame is not None
            self._frame = frame
            self._cond.notify()
        return dropped

    def take(self, timeout: float) -> Any:
        """The newest frame, waiting up to ``timeout`` seconds; None if none arrived (or
        early, after ``wake``; immediately when closed and empty)."""
        with self._cond:
            if self._frame is None and not self._closed:
                self._cond.wait(timeout)
            frame, self._frame = self._frame, None
        return frame

    def wake(self) -> None:
        """Release a waiting ``take`` early (used on stop)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """No more frames will come: wake every waiting ``take`` and make later ones return
        at once (a frame already put can still be taken)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed
