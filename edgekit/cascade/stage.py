"""The second stage of a cascade: each detection's region cropped from the frame, run through a second
model, its answer carried home on the detection.

:class:`SecondStage` is what :class:`~edgekit.pipeline.Pipeline` calls after the detector's head
(``Pipeline(..., then=stage)``): for the best ``max_regions`` detections it builds the region
(:mod:`edgekit.cascade.region`), warps the full-resolution frame into the second model's input
(:mod:`edgekit.cascade.warp`), applies that model's own preprocessing, infers and decodes. A
``landmarks`` head's points return to frame pixels through the inverse of the warp and ride on the
detection as ``landmarks``, ``landmark_score`` (and ``landmark_visibility`` for a model that gives
one); a classifier's top class as ``sub_label`` and
``sub_label_score`` (Frigate's word); any other head's result as ``second``. ``stage_ns`` holds the
last frame's times: ``crop``, ``second_preprocess``, ``second_inference``, ``second_decode`` (each
summed over the regions), ``second_stage`` (all of it) and ``second_stage@k=N`` (the same, filed by the
number of regions, so p50/p99 at k regions read straight off the summary).

The stage owns neither runtime: whoever opened the second model closes it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from edgekit.cascade.region import Region, RoiOptions, region_for
from edgekit.cascade.warp import crop, to_frame
from edgekit.errors import UsageError
from edgekit.heads.table import make_decoder
from edgekit.imaging.image import Preprocessor


class SecondStage:
    """Run a second model on the regions a detector found.

    Args:
        runtime: the second model's open runtime (any Runtime).
        task: its task head (``landmarks``, ``classify``, ``raw``, ...).
        labels: its labels (a classifier's sub-labels).
        task_options: its head's options.
        roi: where to look (:func:`~edgekit.cascade.region.parse_roi`).
        track: MediaPipe's tracking shortcut (``--track-roi``): the region options applied to the
            previous frame's landmarks (their bounding box, the landmarks as keypoints) to find this
            frame's region, so the detector runs only when a landmark model loses its object.
    """

    def __init__(self, runtime: Any, task: str = "landmarks", labels: Sequence[str] = (),
                 task_options: dict[str, Any] | None = None, roi: RoiOptions | None = None,
                 track: RoiOptions | None = None):
        self.runtime = runtime
        self.task = task
        self.roi = roi or RoiOptions()
        self.preprocess = Preprocessor(runtime.input_spec)
        self.decode = make_decoder(task, labels, runtime, **dict(task_options or {}))
        self.width, self.height = runtime.input_spec.width, runtime.input_spec.height
        self.stage_ns: dict[str, int] = {}
        self.regions = 0  # how many second-stage runs the last frame took
        self.track_roi = track
        self.tracking = track is not None
        if self.tracking and not hasattr(self.decode, "normalized"):
            raise UsageError(f"--track-roi follows landmarks; the second model is a {task} model",
                             "give a landmarks model after --then, or leave --track-roi out")
        self._tracks: tuple[Any, ...] = ()  # last frame's detections with landmarks
        self._last: Any = None  # last frame's first-stage result (the shape of what track() returns)

    def __call__(self, frame: np.ndarray, result: Any) -> Any:
        """``result`` (the detector's Detections for ``frame``) with each of its best detections
        carrying the second model's answer; other results pass unchanged."""
        detections = getattr(result, "detections", None)
        if detections is None:
            raise UsageError(f"a cascade's first model must be a detector, not a {type(result).__name__} head",
                             "give a detect bundle first: edgekit run DETECTOR --then SECOND")
        times = {"crop": 0, "second_preprocess": 0, "second_inference": 0, "second_decode": 0}
        out = list(detections)
        k = min(len(out), self.roi.max_regions)
        t_start = time.perf_counter_ns()
        for i in range(k):
            out[i] = self._one(frame, out[i], times)
        total = time.perf_counter_ns() - t_start
        self.regions = k
        self.stage_ns = {**times, "second_stage": total, f"second_stage@k={k}": total}
        if self.tracking:
            self._tracks, self._last = tuple(d for d in out[:k] if d.landmarks), result
        return replace(result, detections=tuple(out))

    def track(self, frame: np.ndarray) -> Any | None:
        """This frame's result from last frame's landmarks alone, or None (nothing tracked, or a
        track lost: its presence fell under the threshold), when the detector must run."""
        if not self._tracks:
            return None
        times = {"crop": 0, "second_preprocess": 0, "second_inference": 0, "second_decode": 0}
        t_start = time.perf_counter_ns()
        found = []
        for detection in self._tracks:
            points = np.asarray(detection.landmarks, np.float64)[:, :2]
            box = (*points.min(axis=0).tolist(), *points.max(axis=0).tolist())
            updated = self._one(frame, detection, times, region_for(box, points.tolist(), self.track_roi))
            if not updated.landmarks:
                self._tracks = ()
                return None
            moved = np.asarray(updated.landmarks, np.float64)[:, :2]
            found.append(replace(updated, box=(*moved.min(axis=0).tolist(), *moved.max(axis=0).tolist())))
        total = time.perf_counter_ns() - t_start
        self.regions, self._tracks = len(found), tuple(found)
        self.stage_ns = {**times, "tracked": total, "second_stage": total, f"second_stage@k={len(found)}": total}
        return replace(self._last, detections=tuple(found))

    def _one(self, frame: np.ndarray, detection: Any, times: dict[str, int], region: Region | None = None) -> Any:
        t0 = time.perf_counter_ns()
        region = region or region_for(detection.box, detection.keypoints, self.roi)
        if not (region.width > 0 and region.height > 0):
            return detection  # a degenerate box: nothing to look at
        image = crop(frame, region, self.width, self.height)
        t1 = time.perf_counter_ns()
        tensor = self.preprocess(image)
        t2 = time.perf_counter_ns()
        outputs = self.runtime.infer(tensor)
        t3 = time.perf_counter_ns()
        extra = self._answer(outputs, region)
        t4 = time.perf_counter_ns()
        for key, ns in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            times[key] += ns
        return replace(detection, region=tuple(region.to_list()), **extra)

    def _answer(self, outputs: Sequence[np.ndarray], region: Region) -> dict[str, Any]:
        """What the second model said, as detection fields."""
        decode = self.decode
        if hasattr(decode, "normalized") and hasattr(decode, "presence"):  # the landmarks head
            score = decode.presence(outputs)
            if score is not None and score < decode.config.presence_threshold:
                return {"landmarks": (), "landmark_score": score}
            points, visibility = decode.normalized(outputs)
            pixels = points * np.float32([self.width, self.height, self.width])
            frame_points = to_frame(pixels, region, self.width, self.height)
            seen = tuple(visibility.tolist()) if visibility is not None else None
            return {"landmarks": tuple(map(tuple, frame_points.tolist())), "landmark_score": score,
                    "landmark_visibility": seen}
        answer = decode(outputs)
        top = getattr(answer, "top", None)
        if top is not None and hasattr(top, "label") and hasattr(top, "score"):
            return {"sub_label": top.label, "sub_label_score": float(top.score)}
        return {"second": answer.to_dict()}
