"""``edgekit run``: run a bundle (or bare model) on a camera, printing results and stage latencies.

    edgekit run dist/demo-cpu --camera file:clip.mp4
    edgekit run dist/demo-edgetpu --camera v4l2:0 --device usb:0
    edgekit run model.tflite --camera synthetic --max-frames 200 --json
    edgekit run face.tflite --camera v4l2:0 --mean 127.5 --std 127.5        # a bare model's preprocessing
    edgekit run dist/detector-cpu --camera file:clip.mp4 --save out/      # frames with boxes drawn

Results are printed live (at most every ``--every`` seconds, or one JSON line per frame
with ``--json``), a stats line every ``--stats-every`` seconds, and a summary at the end.
Ctrl-C (or SIGTERM) ends the run cleanly: the summary is still printed, then the exit code is
130 (143 for SIGTERM), as for every verb, so a script can tell a stopped run from a finished one.
``--save DIR`` writes every processed frame with its result drawn (boxes and labels for a
detector, the top label for a classifier) as ``DIR/frame_000001.jpg`` ... (a folder's images keep
their names: ``000.jpg`` -> ``DIR/000.jpg``; each line and JSON object names its image); ``--save out.mp4``
(or ``.avi``) writes them as one video. Either appears only when the run ends (written under a
temporary name, then renamed); a write failure is one line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from edgekit.errors import CameraError, CameraUnavailable, EdgekitError, UsageError
from edgekit.modelinfo.preprocessing import add_preprocess_options, preprocess_flags
from edgekit.options import (
    MotionFilter,
    add_bundle_options,
    add_camera_options,
    add_cascade_options,
    add_deprecated_alias,
    add_motion_options,
    add_runtime_options,
    at_least,
    camera_help,
    camera_options,
    runtime_options,
)
from edgekit.outputs.recording import SaveError
from edgekit.runtime import describe_runtime
from edgekit.util.finite_json import strict_dumps


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit run``'s arguments."""
    parser.add_argument("model", metavar="BUNDLE_OR_MODEL", help="bundle dir (BUNDLE[:VARIANT]) or .tflite/.onnx")
    parser.add_argument(
        "--camera",
        required=True,
        metavar="URI",
        help=camera_help("file:clip.mp4, folder:DIR, synthetic[:WxH[@fps]], v4l2:N, rtsp://..."),
    )
    add_camera_options(parser)
    parser.add_argument("--variant", metavar="VARIANT",
                        help="which model of the bundle (fp32, int8...); or write BUNDLE:VARIANT")
    add_deprecated_alias(parser, "--model", "--variant")  # --model meant the bundle in serve: one name, one meaning
    add_runtime_options(parser)
    add_bundle_options(parser)
    add_preprocess_options(parser)
    add_cascade_options(parser)
    add_motion_options(parser)
    parser.add_argument("--max-frames", type=at_least(1), metavar="N", help="stop after N results")
    # 0 ran forever (a zero duration read as "no limit"): the shortest run is a millisecond
    parser.add_argument("--duration", type=at_least(0.001, float), metavar="S", help="stop after S seconds")
    parser.add_argument("--top-k", type=at_least(1), default=3, help="classes shown per frame (default 3)")
    parser.add_argument("--warmup", type=at_least(0), default=5, help="frames left out of the statistics (default 5)")
    parser.add_argument(
        "--every",
        type=at_least(0.0, float),
        default=None,
        metavar="S",
        help="print a result at most every S seconds (0: every frame; default 0.5; 0 for a folder or an image "
             "file, whose every frame is a picture someone chose)",
    )
    parser.add_argument(
        "--stats-every", type=at_least(0.0, float), default=2.0, metavar="S",
        help="print a stats line every S seconds (default 2)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per frame on stdout, summary last")
    parser.add_argument("--tensors", action="store_true", help="raw task: every output's values in the JSON lines")
    parser.add_argument("--save", metavar="DIR|FILE.mp4",
                        help="write the frames with the results drawn: a folder (one JPEG per frame) or a .mp4/.avi "
                        "video; it appears when the run ends")


def main(args: argparse.Namespace) -> int:
    """Run the model on the camera until the source ends, a limit is reached or Ctrl-C."""
    if args.max_frames is not None and args.max_frames < 1:
        raise UsageError("--max-frames must be at least 1")
    from edgekit.outputs.outstream import guarded_stdout

    # SIGTERM is an interrupt from here on: while the model loads or the camera opens too (it
    # killed the process there, leaving --save's temporary file or folder behind)
    with _sigterm_interrupts():
        recording = None
        if getattr(args, "save", None):
            from edgekit.outputs.recording import open_recording

            recording = open_recording(args.save)  # before the model loads: a bad --save fails at once
        try:
            with guarded_stdout():  # `--json > file` on a full disk: one error line, not an OSError traceback
                return _run(args, recording)
        except BaseException:
            if recording is not None:
                recording.abort()  # nothing half-written
            raise


def _run(args: argparse.Namespace, recording: Any) -> int:
    from edgekit.metrics import RUN_WINDOW
    from edgekit.model import open_model
    from edgekit.pipeline import Pipeline

    out: TextIO = sys.stdout
    log: TextIO = sys.stderr if args.json else sys.stdout  # keep stdout pure JSON with --json
    with open_model(args.model, args.variant, args.labels, preprocess=preprocess_flags(args),
                    **runtime_options(args)) as model, _second_model(args) as second:
        from edgekit.runtime.fit import check_backend_fits

        check_backend_fits(getattr(args, "backend", None), model.runtime)
        then = _second_stage(model, second, args)
        info = model.runtime.describe()
        if args.json or not args.quiet:
            _print_header(model, info, args, out if args.json else log)
        from edgekit.camera import open_camera

        source = open_camera(args.camera, model.runtime, **camera_options(args))  # imx500 reads the backend's camera
        motion = MotionFilter.from_args(args)
        # bounded: a week-long run must not grow; totals and fps stay exact (edgekit.metrics)
        pipeline = Pipeline(model.runtime, model.labels, top_k=args.top_k, warmup=args.warmup, window=RUN_WINDOW,
                            task=model.task, task_options={**model.task_options, **_tensors(args)}, then=then)
        interrupted, signum = False, 0
        error: EdgekitError | None = None
        try:
            if recording is not None and recording.fps is None:
                recording.fps = _source_stats(source).get("nominal_fps")  # a video plays at the camera's rate
            _loop(pipeline, motion.frames(source), args, out, log, recording)
        except KeyboardInterrupt as exc:
            interrupted = True
            signum = getattr(exc, "signum", None) or signal.SIGINT  # 128 + it below, after the summary
        except BrokenPipeError:  # the reader left (`--json | head`): end as Ctrl-C does, --save's frames kept
            from edgekit.outputs.outstream import discard_stdout

            interrupted = True
            discard_stdout()
        except (CameraError, SaveError) as exc:
            error = exc  # print what was measured before reporting the failure
        finally:
            source_stats = _source_stats(source)
            source.close()
        summary = pipeline.metrics.summary()
        summary["source"] = source_stats
        motion.summarise(summary)
        summary["interrupted"] = interrupted
        _print_summary(summary, args, out, log)
        if error is not None:
            raise error
        if pipeline.metrics.frames == 0 and not interrupted:  # Ctrl-C before the first frame: not the camera's fault
            raise CameraUnavailable(
                f"camera {_shown(args.camera)} delivered no usable frames",
                "check the URI and that the camera/file has frames",
            )
        _finish(recording, log, args)
    return 128 + signum if signum else 0  # the exit-code table's 130/143: stopped, not finished


@contextlib.contextmanager
def _second_model(args: argparse.Namespace) -> Iterator[Any]:
    """The ``--then`` model, open for the run (None without one)."""
    if not getattr(args, "then", None):
        for flag in ("roi", "track_roi"):
            if getattr(args, flag, None):
                raise UsageError(f"--{flag.replace('_', '-')} without --then",
                                 "add --then SECOND[:VARIANT], the model to run on each region")
        yield None
        return
    from edgekit.model import open_model
    from edgekit.options import cascade_model_options

    with open_model(args.then, **cascade_model_options(args)) as second:
        yield second


def _second_stage(model: Any, second: Any, args: argparse.Namespace) -> Any:
    """The cascade's second stage, or None; refused in one line when the first model is no detector."""
    if second is None:
        return None
    if model.task != "detect":
        raise UsageError(f"--then needs a detector first; {model.name} is a {model.task} model",
                         "give a detect bundle (or --task detect) before --then")
    from edgekit.cascade import second_stage

    return second_stage(second, args.roi, getattr(args, "track_roi", None))


def _finish(recording: Any, log: TextIO, args: argparse.Namespace) -> None:
    """Move the recording into place and say where it is."""
    if recording is None:
        return
    path = recording.finish()
    if not args.quiet:
        log.write(f"saved {recording.frames} frames to {path}\n")
        log.flush()


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (systemd, ``timeout``, ``kill``) ends the run as Ctrl-C does: summary printed,
    recording finished. Only the main thread can set a handler; elsewhere nothing changes."""
    def interrupt(signum: int, frame: Any) -> None:
        exc = KeyboardInterrupt()
        exc.signum = signum  # the CLI exits 128 + signum (143) when it ends the run before the first frame
        raise exc

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _loop(pipeline, source, args, out: TextIO, log: TextIO, recording: Any = None) -> None:
    """The live loop: results, throttled printing, periodic stats, frames drawn to ``recording``."""
    now = time.monotonic
    next_print = next_stats = now()
    stills = _is_stills(args.camera)  # each frame is an image file: its name is said and kept
    every = args.every if args.every is not None else (0.0 if stills else 0.5)
    crop = pipeline.preprocess.spec.crop  # the classifier overlay outlines the window the model saw
    if recording is not None:
        from edgekit.outputs.overlay import draw
    for frame, result in pipeline.steps(source, max_frames=args.max_frames, duration_s=args.duration):
        image = result.source if stills and result.source else None
        if recording is not None:
            recording.write(draw(frame.array, result.result, crop=crop), frame.t_capture_ns, image)
        t = now()
        if args.json:
            out.write(strict_dumps(result.to_dict()) + "\n")
            out.flush()  # a consumer piping the stream sees each frame as it happens
        elif t >= next_print:
            top = str(result.result)
            # an image file by its name; a camera's frame by the camera and its capture time (UTC)
            named = f"  {_file_name(image)}" if image else (f"  {result.source} {result.captured[11:23]}"
                                                            if result.source else "")
            out.write(f"frame {result.index:6d}{named}  {top}   e2e {result.timings_ms['end_to_end']:.2f} ms\n")
            next_print = t + every
            out.flush()
        if args.stats_every and not args.quiet and t >= next_stats + args.stats_every:
            log.write(f"[stats] {pipeline.metrics.stats_line()}\n")
            log.flush()
            next_stats = t


def _file_name(path: str) -> str:
    """An image's file name for the text line (``--json`` has its path as the folder was given)."""
    from pathlib import Path

    return Path(path).name


def _is_stills(uri: str) -> bool:
    """A folder of images, or one image file: each frame is a picture the user chose to see."""
    from pathlib import Path

    if uri.startswith("folder:") or (":" not in uri and Path(uri).is_dir()):
        return True
    path = uri[5:] if uri.startswith("file:") else uri
    return Path(path).suffix.lower() in {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


def _source_stats(source: Any) -> dict:
    stats = getattr(source, "stats", None)
    try:
        return dict(stats()) if callable(stats) else {}
    except Exception:  # a broken camera must not hide the measured numbers
        return {}


def _tensors(args: argparse.Namespace) -> dict[str, Any]:
    """``--tensors``: the raw head's ``tensors`` option (other heads refuse it by name)."""
    return {"tensors": True} if getattr(args, "tensors", False) else {}


def _print_header(model, info: dict, args, out: TextIO) -> None:
    if args.json:
        out.write(strict_dumps({"model": model.name, "camera": _shown(args.camera), "runtime": info, "task": model.task,
                              "assumed_input": model.assumed_input(), "input_from": model.origin or None}) + "\n")
        return
    out.write(f"edgekit run: {model.name} on {_shown(args.camera)}: {describe_runtime(info)}; task {model.task}\n")
    if model.assumed_input():
        out.write(f"  input: {model.assumed_input()}\n")


def _shown(uri: str) -> str:
    """The camera URI as printed and logged: a stream's password is not (``rtsp://***@host``)."""
    from edgekit.camera import redact_uri

    return redact_uri(uri)


def _print_summary(summary: dict, args, out: TextIO, log: TextIO) -> None:
    if args.json:
        out.write(strict_dumps({"summary": summary}) + "\n")
        out.flush()
        return
    log.write(format_summary(summary))
    log.flush()


def format_summary(summary: dict) -> str:
    """The end-of-run summary as a small text table."""
    width = max([14, *(len(stage) + 2 for stage in summary["stages"])])  # a cascade's second_stage@k=N
    # every frame warm-up: nothing was timed, so say so instead of "fps 0.0" over a table of dashes
    warm_only = bool(summary["frames"]) and summary["frames"] <= summary["warmup"]
    fps = f"n/a (all {summary['frames']} frames were warm-up)" if warm_only else f"{summary['fps']:.1f}"
    lines = [
        f"summary: {summary['frames']} frames ({summary['warmup']} warm-up), fps {fps}, "
        f"skipped {summary['skipped']}, corrupt {summary['corrupt']}"
        + (", interrupted" if summary.get("interrupted") else ""),
        f"  init {_ms(summary.get('init_ms'))}, first inference {_ms(summary.get('first_inference_ms'))}",
        "  no timings: give --warmup 0, or more frames than --warmup (default 5)" if warm_only else
        f"  {'stage':<{width}}{'n':>7}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}{'max':>9}  (ms)",
    ]
    for stage, s in {} if warm_only else summary["stages"].items():
        lines.append(f"  {stage:<{width}}{s['count']:>7}" + "".join(
            _cell(s[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "max_ms")))
    if summary.get("motion"):
        lines.append("  motion: " + ", ".join(f"{k} {v}" for k, v in summary["motion"].items()))
    if summary.get("source"):
        lines.append("  source: " + ", ".join(f"{k} {_short(v)}" for k, v in summary["source"].items()))
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    """A latency in the summary table; ``-`` where nothing was measured (all frames were warm-up)."""
    return f"{value:>9.3f}" if isinstance(value, (int, float)) and value == value else f"{'-':>9}"


def _short(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"
