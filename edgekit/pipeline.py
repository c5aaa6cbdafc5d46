"""frame -> preprocess -> infer -> decode -> record: the loop behind run, bench and the daemon.

>>> with open_model("dist/demo-cpu") as model, open_camera("synthetic") as cam:   # doctest: +SKIP
...     for result in Pipeline(model.runtime, model.labels).run(cam, max_frames=100):
...         print(result.index, result.classification.top)

The pipeline owns neither the runtime nor the source: whoever opened them closes them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import CameraError
from edgekit.image import Preprocessor
from edgekit.metrics import Clock, PipelineMetrics, StageClock
from edgekit.results import Classification, Decoder, output_quantization


@dataclass(frozen=True)
class FrameResult:
    """What the pipeline made of one frame: its classes and how long each stage took (ms)."""

    index: int
    t_capture_ns: int
    classification: Classification
    timings_ms: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "frame": self.index,
            **self.classification.to_dict(),
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


class Pipeline:
    """Classify frames with one runtime, timing every stage.

    Args:
        runtime: any object satisfying the Runtime contract (``edgekit.runtime``).
        labels: class names in output order.
        top_k: classes kept per result.
        warmup: frames whose timings are set aside (first inference, cold caches).
        decoder: replaces the default :class:`~edgekit.results.Decoder`.
        max_corrupt: consecutive unusable frames after which the camera is declared broken.
        clock: nanosecond clock; the frames' ``t_capture_ns`` must come from the same one.

    ``metrics`` (a :class:`~edgekit.metrics.PipelineMetrics`) fills up as results are made.
    """

    def __init__(
        self,
        runtime: Any,
        labels: Sequence[str] = (),
        top_k: int = 5,
        warmup: int = 5,
        decoder: Decoder | None = None,
        max_corrupt: int = 10,
        clock: Clock = time.perf_counter_ns,
    ):
        self.runtime = runtime
        self.preprocess = Preprocessor(runtime.input_spec)
        self.decode = decoder or Decoder(labels, top_k, output_quantization(runtime))
        self.metrics = PipelineMetrics(warmup=warmup)
        self.metrics.init_ms = getattr(runtime, "init_ms", None)
        self.max_corrupt = max_corrupt
        self._clock = StageClock(clock)
        self._corrupt_in_a_row = 0

    def step(self, frame: Any, capture_wait_ns: int = 0) -> FrameResult | None:
        """Process one :class:`~edgekit.camera.Frame`; None when the frame was unusable."""
        clock, metrics = self._clock, self.metrics
        clock.mark()
        metrics.frame_seen(frame.index)
        if not is_valid_frame(frame.array):
            return self._corrupt(frame)
        self._corrupt_in_a_row = 0
        tensor = self.preprocess(frame.array)
        t_pre = clock.lap()
        outputs = self.runtime.infer(tensor)
        t_infer = clock.lap()
        classification = self.decode(outputs)
        t_post = clock.lap()
        timings = {
            "capture_wait": capture_wait_ns,
            "preprocess": t_pre,
            "inference": t_infer,
            "postprocess": t_post,
            "end_to_end": clock.last - frame.t_capture_ns,
        }
        metrics.record(timings, clock.last)
        return FrameResult(frame.index, frame.t_capture_ns, classification, {k: v / 1e6 for k, v in timings.items()})

    def run(
        self,
        frames: Iterable[Any],
        max_frames: int | None = None,
        duration_s: float | None = None,
    ) -> Iterator[FrameResult]:
        """Yield a result per usable frame until the source ends, ``max_frames`` results were
        made or ``duration_s`` passed. The time spent waiting for each frame is recorded as
        the ``capture_wait`` stage."""
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
                yield result

    def _corrupt(self, frame: Any) -> None:
        self.metrics.corrupt += 1
        self._corrupt_in_a_row += 1
        if self._corrupt_in_a_row >= self.max_corrupt:
            arr = frame.array
            what = f"{type(arr).__name__} {getattr(arr, 'dtype', '')} {getattr(arr, 'shape', '')}".strip()
            raise CameraError(
                f"the camera sent {self._corrupt_in_a_row} unusable frames in a row (last: {what})",
                "check the camera/stream; frames must be non-empty uint8 gray, BGR or BGRA images",
            )
        return None
