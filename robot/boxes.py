"""``python -m robot.signs --task detect``: Vector runs a detector and shows what it sees on its face.

    python -m robot.signs --task detect --bundle dist/detector-cpu --fake clip.mp4 --min-confidence 0.5

Vector camera -> the detector bundle (the ``detect`` task head: decode, NMS, boxes in the
frame's pixels) -> the camera view with the boxes drawn on the 184x96 face screen (newest
frame whenever the screen is free, at most every ``--face-every`` seconds), and the top
box's label said when it changes (the sign demo's debounce: ``--agree`` frames in a row at
``--min-confidence``, said again only after ``--rearm`` seconds without it). Nothing
detected: quiet. The end-of-run report is the sign demo's, with the face's cost as a stage.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from edgekit.errors import CameraError, UsageError
from edgekit.metrics import RUN_WINDOW, LatencyRecorder
from edgekit.pipeline import Pipeline
from robot.demo import DemoReport, Speaker, finish_run, open_robot
from robot.openset import Debouncer
from robot.report import print_report

NOTHING = -1  # the debouncer's "class" of a frame without a box: never said


class _Face:
    """Shows frames with their boxes on the face without ever waiting for the robot: a frame is
    drawn only when the previous one was taken (its Future is done) and ``every_s`` has passed."""

    def __init__(self, show: Callable[[Any], Any] | None, every_s: float):
        self.show, self.every_s = show, every_s
        self.recorder = LatencyRecorder("face", window=RUN_WINDOW)  # draw + encode + hand over
        self.shown = 0
        self.errors: list[str] = []
        self._pending: concurrent.futures.Future | None = None
        self._next = 0.0

    def offer(self, frame: Any, result: Any) -> None:
        from edgekit.vector.face import render_result

        now = time.monotonic()
        if self.show is None or now < self._next or not self._free():
            return
        t0 = time.perf_counter_ns()
        outcome = self.show(render_result(frame, result))
        self.recorder.add(time.perf_counter_ns() - t0)
        self._pending = outcome if isinstance(outcome, concurrent.futures.Future) else None
        self.shown += 1
        self._next = now + self.every_s

    def _free(self) -> bool:
        if self._pending is None or not self._pending.done():
            return self._pending is None
        exc = self._pending.exception()
        if exc is not None:
            self.errors.append(f"face: {exc}")
        self._pending = None
        return True

    def finish(self, wait_s: float) -> list[str]:
        if self._pending is not None:
            try:
                self._pending.result(timeout=wait_s)
            except Exception as exc:  # noqa: BLE001 - reported with the run, which still counts
                self.errors.append(f"face: {str(exc) or type(exc).__name__}")
        return self.errors


def run_boxes(
    source: Any,
    runtime: Any,
    labels: Sequence[str],
    say: Callable[[str], Any] | None = None,
    show: Callable[[Any], Any] | None = None,
    debouncer: Debouncer | None = None,
    task_options: dict[str, Any] | None = None,
    max_frames: int | None = None,
    duration_s: float | None = None,
    until: Callable[[Any], bool] | None = None,
    warmup: int = 5,
    face_every_s: float = 0.1,
    log: TextIO | None = None,
) -> DemoReport:
    """The camera -> detector -> face + speech loop (arguments as :func:`robot.signs.run_demo`;
    ``show`` takes a 96x184 RGB image; ``task_options`` are the detect head's)."""
    debouncer = debouncer or Debouncer(agree=3, min_confidence=0.5)
    pipeline = Pipeline(runtime, labels, warmup=warmup, window=RUN_WINDOW, task="detect", task_options=task_options)
    report = DemoReport()
    speaker, face = Speaker({"speech": say}, log), _Face(show, face_every_s)
    try:
        for frame, result in pipeline.steps(source, max_frames, duration_s):
            face.offer(frame.array, result.result)
            top = result.result.top
            vote = debouncer.update(NOTHING if top is None else top.index, 0.0 if top is None else top.score,
                                    1.0, frame.t_capture_ns / 1e9)
            if vote is not None and top is not None:
                report.announcements.append(speaker.announce(top, frame.index, frame.t_capture_ns))
            if until is not None and until(frame):
                break
    except (CameraError, KeyboardInterrupt) as exc:
        report.failure = exc
    wait = 0 if report.failure else 30
    report.errors = speaker.finish(wait_s=wait) + face.finish(wait_s=wait)
    report.metrics = pipeline.metrics.summary()
    report.metrics["stages"]["face"] = face.recorder.summary().to_dict()
    report.metrics["face_shown"] = face.shown
    report.announce = speaker.recorder.summary().to_dict()
    stats = getattr(source, "stats", None)
    report.source = stats() if callable(stats) else {}
    return report


def main_boxes(args: argparse.Namespace, runtime: Any, labels: Sequence[str] | None, out: TextIO) -> int:
    """``--task detect`` of ``python -m robot.signs`` (its arguments; ``runtime``/``labels`` injected by tests)."""
    from contextlib import ExitStack

    if args.truth:
        raise UsageError("--truth scores the sign classifier; it does not apply to --task detect")
    if args.agree < 1 or not 0.0 <= args.min_confidence <= 1.0 or args.rearm < 0 or args.face_every < 0:
        raise UsageError("--agree must be >= 1, --min-confidence within 0..1, --rearm and --face-every >= 0")
    with ExitStack() as stack:
        runtime, labels, name, options = _open_detector(args, runtime, labels, stack)
        source, serial, until = open_robot(args, stack, getattr(runtime, "input_spec", None))
        describe = runtime.describe() if hasattr(runtime, "describe") else {}
        print(f"robot.signs: Vector {serial}{' (fake)' if args.fake else ''}; detector {name} "
              f"[{describe.get('backend', '?')} {describe.get('version', '')}]; {len(labels)} labels; "
              f"says the top box's label at score >= {args.min_confidence}", file=out)
        say = None if args.no_speech else (lambda text: source.say(text, wait=False))

        def show(image: Any) -> Any:
            return source.show(image, duration_s=args.show_seconds, wait=False)

        report = run_boxes(source, runtime, labels, say=say, show=show, task_options=options,
                           debouncer=Debouncer(args.agree, args.min_confidence, None, args.rearm),
                           max_frames=args.max_frames, duration_s=args.duration, until=until,
                           face_every_s=args.face_every, log=None if args.quiet else out)
        print_report(report, out)
        print(f"face: {report.metrics['face_shown']} frames with boxes shown", file=out)
        return finish_run(args, report, None, None, labels, out)


def _open_detector(args: argparse.Namespace, runtime: Any, labels: Sequence[str] | None,
                   stack: Any) -> tuple[Any, list[str], str, dict[str, Any]]:
    """The bundle opened as a detector (its task options kept), or the injected runtime."""
    if runtime is not None:
        return runtime, list(labels or []), getattr(runtime, "name", type(runtime).__name__), {}
    if not args.bundle:
        raise UsageError("no bundle given", "give a detector's bundle first (task detect in its edgekit.json)")
    from edgekit.model import open_model
    from edgekit.options import runtime_options

    model = stack.enter_context(open_model(args.bundle, **{**runtime_options(args), "task": "detect"}))
    return model.runtime, list(labels or model.labels), model.name, model.task_options
