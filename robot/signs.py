"""The sign demo: Vector reads hand signs through its own camera and says what it sees.

    python -m robot.signs --bundle dist/signs-edgetpu --serial 00e20100        # a real robot
    python -m robot.signs --bundle dist/demo-cpu --fake frames/                 # loopback FakeVector

    python -m robot.signs --bundle dist/demo-cpu --fake seq/ --hold 1 --truth seq/truth.csv  # acceptance
    python -m robot.signs --task detect --bundle dist/detector-cpu --serial 00e20100  # boxes on the face

``--task detect`` runs a detector instead (:mod:`robot.boxes`): boxes drawn on the face,
the top label said when it changes.

Vector camera (only the model's crop window, decoded gray at reduced scale from the JPEG)
-> the bundle's preprocessing (the seed's: gray, centre crop, resize) -> runtime -> open-set
gate (not background, score >= ``--min-confidence``, margin over the runner-up >= the fitted
``--min-margin``) -> debounce (``--agree`` gated frames in a row; once per appearance, re-armed
after ``--rearm`` seconds without the label) -> say the label and show it on the face. At the
end it prints the labels said, the camera frame rate against the processed one, latency
percentiles per stage and, with ``--truth``, the acceptance summary. Device side: TensorFlow
is never imported.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from edgekit.errors import CameraError, EdgekitError, UsageError, print_error
from edgekit.metrics import RUN_WINDOW
from edgekit.options import add_runtime_options, runtime_options
from edgekit.pipeline import Pipeline
from robot.cli import add_bundle, add_json, parse, script_parser
from robot.demo import Announcement, DemoReport, Speaker, finish_run, open_robot
from robot.openset import Debouncer, describe_background, gate_thresholds
from robot.report import print_report

__all__ = ["Announcement", "Debouncer", "DemoReport", "background_index", "main", "run_demo"]

SEED_BACKGROUND_INDEX = 26  # the seed's 27-class models: a-z, then background


def background_index(labels: Sequence[str], name: str | None = None) -> int | None:
    """Index of the class that means "no sign": the label ``name`` (default "background"),
    else index 26 of a 27-class model (the seed's layout), else None."""
    wanted = (name or "background").lower()
    for i, label in enumerate(labels):
        if label.strip().lower() == wanted:
            return i
    if name is None and len(labels) == 27:
        return SEED_BACKGROUND_INDEX
    return None


def run_demo(
    source: Any,
    runtime: Any,
    labels: Sequence[str],
    say: Callable[[str], Any] | None = None,
    show: Callable[[str], Any] | None = None,
    debouncer: Debouncer | None = None,
    max_frames: int | None = None,
    duration_s: float | None = None,
    until: Callable[[Any], bool] | None = None,
    warmup: int = 5,
    log: TextIO | None = None,
) -> DemoReport:
    """Run the camera -> model -> debounce -> speech loop until the source ends or a limit.

    Args:
        source: a FrameSource (``VectorSource``; any other works without speech).
        runtime: an open Runtime (LiteRT, ONNX Runtime, ``FakeRuntime``...).
        labels: class names in output order.
        say, show: called with the label to announce; may return a Future (not waited for
            in the loop, so speech never holds up the camera; waited for at the end).
        debouncer: defaults to ``Debouncer(background=background_index(labels))``.
        until: called with each processed frame; True ends the run after it.
        log: where announcements are printed (None: silent).

    A CameraError (robot lost) or Ctrl-C ends the run early: the report still holds what
    was measured, and the exception is in ``report.failure``. The caller owns ``source``
    and ``runtime`` and closes them.
    """
    debouncer = debouncer or Debouncer(background=background_index(labels))
    # edgekit's one frame loop; a bounded sink because a demo may run for hours (--loop).
    # top 2: the margin over the runner-up is the gate's second signal
    pipeline = Pipeline(runtime, labels, top_k=2, warmup=warmup, window=RUN_WINDOW)
    report = DemoReport()
    speaker = Speaker({"face": show, "speech": say}, log)
    try:
        for frame, result in pipeline.steps(source, max_frames, duration_s):
            preds = result.classification.predictions
            top = preds[0]
            margin = top.score - (preds[1].score if len(preds) > 1 else 0.0)
            energy = result.classification.energy
            if debouncer.update(top.index, top.score, margin, frame.t_capture_ns / 1e9, energy) is not None:
                report.announcements.append(speaker.announce(top, frame.index, frame.t_capture_ns))
            if until is not None and until(frame):
                break
    except (CameraError, KeyboardInterrupt) as exc:
        report.failure = exc  # keep what was measured; the caller reports the failure after it
    report.errors = speaker.finish(wait_s=0 if report.failure else 30)
    report.metrics = pipeline.metrics.summary()
    report.announce = speaker.recorder.summary().to_dict()
    stats = getattr(source, "stats", None)
    report.source = stats() if callable(stats) else {}
    return report


# ---------------------------------------------------------------------------------------------
# Command line


EXAMPLES = [
    "python -m robot.signs dist/demo-cpu --fake eval/fashion/bag --fps 15",
    "python -m robot.signs dist/signs-edgetpu --serial 00e20100 --json-file run.json",
    "python -m robot.signs dist/detector-cpu --task detect --serial 00e20100 --min-confidence 0.5",
]
"""Real command lines, shown at the end of --help (tests/test_cli_grammar.py parses each)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m robot.signs`` argument parser."""
    p = script_parser("signs", __doc__, EXAMPLES)
    add_bundle(p, "bundle from edgekit build (a directory, optionally :variant); required unless a test injects one")
    p.add_argument("--task", choices=("classify", "detect"),
                   help="classify: the sign demo (default); detect: a detector's boxes on the face (robot.boxes)")
    p.add_argument("--face-every", type=float, default=0.1, metavar="S",
                   help="--task detect: show a frame with its boxes at most every S seconds (default 0.1)")
    robot = p.add_mutually_exclusive_group(required=True)
    robot.add_argument("--serial", help="the real robot's serial (configured with python -m anki_vector.configure)")
    robot.add_argument("--fake", metavar="FRAMES", help="no robot: a loopback FakeVector showing this image "
                       "folder or video")
    p.add_argument("--min-confidence", type=float, default=0.8, help="score a frame needs to count (default 0.8)")
    p.add_argument("--agree", type=int, default=3, help="frames in a row that must agree (default 3)")
    p.add_argument("--min-margin", type=float, metavar="M",
                   help="score lead over the runner-up a frame needs (default: --thresholds, else the one the "
                   "build fitted (the bundle's manifest), else <bundle>.signs.json, else 0)")
    p.add_argument("--max-energy", type=float, metavar="E",
                   help="for a model that emits logits: the highest energy -logsumexp(z) a frame may have "
                   "(default: the one the build fitted, when it did)")
    p.add_argument("--thresholds", metavar="FILE",
                   help="fitted thresholds (default: <bundle>.signs.json beside the bundle, when there)")
    p.add_argument("--rearm", type=float, default=0.5, metavar="S",
                   help="say the same label again only after S seconds without it (default 0.5)")
    p.add_argument("--truth", metavar="CSV", help="with --fake DIR: file,label per image; prints latency, misses, "
                   "false announcements per minute of background and a confusion summary")
    p.add_argument("--background", metavar="LABEL",
                   help="the no-sign class (default: label 'background', or index 26 of 27 classes)")
    p.add_argument("--show-seconds", type=float, default=2.0, help="how long the label stays on the face")
    p.add_argument("--no-speech", action="store_true", help="show labels on the face but do not speak")
    p.add_argument("--max-frames", type=int, metavar="N", help="stop after N processed frames")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    add_runtime_options(p)
    p.add_argument("--reconnect", action="store_true", help="reconnect when the robot drops out")
    p.add_argument("--connect-timeout", type=float, default=10.0, metavar="S", help="(default 10)")
    fake = p.add_argument_group("fake robot (--fake)")
    fake.add_argument("--fps", type=float, default=15.0, help="camera frame rate (default 15, a real Vector's)")
    fake.add_argument("--hold", type=int, default=10, help="frames each image is shown (default 10)")
    fake.add_argument("--loop", action="store_true", help="repeat the frames until --duration/--max-frames/Ctrl-C")
    add_json(p, "the run's report")
    return p


QUIET_LINES = ("said (", "  items ", "face: ")  # what -q keeps: what was announced, the acceptance totals


def main(argv: Sequence[str] | None = None, runtime: Any = None, labels: Sequence[str] | None = None,
         out: TextIO | None = None) -> int:
    """Entry point. ``runtime``/``labels`` replace the bundle's (tests pass a FakeRuntime).

    Returns the exit code: 0, 1 when the robot failed to say or show an announcement, 2 for
    edgekit errors (message and fix on stderr), 130 on Ctrl-C.
    """
    args = parse(build_parser(), argv)
    out = out or (sys.stderr if args.json is True else sys.stdout)  # --json: stdout holds JSON only
    shown = out
    if args.quiet:  # -q: the summary lines and errors only; the header, log and tables are dropped
        import io

        out = io.StringIO()
    try:
        rc = _run(args, runtime, labels, out)
        if args.quiet:
            for line in out.getvalue().splitlines():
                if line.startswith(QUIET_LINES):
                    print(line.strip(), file=shown)
        return rc
    except EdgekitError as exc:
        return print_error("robot.signs", exc)
    except KeyboardInterrupt:
        print("robot.signs: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, runtime: Any, labels: Sequence[str] | None, out: TextIO) -> int:
    from contextlib import ExitStack

    if args.task == "detect":
        from robot.boxes import main_boxes

        return main_boxes(args, runtime, labels, out)
    if args.agree < 1 or not 0.0 <= args.min_confidence <= 1.0 or args.rearm < 0:
        raise UsageError("--agree must be >= 1, --min-confidence within 0..1 and --rearm >= 0")
    truth = _load_truth(args)
    with ExitStack() as stack:
        runtime, labels, name = _open_runtime(args, runtime, labels, stack)
        background = background_index(labels, args.background)
        if args.background and background is None:
            raise UsageError(f"no label {args.background!r} in the model's labels")
        min_margin, max_energy, fitted = gate_thresholds(args.bundle, args.thresholds, args.min_margin,
                                                         args.max_energy)
        source, serial, until = open_robot(args, stack, getattr(runtime, "input_spec", None))
        describe = runtime.describe() if hasattr(runtime, "describe") else {}
        print(f"robot.signs: Vector {serial}{' (fake)' if args.fake else ''}; model {name} "
              f"[{describe.get('backend', '?')} {describe.get('version', '')}]; {len(labels)} labels, "
              f"background: {labels[background] if background is not None else 'none'}; "
              f"gate: score >= {args.min_confidence}, margin >= {min_margin:g}"
              f"{'' if max_energy is None else f', energy <= {max_energy:g}'}{fitted}", file=out)
        warning = describe_background(labels, background)
        if warning:
            print(warning, file=out)
        debouncer = Debouncer(args.agree, args.min_confidence, background, args.rearm, min_margin, max_energy)
        say = None if args.no_speech else (lambda text: source.say(text, wait=False))

        def show(text: str) -> Any:
            return source.show(text, duration_s=args.show_seconds, wait=False)

        report = run_demo(source, runtime, labels, say=say, show=show, debouncer=debouncer,
                          max_frames=args.max_frames, duration_s=args.duration, until=until,
                          log=None if args.quiet else out)
        print_report(report, out)
        return finish_run(args, report, truth, background, labels, out)


def _open_runtime(args: argparse.Namespace, runtime: Any, labels: Sequence[str] | None,
                  stack: Any) -> tuple[Any, list[str], str]:
    """The bundle's runtime and labels (or the injected ones), closed by ``stack``."""
    if runtime is None:
        if not args.bundle:
            raise UsageError("no bundle given", "give BUNDLE[:VARIANT] first; build one with: edgekit build MODEL "
                             "--target cpu")
        from edgekit.model import open_model

        model = stack.enter_context(open_model(args.bundle, **runtime_options(args)))
        if model.task != "classify":
            raise UsageError(f"{model.name} is a {model.task} model, not a sign classifier",
                             "add --task detect for a detector")
        return model.runtime, list(labels or model.labels), model.name
    if labels is None and args.bundle:
        from edgekit.bundle import load_bundle

        labels = load_bundle(args.bundle, allow_rejected=True).labels
    return runtime, list(labels or []), getattr(runtime, "name", type(runtime).__name__)


def _load_truth(args: argparse.Namespace) -> list[str] | None:
    if not args.truth:
        return None
    if not args.fake or args.loop:
        raise UsageError("--truth needs --fake DIR (one pass, no --loop)")
    from robot.acceptance import frame_truth

    return frame_truth(args.truth, args.fake, args.hold)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
