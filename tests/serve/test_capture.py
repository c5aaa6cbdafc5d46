"""serve/capture.py: a live camera is read by its own grabber thread alone, into the daemon's one mailbox."""

from __future__ import annotations

import threading
import time

import numpy as np

from edgekit.camera import LatestFrameSource
from edgekit.camera.mailbox import FrameMailbox
from edgekit.serve.capture import Capture
from edgekit.serve.config.load import CameraConfig
from edgekit.serve.stats import Counters
from tests.helpers.waiting import wait_until


class RecordingMailbox(FrameMailbox):
    """The daemon's mailbox, noting which thread put each frame."""

    def __init__(self):
        super().__init__()
        self.puts: list[tuple[str, int]] = []

    def put(self, frame):
        self.puts.append((threading.current_thread().name, frame.index))
        return super().put(frame)


def live(name="live", **kw):
    def read():
        time.sleep(0.002)
        return True, np.zeros((4, 4, 3), np.uint8)

    return LatestFrameSource(read, name=name, **kw)


def capture(factory, mailbox):
    stop = threading.Event()
    config = CameraConfig(uri="live", reconnect_min_s=0.01, reconnect_max_s=0.05)
    return Capture(config, factory, mailbox, Counters(), stop, time.perf_counter_ns), stop


def test_a_live_camera_fills_the_daemons_mailbox_from_its_grabber_thread_alone(monkeypatch):
    def no_iteration(self):
        raise AssertionError("the daemon iterated the live source: a second thread copying frames")

    monkeypatch.setattr(LatestFrameSource, "__next__", no_iteration)
    mailbox = RecordingMailbox()
    cap, stop = capture(lambda uri, options: live(), mailbox)
    cap.start()
    try:
        taken = [wait_until(lambda: mailbox.take(0.05), what="a frame") for _ in range(3)]
        assert [f.index for f in taken] == sorted(f.index for f in taken)
        # one thread reads the camera, one mailbox holds its frame; the hand-over may carry the one frame
        # grabbed before it, and only first: a newer frame is never replaced by an older one
        grabbed = [name for name, _ in mailbox.puts[1:]]
        assert set(grabbed) == {"edgekit-grab live"}
        indices = [index for _, index in mailbox.puts]
        assert indices == sorted(indices) and len(set(indices)) == len(indices)
        counts = cap._counters.snapshot()["frames"]
        assert counts["captured"] >= 3 and cap.is_open and cap.last_frame_ns is not None
        stats = cap.source_stats()
        assert stats["delivered"] + stats["skipped"] <= stats["captured"]
    finally:
        stop.set()
        cap.join(2.0)
    assert cap.source is None  # closed on the way out


def test_a_live_camera_that_stalls_is_reopened():
    opened = []

    def factory(uri, options):
        n = len(opened)
        opened.append(n)
        if n == 0:  # the first camera delivers two frames and goes silent
            frames = iter([True, True])
            return LatestFrameSource(lambda: (next(frames, False), np.zeros((4, 4), np.uint8)),
                                     name="stalls", timeout_s=0.2, open_timeout_s=0.5)
        return live("healthy")

    mailbox = FrameMailbox()
    cap, stop = capture(factory, mailbox)
    cap.start()
    try:
        wait_until(lambda: len(opened) >= 2, what="the stalled camera reopened")
        wait_until(lambda: cap._counters.get("reconnects", "camera") >= 1, what="a reconnect counted")
        assert cap._counters.get("errors", "camera") >= 1
        assert "stopped delivering frames" in cap.error
        wait_until(lambda: mailbox.take(0.05), what="frames from the reopened camera")
    finally:
        stop.set()
        cap.join(2.0)


def test_a_grabber_that_dies_is_reported_as_next_would_have_raised_it():
    class Bug(BaseException):  # not an Exception: the grabber does not count it as a read error
        pass

    def read():
        raise Bug("boom")

    source = LatestFrameSource(read, name="buggy")
    mailbox = FrameMailbox()
    source.deliver_to(mailbox)
    try:
        problem = wait_until(source.problem, what="the failed grabber reported")
        assert "frame grabber failed (Bug: boom)" in str(problem)
        assert mailbox.closed  # the grabber's end reached the mailbox it delivers to
    finally:
        source.close()
