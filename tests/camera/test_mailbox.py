"""The camera's newest-frame mailbox between threads: waits for a frame, never waits past its timeout.

Threads here are real; the joins have a generous limit only so a broken mailbox fails the test
instead of hanging it (no speed is asserted).
"""

from __future__ import annotations

import threading

from edgekit.camera.mailbox import FrameMailbox

HANG = 30  # seconds: far beyond any wait below; reaching it means the mailbox hung


def _take_in_thread(box: FrameMailbox, timeout: float) -> tuple[threading.Thread, list]:
    got: list = []
    t = threading.Thread(target=lambda: got.append(box.take(timeout)), daemon=True)
    t.start()
    return t, got


def test_a_fresh_mailbox_is_open_and_a_take_waits_for_the_next_put():
    box = FrameMailbox()
    assert box.closed is False
    t, got = _take_in_thread(box, HANG)
    box.put("frame")  # whether take is already waiting or not, it must get this frame
    t.join(HANG)
    assert not t.is_alive() and got == ["frame"]


def test_an_empty_take_returns_none_after_its_timeout():
    box = FrameMailbox()
    t, got = _take_in_thread(box, 0.01)
    t.join(HANG)
    assert not t.is_alive() and got == [None]


def test_a_waiting_take_is_released_by_close_and_later_takes_do_not_wait():
    box = FrameMailbox()
    t, got = _take_in_thread(box, HANG * 10)
    box.close()
    t.join(HANG)
    assert not t.is_alive() and got == [None] and box.closed
    t, got = _take_in_thread(box, HANG * 10)
    t.join(HANG)
    assert not t.is_alive() and got == [None]
