"""THE frame loop: frame -> preprocess -> infer -> decode -> record, for run, bench, serve and the robot.

Decoding is the task head's (:data:`edgekit.heads.table.TASK_HEADS`, default ``classify``).

>>> with open_model("dist/demo-cpu") as model, open_camera("synthetic") as cam:   # doctest: +SKIP
...     for result in Pipeline(model.runtime, model.labels).run(cam, max_frames=100):
...         print(result.index, result.classification.top)

Nothing else in edgekit turns a frame into a result. The front-ends differ only in the
source, the metrics sink and the policy for unusable frames:

============  =========================================  ===================================
front-end     metrics sink                               unusable frames
============  =========================================  ===================================
bench, eval   raw: every sample (``window=None``)        raise after ``max_corrupt`` in a row
run, robot    bounded: ``window=RUN_WINDOW``             raise after ``max_corrupt`` in a row
serve         bounded: the /stats window, shared across  count and continue
              model reopens (``metrics=``)               (``max_corrupt=None``)
============  =========================================  ===================================

A frame is unusable when it is not a non-empty uint8 gray/BGR/BGRA image, or when the
preprocessor rejects it (``ValueError``, or ``cv2.error`` from a custom preprocessor, on a
weird shape). Inference errors are not the frame's fault: :meth:`Pipeline.step` raises them to the caller, which decides
(``edgekit run`` stops; the daemon counts them and reopens the model).

The pipeline owns neither the runtime nor the source: whoever opened them closes them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.errors import CameraUnavailable, first_line
from edgekit.heads.classify import Classification
from edgekit.heads.table import DEFAULT_TASK, TASK_HEADS, OutputDecoder, TaskResult, make_decoder
from edgekit.imaging.image import Preprocessor
from edgekit.metrics import Clock, PipelineMetrics, StageClock

if TYPE_CHECKING:  # the contract only: the pipeline never opens a runtime itself
    from edgekit.runtime import Runtime

log = logging.getLogger("edgekit.pipeline")


_FRAME_ERRORS: tuple[type[BaseException], ...] = (ValueError,)


def _opencv_error() -> tuple[type[BaseException], ...]:
    """``cv2.error`` when OpenCV is loaded (a custom preprocessor may raise it), else nothing:
    OpenCV is an extra and the pipeline must not import it."""
    cv2 = sys.modules.get("cv2")
    error = getattr(cv2, "error", None)
    return (error,) if isinstance(error, type) else ()


@dataclass(frozen=True)
class FrameResult:
    """What the pipeline made of one frame: the task head's result and how long each stage took (ms).

    ``result`` is whatever the decoder returned (a :class:`~edgekit.heads.classify.Classification`
    for ``classify``); ``classification`` is the same object, for classifiers. ``source`` is the
    frame's (:attr:`edgekit.camera.Frame.source`: the image file, the video, the camera) and
    :attr:`captured` when it was captured (UTC; ``serve``'s records keep their own epoch ``time``).
    """

    index: int
    t_capture_ns: int
    result: TaskResult
    timings_ms: dict[str, float]
    source: str | None = None

    @property
    def classification(self) -> Classification:
        """The result of a classifier (AttributeError for other task heads)."""
        if not isinstance(self.result, Classification):
            raise AttributeError(f"this frame's result is a {type(self.result).__name__}, not a Classification")
        return self.result

    @property
    def captured(self) -> str:
        """When the frame was captured, ISO 8601 UTC to the millisecond (``2026-12-02T02:34:25.123Z``):
        the capture's monotonic clock reading moved onto the wall clock."""
        wall_ns = self.t_capture_ns + (time.time_ns() - time.perf_counter_ns())
        stamp = datetime.fromtimestamp(wall_ns / 1e9, timezone.utc).isoformat(timespec="milliseconds")
        return stamp.replace("+00:00", "Z")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``run --json``): frame number, ``source`` when known, capture time, the head's
        result, ms."""
        return {
            "frame": self.index,
            **({"source": self.source} if self.source is not None else {}),
            "captured": self.captured,
            **self.result.to_dict(),
            "ms": {k: round(v, 4) for k, v in self.timings_ms.items()},
        }


def is_valid_frame(array: Any) -> bool:
    """A frame the preprocessor can take: a non-empty uint8 gray, BGR or BGRA image."""
    return (
        isinstance(array, np.ndarray)
        and array.dtype == np.uint8
        and array.size > 0
        and (array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (1, 3, 4)))
    )


def frame_problem(array: Any) -> str | None:
    """Why a frame cannot be used (for logs and errors), or None when it is usable."""
    if is_valid_frame(array):
        return None
    return f"{type(array).__name__} {getattr(array, 'dtype', '')} {getattr(array, 'shape', '')}".strip()


class Pipeline:
    """Turn frames into results with one runtime and one task head, timing every stage.

    Args:
        runtime: any object satisfying the Runtime contract (``edgekit.runtime``).
        labels: class names in output order.
        top_k: classes kept per result (the ``k`` option of any head that takes one).
        warmup: frames whose timings are set aside (first inference, cold caches).
        decoder: replaces the decoder the task head would build.
        max_corrupt: the corrupt-frame policy. N: raise CameraError after N unusable frames
            in a row (a broken camera should stop ``edgekit run``); None: count them in
            ``metrics.corrupt`` and carry on (a daemon outlives a few bad frames).
        clock: nanosecond clock; the frames' ``t_capture_ns`` must come from the same one.
        window: None keeps every latency sample (bench); N keeps the newest N per stage
            with exact totals (long runs; see :mod:`edgekit.metrics`).
        metrics: a sink to record into instead of a new one (``warmup`` and ``window`` are
            then the sink's): the daemon keeps one across model reopens.
        task: the task head, a key of :data:`edgekit.heads.table.TASK_HEADS` (default classify).
        task_options: options of that head (unknown keys raise UsageError).
        then: a second stage called as ``then(frame_array, result) -> result`` after decoding (a
            cascade: :class:`edgekit.cascade.SecondStage`); its ``stage_ns`` are recorded beside
            the first model's stages, and ``end_to_end`` includes it.

    ``metrics`` (a :class:`~edgekit.metrics.PipelineMetrics`) fills up as results are made.
    Not thread-safe: one thread steps a pipeline (the sink's recorders may be read from others).
    """

    def __init__(
        self,
        runtime: Runtime,
        labels: Sequence[str] = (),
        top_k: int = 5,
        warmup: int = 5,
        decoder: OutputDecoder | None = None,
        max_corrupt: int | None = 10,
        clock: Clock = time.perf_counter_ns,
        *,
        window: int | None = None,
        metrics: PipelineMetrics | None = None,
        task: str = DEFAULT_TASK,
        task_options: dict[str, Any] | None = None,
        then: Any = None,
    ):
        self.runtime = runtime
        self.preprocess = Preprocessor(runtime.input_spec)
        self.decode = decoder or _decoder(task, labels, runtime, top_k, task_options)
        self._maps_boxes = bool(getattr(self.decode, "maps_boxes", False))
        # a runtime whose outputs ride on the frame (the IMX500 ran the network in the sensor on that
        # very frame) is handed the frame's metadata: infer(tensor, metadata=frame.metadata)
        self._frame_metadata = bool(getattr(runtime, "reads_frame_metadata", False))
        self.then = then
        self.metrics = metrics if metrics is not None else PipelineMetrics(warmup=warmup, window=window)
        self.metrics.init_ms = getattr(runtime, "init_ms", None)
        self.max_corrupt = max_corrupt
        self._clock = StageClock(clock)
        self._corrupt_in_a_row = 0

    def step(self, frame: Any, capture_wait_ns: int = 0) -> FrameResult | None:
        """Process one :class:`~edgekit.camera.Frame`; None when the frame was unusable.

        Raises whatever the runtime raises (the caller decides what an inference error
        means) and CameraError when the corrupt-frame policy says the camera is broken.
        """
        clock, metrics = self._clock, self.metrics
        clock.mark()
        metrics.frame_seen(frame.index)
        problem = frame_problem(frame.array)
        if problem is None:
            tracked = self.then.track(frame.array) if getattr(self.then, "tracking", False) else None
            if tracked is not None:  # a cascade followed last frame's landmarks: no detector this frame
                return self._tracked(frame, tracked, capture_wait_ns)
            try:
                tensor = self.preprocess(frame.array)
            except _FRAME_ERRORS + _opencv_error() as exc:  # a frame valid on the surface, still unusable
                problem = first_line(exc, None)
        if problem is not None:
            return self._corrupt(frame, problem)
        self._corrupt_in_a_row = 0
        t_pre = clock.lap()
        if self._frame_metadata:
            outputs = self.runtime.infer(tensor, metadata=getattr(frame, "metadata", None))
        else:
            outputs = self.runtime.infer(tensor)
        t_infer = clock.lap()
        decoded = self.decode_outputs(outputs, frame.array.shape)
        t_post = clock.lap()
        if self.then is not None:
            decoded = self.then(frame.array, decoded)
            clock.lap()
        timings = {
            "capture_wait": capture_wait_ns,
            "preprocess": t_pre,
            "inference": t_infer,
            "postprocess": t_post,
            **(getattr(self.decode, "stage_ns", None) or {}),  # detect: decode and nms within postprocess
            **(getattr(self.then, "stage_ns", None) or {}),  # a cascade's second stage, per region count
            "end_to_end": clock.last - frame.t_capture_ns,
        }
        metrics.record(timings, clock.last)
        return FrameResult(frame.index, frame.t_capture_ns, decoded, {k: v / 1e6 for k, v in timings.items()},
                           getattr(frame, "source", None))

    def _tracked(self, frame: Any, result: TaskResult, capture_wait_ns: int) -> FrameResult:
        """Record a frame the cascade's tracking answered without the first model (``--track-roi``)."""
        self._corrupt_in_a_row = 0
        self._clock.lap()
        timings = {"capture_wait": capture_wait_ns, **self.then.stage_ns,
                   "end_to_end": self._clock.last - frame.t_capture_ns}
        self.metrics.record(timings, self._clock.last)
        return FrameResult(frame.index, frame.t_capture_ns, result, {k: v / 1e6 for k, v in timings.items()},
                           getattr(frame, "source", None))

    def decode_outputs(self, outputs: Sequence[Any], frame_shape: tuple[int, ...]) -> TaskResult:
        """The task head's result for one frame's outputs (a detector's boxes in that frame's pixels)."""
        # a detector maps its boxes to the frame's pixels, so it is told the frame's shape
        return self.decode(outputs, frame_shape=frame_shape) if self._maps_boxes else self.decode(outputs)

    def steps(
        self,
        frames: Iterable[Any],
        max_frames: int | None = None,
        duration_s: float | None = None,
    ) -> Iterator[tuple[Any, FrameResult]]:
        """Like :meth:`run`, yielding ``(frame, result)`` for callers that need the frame too."""
        now = self._clock.now
        deadline = now() + int(duration_s * 1e9) if duration_s else None
        source = iter(frames)
        made = 0
        while (max_frames is None or made < max_frames) and (deadline is None or now() < deadline):
            t_ask = now()
            frame = next(source, None)
            if frame is None:
                return
            result = self.step(frame, now() - t_ask)
            if result is not None:
                made += 1
                yield frame, result

    def run(
        self,
        frames: Iterable[Any],
        max_frames: int | None = None,
        duration_s: float | None = None,
    ) -> Iterator[FrameResult]:
        """Yield a result per usable frame until the source ends, ``max_frames`` results were
        made or ``duration_s`` passed. The time spent waiting for each frame is recorded as
        the ``capture_wait`` stage."""
        for _frame, result in self.steps(frames, max_frames, duration_s):
            yield result

    def _corrupt(self, frame: Any, problem: str) -> None:
        self.metrics.corrupt += 1
        self._corrupt_in_a_row += 1
        log.debug("unusable frame %s skipped: %s", frame.index, problem)
        if self.max_corrupt is not None and self._corrupt_in_a_row >= self.max_corrupt:
            raise CameraUnavailable(
                f"the camera sent {self._corrupt_in_a_row} unusable frames in a row (last: {problem})",
                "check the camera/stream; frames must be non-empty uint8 gray, BGR or BGRA images",
            )
        return None


def _decoder(
    task: str, labels: Sequence[str], runtime: Runtime, top_k: int, options: dict[str, Any] | None
) -> OutputDecoder:
    """The task head's decoder; ``top_k`` fills the head's ``k`` unless the options set it."""
    options = dict(options or {})
    head = TASK_HEADS.get(task)
    if head is not None and "k" in head.option_names and "k" not in options and "top_k" not in options:
        options["k"] = top_k
    return make_decoder(task, labels, runtime, **options)
