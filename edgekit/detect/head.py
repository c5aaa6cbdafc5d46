"""The ``detect`` task head: pick the output layout, decode candidates, NMS, map boxes to the frame.

Output layouts are a table, :data:`LAYOUTS` (one row per layout: a module with ``fits`` and
``candidates``), tried in order when the model does not name one. A layout module turns the
model's dequantised outputs into candidate boxes (xyxy, model-input pixels), scores and
class ids, already cut by the score threshold; the head does the rest once for all of them:
class-aware NMS (:mod:`edgekit.detect.nms`), ``max_detections``, and the map back to the
source frame through the preprocessing's crop and letterbox (:mod:`edgekit.detect.boxes`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.detect.anchors import check_anchors, check_ssd_anchors
from edgekit.detect.boxes import Detection, Detections
from edgekit.detect.config import OPTIONS, DetectConfig
from edgekit.detect.nms import nms
from edgekit.detect.presets import PRESETS
from edgekit.detect.ssd_decode import SsdDecode, check_ssd_decode
from edgekit.errors import ModelError, UsageError
from edgekit.heads.options import check_head_options
from edgekit.heads.tensors import label_for
from edgekit.imaging.geometry import BoxMap, box_map, identity_map
from edgekit.imaging.image import InputSpec
from edgekit.util.optionspec import did_you_mean
from edgekit.util.plugins import resolve


@dataclass(frozen=True)
class Layout:
    """One row of :data:`LAYOUTS`: ``module`` defines ``fits(shapes, config) -> bool`` (the output
    shapes and the :class:`DetectConfig`: class count, anchors) and ``candidates(outputs, config,
    quant) -> Candidates`` (the runtime's outputs as they came, quantised or not, and each one's
    ``(scale, zero_point)`` or None); ``describe`` is shown when nothing fits."""

    module: str
    describe: str


LAYOUTS: dict[str, Layout] = {
    "postprocess": Layout("edgekit.detect.postprocess",
                          "NMS in the graph (TFLite_Detection_PostProcess): boxes [1,N,4], classes [1,N], "
                          "scores [1,N], count [1]"),
    "ssd": Layout("edgekit.detect.ssd", "SSD: box regressors [1,N,4] (or [1,N,num_coords] with keypoints) + "
                  "class scores [1,N,C] (only with anchors or ssd_anchors set)"),
    "decoded": Layout("edgekit.detect.decoded", "decoded boxes [1,N,4] (xyxy or cxcywh) + class scores [1,N,C]"),
    "yolo_objectness": Layout("edgekit.detect.yolo:objectness",
                              "YOLOv5-style [1,N,5+nc] (box, objectness, class scores)"),
    "yolo": Layout("edgekit.detect.yolo", "YOLOv8-style anchor-free [1,4+nc,N] or [1,N,4+nc]"),
}
"""Layout name -> :class:`Layout`, in the order ``layout=auto`` tries them."""


class Detector:
    """The ``detect`` decoder: ``decoder(outputs, frame_shape=None) -> Detections``.

    With ``frame_shape`` (the source frame's ``(H, W, ...)``) boxes are in that frame's pixels,
    else in model-input pixels. ``stage_ns`` holds the last call's ``decode`` and ``nms`` times.
    """

    maps_boxes = True  # the pipeline passes frame_shape

    def __init__(self, config: DetectConfig, layout: str, labels: Sequence[str] = (), spec: InputSpec | None = None,
                 quantization: Sequence[Any] = ()):
        self.config = config
        self.layout = layout
        self.labels = list(labels)
        self.spec = spec
        self.quantization = list(quantization)
        self._candidates = _layout_function(layout)
        self._maps: dict[tuple[int, int], BoxMap] = {}
        self.stage_ns: dict[str, int] = {}

    def __call__(self, outputs: Sequence[np.ndarray], frame_shape: tuple[int, ...] | None = None) -> Detections:
        t0 = time.perf_counter_ns()
        # raw outputs: a layout dequantises only what passes the score threshold (detect.scores)
        cand = self._candidates([np.asarray(o) for o in outputs], self.config, self.quantization)
        t1 = time.perf_counter_ns()
        if cand.final:
            keep = np.argsort(-cand.scores, kind="stable")[: self.config.max_detections]
        else:
            keep = nms(cand.boxes, cand.scores, cand.classes, self.config.iou_threshold,
                       self.config.max_detections, self.config.class_agnostic)
        mapping = self._map(frame_shape)
        boxes = mapping(cand.boxes[keep]).tolist() if len(keep) else []
        # plain Python numbers first (tolist): converting numpy scalars one by one costs more than NMS
        points = [()] * len(boxes)
        if cand.keypoints is not None and len(keep):
            points = [tuple(map(tuple, p)) for p in mapping.points(cand.keypoints[keep]).tolist()]
        found = tuple(Detection(c, label_for(c, self.labels), s, tuple(b), p)
                      for b, s, c, p in zip(boxes, cand.scores[keep].tolist(), cand.classes[keep].tolist(), points))
        self.stage_ns = {"decode": t1 - t0, "nms": time.perf_counter_ns() - t1}
        return Detections(found, mapping.size)

    def _map(self, frame_shape: tuple[int, ...] | None) -> BoxMap:
        if self.spec is None:
            w, h = self.config.input_size
            return BoxMap((1.0, 1.0), (0.0, 0.0), (0.0, 0.0, float(w), float(h)), (w, h))
        if frame_shape is None:
            return identity_map(self.spec)
        key = (int(frame_shape[0]), int(frame_shape[1]))
        if key not in self._maps:
            self._maps[key] = box_map(self.spec, key)
        return self._maps[key]


def _layout_function(layout: str):
    row = LAYOUTS[layout]
    module, _, attr = row.module.partition(":")
    return resolve(f"{module}:{attr or 'candidates'}")


def _fits(layout: str, shapes: list[tuple[int, ...]], config: DetectConfig) -> bool:
    module, _, attr = LAYOUTS[layout].module.partition(":")
    fits = resolve(f"{module}:fits" if not attr else f"{module}:fits_{attr}")
    return bool(fits(shapes, config))


def choose_layout(layout: str, shapes: list[tuple[int, ...]], config: DetectConfig) -> str:
    """The layout named, checked against the output shapes, or the first of :data:`LAYOUTS` that fits.

    Raises ModelError naming every layout tried and the shapes seen when none fits.
    """
    seen = ", ".join(str(list(s)) for s in shapes) or "none"
    if layout != "auto":
        if not isinstance(layout, str) or layout not in LAYOUTS:
            raise UsageError(f"detect layout {layout!r} is unknown", f"use auto or one of {', '.join(LAYOUTS)}")
        if not _fits(layout, shapes, config):
            raise ModelError(f"the model's outputs ({seen}) do not fit the {layout} layout: "
                             f"{LAYOUTS[layout].describe}", "choose another layout, or layout=auto")
        return layout
    for name in LAYOUTS:
        if _fits(name, shapes, config):
            return name
    tried = "; ".join(f"{n}: {row.describe}" for n, row in LAYOUTS.items())
    classes = f" with {config.num_classes} classes" if config.num_classes else ""
    raise ModelError(f"the model's outputs ({seen}) match no detection layout{classes} (tried {tried})",
                     no_layout_fix(shapes))


NO_LAYOUT_FIX = ("an SSD without NMS in the graph needs its anchors and decode: -T ssd_anchors={...} "
                 "-T ssd_decode={...}, or a MediaPipe detector's -T preset=" + "|".join(PRESETS)
                 + " with its preprocessing (e.g. --resize letterbox: a task option cannot set it; docs/detection.md); "
                 "else export the model with one of these layouts, or use --task raw")
"""The fix of a model whose outputs fit no layout: a bare SSD (MediaPipe's) is the usual case."""


def no_layout_fix(shapes: list[tuple[int, ...]]) -> str:
    """:data:`NO_LAYOUT_FIX`, led by the preset whose box count and row width ``shapes`` match, if one
    does, and the preprocessing flags that preset needs."""
    for name, preset in PRESETS.items():
        decode = preset["options"]["ssd_decode"]
        if sorted(shapes) == sorted([(1, decode["num_boxes"], 1), (1, decode["num_boxes"], decode["num_coords"])]):
            p = preset["preprocessing"]
            return (f"these outputs are those of {preset['model'].split(' (')[0]}: -T preset={name} --resize "
                    f"{p['resize']} (--mean {p['mean']:g} --std {p['std']:g} unless the model's metadata says so); "
                    + NO_LAYOUT_FIX)
    return NO_LAYOUT_FIX


def with_preset(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` laid over the options of their ``preset`` (:mod:`edgekit.detect.presets`): an
    option given wins, and inside ``ssd_anchors`` and ``ssd_decode`` a key given wins. Options
    without a preset come back as they are; an unknown preset is refused with a did-you-mean."""
    name = options.get("preset")
    if name is None:
        return dict(options)
    if not isinstance(name, str) or name not in PRESETS:
        close = did_you_mean(str(name), PRESETS)
        raise UsageError(f"detect preset {name!r} is unknown",
                         close if close.startswith("did you mean") else f"presets: {', '.join(PRESETS)}")
    out = copy.deepcopy(PRESETS[name]["options"])
    for key, value in options.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = {**out[key], **value} if both else value
    return out


# Checked by their own modules (a list or .npy path, tables of sub-options) or by choose_layout.
_OWN_CHECKS = ("layout", "anchors", "ssd_anchors", "ssd_decode", "preset")


def detect_config(spec: InputSpec | None, num_classes: int | None, options: dict[str, Any]) -> DetectConfig:
    """Check the head's options (untrusted: they may come from a bundle) against
    :data:`edgekit.detect.config.OPTIONS` into a :class:`DetectConfig` (a ``preset`` under them:
    :func:`with_preset`)."""
    options = with_preset(options)
    o = {k: v for k, v in check_head_options("detect", OPTIONS, options, skip=_OWN_CHECKS).items() if v is not None}
    o.pop("layout", None)
    o.pop("preset", None)
    if "box_coder_scales" in o:
        if len(o["box_coder_scales"]) != 4:
            raise UsageError(f"detect box_coder_scales must be 4 numbers (y, x, h, w), "
                             f"not {options['box_coder_scales']!r}")
        o["box_coder_scales"] = tuple(o["box_coder_scales"])
    if "outputs" in o:
        o["outputs"] = tuple(o["outputs"])
    if "ssd_anchors" in o:
        o["ssd_anchors"] = check_ssd_anchors(o["ssd_anchors"])
    decode = o.pop("ssd_decode", None)
    if decode is not None:
        _decode_options(check_ssd_decode(decode), o)
    o["anchors"] = check_anchors(o.get("anchors"))
    size = (spec.width, spec.height) if spec is not None else (1, 1)
    return DetectConfig(input_size=size, num_classes=num_classes, **o)


def _decode_options(decode: SsdDecode, kw: dict[str, Any]) -> None:
    """Fold MediaPipe's score options into the head's: ``sigmoid_score`` is ``score_activation``,
    ``min_score_thresh`` the ``score_threshold`` unless that is given (the build's mAP gate
    sets 0.001 to score the whole precision-recall curve)."""
    if "box_coder_scales" in kw:
        raise UsageError("detect box_coder_scales and ssd_decode both give the box scales",
                         "give them once, as ssd_decode's y_scale, x_scale, h_scale, w_scale")
    kw["ssd_decode"] = decode
    if decode.sigmoid_score is not None:
        activation = "sigmoid" if decode.sigmoid_score else "none"
        if kw.get("score_activation", activation) != activation:
            raise UsageError(f"detect score_activation {kw['score_activation']} contradicts ssd_decode.sigmoid_score "
                             f"{str(decode.sigmoid_score).lower()}", "give one of them")
        kw["score_activation"] = activation
    kw["score_clipping_thresh"] = decode.score_clipping_thresh
    if decode.min_score_thresh is not None:
        kw.setdefault("score_threshold", decode.min_score_thresh)


def _shape(dims: Sequence[Any]) -> tuple[int, ...]:
    """An output's shape with symbolic dimensions (ONNX ``batch``, ``N``) as -1, a symbolic batch as 1."""
    shape = [int(v) if isinstance(v, (int, np.integer)) and v >= 0 else -1 for v in dims]
    if len(shape) >= 2 and shape[0] == -1:
        shape[0] = 1  # edgekit runs one frame at a time
    return tuple(shape)


def detector(labels: Sequence[str] = (), runtime: Any = None, layout: str | None = None, **options: Any) -> Detector:
    """The ``detect`` head's factory (:data:`edgekit.heads.table.TASK_HEADS`): a :class:`Detector` for
    ``runtime``'s outputs, its layout chosen from their shapes unless ``layout`` (or the ``preset``)
    names one."""
    options = with_preset({**options, **({"layout": layout} if layout is not None else {})})
    layout = options.pop("layout", "auto")
    spec = getattr(runtime, "input_spec", None)
    details = getattr(runtime, "output_details", None)
    shapes = [_shape(d.get("shape", ())) for d in details()] if callable(details) else []
    num_classes = len(labels) or None
    config = detect_config(spec, num_classes, options)
    if config.outputs is not None and shapes:
        _check_outputs(config.outputs, len(shapes), None)
    chosen = choose_layout(layout, shapes, config)
    if config.outputs is not None:
        _check_outputs(config.outputs, len(shapes), chosen)
    if chosen == "ssd":  # a wrong anchor or box count fails when the model opens
        resolve("edgekit.detect.ssd:check_counts")(shapes, config)
    quant = list(getattr(runtime, "output_quantization", None) or [])
    return Detector(config, chosen, labels, spec, quant)


_ROLES = {"postprocess": ("boxes", "classes", "scores", "count"), "ssd": ("boxes", "scores"),
          "decoded": ("boxes", "scores")}
"""The outputs a layout's ``outputs`` option gives, in order (the YOLO layouts read the first index only)."""


def _check_outputs(outputs: tuple[int, ...], count: int, layout: str | None) -> None:
    """``outputs`` (runtime output index per role) against the model's ``count`` outputs and the
    chosen ``layout``'s roles: checked when the model opens, not as an IndexError on every frame."""
    fix = "edgekit inspect MODEL lists the outputs; give one index per role, e.g. -T outputs=[0,1]"
    if count and max(outputs, default=0) >= count:
        raise ModelError(f"detect outputs {list(outputs)} name output {max(outputs)}, but the model has {count} "
                         f"output{'s' if count != 1 else ''} (0 to {count - 1})", fix)
    roles = _ROLES.get(layout or "")
    if roles is not None and len(outputs) != len(roles):
        raise ModelError(f"detect outputs {list(outputs)}: the {layout} layout takes {len(roles)} indices "
                         f"({', '.join(roles)})", fix)
    if layout is not None and not outputs:
        raise ModelError("detect outputs is empty", fix)
