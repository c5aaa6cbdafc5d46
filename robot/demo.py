"""What the sign demo (:mod:`robot.signs`) and its detector mode (:mod:`robot.boxes`) share: the
connection to the robot (real or a loopback fake), the announcer that says and shows a label without
waiting for the robot, the run's report and how a run ends (acceptance summary, JSON, exit code).

Both demos import this module; it imports neither (it used to live in ``robot.signs``, which
``robot.boxes`` imported back: an import cycle).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from edgekit.metrics import RUN_WINDOW, LatencyRecorder

__all__ = ["Announcement", "DemoReport", "Speaker", "finish_run", "model_window", "open_robot"]


@dataclass
class Announcement:
    """One label said: which frame triggered it and how confident the model was."""

    label: str
    index: int
    frame: int
    score: float
    t_ns: int
    t_capture_ns: int = 0  # when the frame that triggered it was captured
    failed: str | None = None  # why the face or speech did not deliver it (None: delivered)


@dataclass
class DemoReport:
    """What a demo run did: labels said, frame accounting and per-stage latency statistics."""

    announcements: list[Announcement] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    announce: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    failure: BaseException | None = None  # what ended the run early (camera lost, Ctrl-C)

    @property
    def said(self) -> list[str]:
        """The labels the robot delivered (an announcement whose speech or face failed is not)."""
        return [a.label for a in self.announcements if a.failed is None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "said": self.said,
            "announcements": [a.__dict__ for a in self.announcements],
            "pipeline": self.metrics,
            "source": self.source,
            "announce_ms": self.announce,
            "errors": self.errors,
            "failure": str(self.failure) if self.failure else None,
        }



class Speaker:
    """Calls the announce actions (face, speech) without waiting for them, timing each call."""

    def __init__(self, actions: dict[str, Callable[[str], Any] | None], log: TextIO | None):
        self.actions = {name: a for name, a in actions.items() if a is not None}
        self.log = log
        self.recorder = LatencyRecorder("announce", window=RUN_WINDOW)
        self.pending: list[tuple[Announcement, str, concurrent.futures.Future]] = []

    def announce(self, top: Any, frame_index: int, t_capture_ns: int = 0) -> Announcement:
        """Say and show ``top.label`` (Futures are kept, not waited for: speech never holds up the camera)."""
        now = time.perf_counter_ns
        t0 = now()
        outcomes = [(name, action(top.label)) for name, action in self.actions.items()]
        self.recorder.add(now() - t0)
        if self.log is not None:
            print(f"said: {top.label}  (frame {frame_index}, score {top.score:.3f})", file=self.log, flush=True)
        said = Announcement(top.label, top.index, frame_index, top.score, now(), t_capture_ns)
        self.pending += [(said, name, f) for name, f in outcomes if isinstance(f, concurrent.futures.Future)]
        return said

    def finish(self, wait_s: float) -> list[str]:
        """Wait up to ``wait_s`` in all for the pending actions; one line per action that failed
        or did not finish (its announcement is marked ``failed``)."""
        done, _ = concurrent.futures.wait([f for _, _, f in self.pending], timeout=wait_s)
        errors = []
        for said, name, fut in self.pending:
            if fut not in done:
                problem = f"{name} not finished {'when the run ended' if wait_s <= 0 else f'after {wait_s:g} s'}"
            elif fut.exception() is not None:
                exc = fut.exception()
                problem = f"{name} failed: {str(exc) or type(exc).__name__}"
            else:
                continue
            said.failed = said.failed or problem
            errors.append(f"{said.label!r} (frame {said.frame}): {problem}")
        return errors



def finish_run(args: argparse.Namespace, report: DemoReport, truth: list[str] | None, background: int | None,
            labels: Sequence[str], out: TextIO) -> int:
    """Acceptance summary (with --truth), the JSON report, and the failure that ended the run.

    Returns the exit code: 1 when an announcement was not delivered (speech or face failed),
    else 0; a failure that ended the run early is raised."""
    data = report.to_dict()
    if truth is not None:
        from robot.acceptance import print_acceptance, score_run

        bg_label = labels[background] if background is not None else "background"
        acceptance = score_run(report.announcements, truth, args.fps, bg_label, rearm_s=args.rearm)
        print_acceptance(acceptance, out)
        data["acceptance"] = acceptance
    from robot.cli import emit_json

    emit_json(args, data)  # --json: one line on stdout; --json-file: the file (NaN as null)
    if report.failure is not None:
        raise report.failure
    if report.errors:
        print(f"robot.signs: {len(report.errors)} announcement action(s) failed; the robot did not say or show "
              "everything (see the warnings)", file=sys.stderr)
        return 1
    return 0



def model_window(spec: Any) -> tuple[int, int] | None:
    """(width, height) of the window of a Vector frame the model reads (its crop), for the fake
    to hold small images up in; None when the model reads the whole frame."""
    from edgekit.imaging.imgops import crop_window
    from edgekit.vector.fake_frames import CAMERA_SIZE

    crop = getattr(spec, "crop", None)
    if crop is None or crop == "none":
        return None
    _top, _left, height, width = crop_window(CAMERA_SIZE[1], CAMERA_SIZE[0], crop)
    return width, height


def open_robot(args: argparse.Namespace, stack: Any,
                spec: Any = None) -> tuple[Any, str, Callable[[Any], bool] | None]:
    """Connect to the real robot (--serial) or a loopback FakeVector (--fake), closed by ``stack``.

    Returns the camera source, the robot's serial and, for one pass over a fake's frames,
    the ``until`` test that ends the run after the last one. ``spec`` (the model's input)
    makes the source hand over only the model's window, decoded the fast way.
    """
    from edgekit.vector.camera import VectorSource

    until = None
    if args.fake:
        from edgekit.vector.fake import FakeVector

        fake = stack.enter_context(FakeVector(args.fake, fps=args.fps, hold=args.hold, loop=args.loop,
                                              window=model_window(spec)))
        serial, home = fake.serial, fake.home
        if not args.loop:
            # one pass: stop once the frame the fake sent last has been processed
            def until(frame, fake=fake):
                return fake.exhausted.is_set() and frame.index >= fake.frame_count
    else:
        serial, home = args.serial, None
    source = VectorSource(serial, config_home=home, connect_timeout_s=args.connect_timeout,
                          reconnect=args.reconnect, prepare=spec)
    stack.callback(source.close)
    source.open()
    return source, serial, until
