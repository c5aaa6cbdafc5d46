"""Where an int8 model loses accuracy: per-layer quantisation error, and the mixed-range hint.

Run when an int8 variant misses the accuracy gate (or on every int8 build when the target's
``[build]`` table sets ``quant_report = true``), the report lands in the model's verification
as ``verification["quantization"]``:

``worst_layers``
    TensorFlow's ``tf.lite.experimental.QuantizationDebugger`` re-calibrates the SavedModel on
    the same images as the built int8 model (so the ranges are the built model's), then runs
    an instrumented model on the first :data:`REPORT_IMAGES` of them: after every quantised op
    a ``NumericVerify`` op compares its dequantised int8 output with the float op's result.
    Per tensor, ``rmse_over_scale`` is that difference's root mean square divided by the
    tensor's quantisation step (its scale): the error in units of one int8 step. Rounding to
    a uniform grid alone gives 1/sqrt(12) ~= 0.29 (:data:`IDEAL_RMSE_OVER_SCALE`); well above
    it, the layer loses more than rounding does (saturated range, outliers, an op that
    quantises badly). The :data:`WORST` largest are kept, worst first.
    See https://www.tensorflow.org/lite/performance/quantization_debugger.
``mixed_ranges`` / ``hints``
    A small step error can still be a large error for part of a tensor: one output that
    concatenates box coordinates in pixels ([0, 640]) with class scores in [0, 1] gets one
    scale of ~2.5 per step, and every score rounds to 0 or 2.5 (ultralytics/yolov5#10164).
    The per-layer metric reads ~0.29 there; :func:`mixed_ranges` finds it from the original
    model's outputs instead.

The cost is bounded: one calibration pass (as the int8 conversion made), :data:`REPORT_IMAGES`
instrumented inferences, and :data:`HINT_IMAGES` reference rows per output read back.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.errors import first_line

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.builders.sources.images import TensorStream

REPORT_IMAGES = 32
"""Calibration images the instrumented model runs on (the debugger's ``debug_dataset``)."""
WORST = 5
"""Layers named in the report."""
IDEAL_RMSE_OVER_SCALE = 1 / math.sqrt(12)
"""The RMS error of rounding to a uniform grid, in steps: what a well-quantised tensor shows."""
HINT_IMAGES = 32
"""Reference rows per output read for the mixed-range check."""
MIXED_RANGE_RATIO = 16.0
"""A clean split of an output's channels into a wide and a narrow group fires the hint when
every wide channel spans at least this many times the widest narrow one: quantised per
tensor, the narrow group then gets at most 256 / 16 = 16 of int8's 256 levels (4 bits)."""
MIN_WIDE_SPAN = 2.0
"""A wide group spanning less than this is in normalised units already (probabilities, boxes
in [0, 1]): the advice to split or normalise would not apply, so no hint."""


def layer_errors(conv: Any, representative: Iterable[np.ndarray], debug_images: int = REPORT_IMAGES,
                 worst: int = WORST, outputs: Mapping[str, str] | None = None,
                 clamped: Mapping[str, tuple[float, float]] | None = None) -> tuple[list[dict], int]:
    """The ``worst`` layers by RMSE/scale of an int8 conversion, and the number of images the
    instrumented model ran on.

    ``conv``: the int8 model instrumented for the debugger, as the build quantised it
    (:func:`edgekit.builders.int8.quantize.quantize_int8` with ``numeric_verify``), or a
    ``TFLiteConverter`` set up for int8 calibrating on ``representative`` (one float tensor per
    image, no batch axis; a sized re-iterable), so the debugger's ranges are the built model's;
    the first ``debug_images`` of it run through the instrumented model.
    ``outputs``, ``clamped``: see :func:`worst_layers` (each clamp's range gets its own metric,
    :func:`clipped_metrics`, computed beside the debugger's).
    """
    from edgekit.builders.tf import NATIVE_LOG, import_tf
    from edgekit.util.quiet import native_stderr_to_log

    tf = import_tf()
    seen = [0]

    def debug_dataset():
        seen[0] = 0
        for x in itertools.islice(iter(representative), debug_images):
            seen[0] += 1
            yield [np.asarray(x, np.float32)[None]]

    metrics, columns = clipped_metrics(clamped or {})
    options = tf.lite.experimental.QuantizationDebugOptions(
        layer_debug_metrics={"mean_abs_error": lambda diff: float(np.mean(np.abs(diff)))},
        layer_direct_compare_metrics=metrics or None)
    with warnings.catch_warnings():  # tf.lite.Interpreter's deprecation notice: the debugger's own use
        warnings.simplefilter("ignore", UserWarning)
        model = {"quant_debug_model_content": conv} if isinstance(conv, bytes) else {"converter": conv}
        # the debugger's interpreters print LiteRT's "INFO: Created TensorFlow Lite XNNPACK delegate" to fd 2
        with native_stderr_to_log(NATIVE_LOG):
            debugger = tf.lite.experimental.QuantizationDebugger(**model, debug_dataset=debug_dataset,
                                                                 debug_options=options)
            debugger.run()
    dump = io.StringIO()
    debugger.layer_statistics_dump(dump)
    dump.seek(0)
    rows = ({**row, **_clipped_mse(row, clamped or {}, columns)} for row in csv.DictReader(dump))
    return worst_layers(rows, worst, outputs, clamped), seen[0]


def clipped_metrics(clamped: Mapping[str, tuple[float, float]]) -> tuple[dict[str, Callable], dict]:
    """The debugger's direct-compare metrics for ``clamped`` tensors: one per distinct clamp
    range, the mean squared error of the dequantised int8 value against the float value clipped
    to that range (what the clamp makes of it); and the column of each range."""
    columns = {bounds: f"clipped_mse_{i}" for i, bounds in enumerate(sorted(set(clamped.values())))}

    def metric(low: float, high: float) -> Callable:
        def clipped_mse(floats, quants, scale, zero_point) -> float:
            real = (np.asarray(quants, np.float64) - zero_point) * scale
            return float(np.mean((real - np.clip(np.asarray(floats, np.float64), low, high)) ** 2))

        return clipped_mse

    return {name: metric(*bounds) for bounds, name in columns.items()}, columns


def _clipped_mse(row: Mapping[str, Any], clamped: Mapping[str, tuple[float, float]], columns: dict) -> dict:
    """A clamped tensor's row judged by its clamp's metric: ``clipped_mse`` (else nothing)."""
    bounds = clamped.get(str(row.get("tensor_name", "")))
    column = columns.get(bounds) if bounds is not None else None
    return {"clipped_mse": row[column]} if column and row.get(column) not in (None, "") else {}


def worst_layers(rows: Iterable[Mapping[str, Any]], worst: int = WORST, outputs: Mapping[str, str] | None = None,
                 clamped: Mapping[str, tuple[float, float]] | None = None) -> list[dict]:
    """The ``worst`` rows of a ``layer_statistics_dump`` CSV by RMSE/scale, worst first.

    A row needs ``tensor_name``, ``op_name``, ``mean_squared_error`` and ``scale``; rows with no
    usable scale (0, missing, NaN) are left out. ``outputs`` maps a model output's tensor name
    to the output's name: such a layer's entry says ``output``. ``clamped``: per tensor, the range
    of the clamp whose int8 range it takes (builders/graph/clamps.py): against the unclamped
    float value its error is the clamp's doing, so it is judged by ``clipped_mse`` (the error
    against the float value clipped to that range; its entry says ``clamp``), and left out
    without one.
    """
    layers = []
    for row in rows:
        entry = _entry(row, (clamped or {}).get(str(row.get("tensor_name", ""))))
        if entry is None:
            continue
        if outputs and entry["tensor"] in outputs:
            entry["output"] = outputs[entry["tensor"]]
        layers.append(entry)
    layers.sort(key=lambda e: e["rmse_over_scale"], reverse=True)
    return layers[:worst]


def _entry(row: Mapping[str, Any], clamp: tuple[float, float] | None) -> dict | None:
    """One layer's entry, or None when the row has no usable error or scale. A clamped tensor's
    error is ``clipped_mse``, and the statistics of the unclamped difference are not kept."""
    try:
        mse, scale = float(row["clipped_mse" if clamp is not None else "mean_squared_error"]), float(row["scale"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (math.isfinite(mse) and math.isfinite(scale) and scale > 0):
        return None
    entry = {"tensor": str(row.get("tensor_name", "")), "op": str(row.get("op_name", "")),
             "rmse_over_scale": round(math.sqrt(max(mse, 0.0)) / scale, 4), "scale": float(scale)}
    if clamp is not None:
        entry["clamp"] = [b if math.isfinite(b) else None for b in clamp]  # None: no bound that side
        return entry
    for key in ("mean_abs_error", "max_abs_error", "mean_error"):
        value = _number(row.get(key))
        if value is not None:
            entry[key] = value
    return entry


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return float(f"{number:.6g}") if math.isfinite(number) else None


def mixed_ranges(outputs: Mapping[str, np.ndarray], ratio: float = MIXED_RANGE_RATIO,
                 layout: str | None = None, num_classes: int | None = None) -> list[dict]:
    """Outputs whose channels fall into a wide-range and a narrow-range group, one finding each.

    ``outputs``: per output name, its values on some images (batch first). Every axis that
    may hold channels (:func:`channel_axes`; ``layout``, ``num_classes``: the detect head's) is tried as the
    channel axis (``[1, 4+nc, N]`` and ``[1, N, 4+nc]`` alike): each channel's
    [min, max] over the images and the other axes, then every split into a leading and a
    trailing block of channels; the split where every channel of one block spans at least
    ``ratio`` times the widest of the other is a finding (:data:`MIXED_RANGE_RATIO`).
    Returns, per output found, the axis (batch is axis 0), both groups' channel ranges
    ``[first, end)`` and value ranges, the span ratio and the int8 levels the narrow group gets.
    """
    found = []
    for name, values in outputs.items():
        a = np.asarray(values, dtype=np.float32)
        if a.ndim < 2 or a.size == 0 or not np.all(np.isfinite(a)):
            continue
        best = max((f for axis in channel_axes(a.shape, layout, num_classes) if (f := _split(a, axis)) is not None),
                   key=lambda f: f["ratio"], default=None)
        if best is not None and best["ratio"] >= ratio:
            found.append({"output": name, **best})
    return found


BOXES_ON_AXIS_1 = frozenset({"ssd", "decoded", "postprocess", "yolo_objectness"})
"""Detect layouts whose outputs are ``[1, N, ...]``: axis 1 counts boxes (anchors), not channels."""


def channel_axes(shape: Sequence[int], layout: str | None = None, num_classes: int | None = None) -> list[int]:
    """The axes of an output (batch first) that may hold channels, i.e. different quantities side
    by side, which the mixed-range advice (split the outputs, normalise the boxes) is about.

    An output of three or more axes also has one that counts positions (anchors, grid cells):
    its entries are the same quantity at different places, and an SSD regressor's anchors of
    one feature map regress wider than another's (MediaPipe's pose detector: [-448, 448] beside
    [-0.7, 0.7]) without anything to split. That axis is axis 1 for the ``layout``s of
    :data:`BOXES_ON_AXIS_1`; a ``yolo`` output's channels are its axis of ``4 + num_classes``;
    else the strictly longest axis counts positions (as the detect head takes a YOLO output's
    longer axis for its boxes when it does not know the classes, edgekit/detect/yolo.py)."""
    axes = list(range(1, len(shape)))
    if len(shape) < 3:
        return axes
    if layout in BOXES_ON_AXIS_1:
        return [a for a in axes if a != 1]
    if layout == "yolo" and num_classes and [shape[a] for a in axes].count(4 + num_classes) == 1:
        return [a for a in axes if shape[a] == 4 + num_classes]
    longest = max(axes, key=lambda a: shape[a])
    if sum(shape[a] == shape[longest] for a in axes) > 1:
        return axes  # no axis stands out (an image-like output): every one may be channels
    return [a for a in axes if a != longest]


def _split(a: np.ndarray, axis: int) -> dict | None:
    """The best wide/narrow split of ``a``'s channels along ``axis``, or None (one channel)."""
    k = a.shape[axis]
    if k < 2:
        return None
    others = tuple(i for i in range(a.ndim) if i != axis)
    lo, hi = a.min(axis=others).astype(np.float64), a.max(axis=others).astype(np.float64)
    span = hi - lo
    # for split s (1..k-1): head = channels [0, s), tail = [s, k)
    head_min, head_max = np.minimum.accumulate(span)[:-1], np.maximum.accumulate(span)[:-1]
    tail_min = np.minimum.accumulate(span[::-1])[::-1][1:]
    tail_max = np.maximum.accumulate(span[::-1])[::-1][1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        # the narrow side must vary at all: a constant channel carries nothing to lose
        head_wide = np.where(tail_max > 0, head_min / tail_max, 0.0)
        tail_wide = np.where(head_max > 0, tail_min / head_max, 0.0)
    ratios = np.maximum(head_wide, tail_wide)
    s = int(np.argmax(ratios)) + 1
    wide, narrow = ((0, s), (s, k)) if head_wide[s - 1] >= tail_wide[s - 1] else ((s, k), (0, s))
    wide_span = float(span[wide[0]:wide[1]].min())
    if wide_span < MIN_WIDE_SPAN:
        return None
    # TensorFlow's activation range always holds 0: [min(lo, 0), max(hi, 0)] over the tensor
    step = (max(float(hi.max()), 0.0) - min(float(lo.min()), 0.0)) / 255
    narrow_lo, narrow_hi = float(lo[narrow[0]:narrow[1]].min()), float(hi[narrow[0]:narrow[1]].max())

    def group(c):
        return {"channels": list(c), "min": _round(lo[c[0]:c[1]].min()), "max": _round(hi[c[0]:c[1]].max())}

    return {"axis": axis, "wide": group(wide), "narrow": group(narrow), "ratio": _round(ratios[s - 1]),
            "int8_step": _round(step), "narrow_levels": _round((narrow_hi - narrow_lo) / step) if step > 0 else 0.0}


def _round(x: float) -> float:
    return float(f"{float(x):.4g}")


def hint_text(finding: dict) -> str:
    """The user's line for one :func:`mixed_ranges` finding: what is mixed, what to do."""
    w, n = finding["wide"], finding["narrow"]
    return (f"output {finding['output']} mixes ranges on axis {finding['axis']}: channels "
            f"{w['channels'][0]}-{w['channels'][1] - 1} span [{w['min']:g}, {w['max']:g}] but channels "
            f"{n['channels'][0]}-{n['channels'][1] - 1} only [{n['min']:g}, {n['max']:g}]; quantised per tensor "
            f"(one int8 step = {finding['int8_step']:g}) they keep about {finding['narrow_levels']:.2g} of its "
            "256 levels: split the outputs before quantisation, or normalise the boxes to [0, 1] "
            "(ultralytics/yolov5#10164)")


def reference_sample(ctx: BuildContext, rows: int = HINT_IMAGES,
                     expect: Sequence[Callable | None] | None = None) -> Iterable[tuple[str, np.ndarray]]:
    """The original model's outputs on the first ``rows`` eval (else held-back) images, one
    output at a time; a classifier's class output is left out (its scores are meant to differ).
    ``expect``: per output, what a graph rewrite made of it (a YOLO output's boxes normalised,
    builders/graph/rewrite.py), applied: the int8 model quantises that, not the original's."""
    spools = ctx.reference.get("eval") or ctx.reference.get("holdout") or []
    skip = ctx.class_output if ctx.task == "classify" else None
    for i, (name, spool) in enumerate(zip(ctx.source.output_names, spools)):
        if i != skip and len(spool):
            values = spool.read(np.arange(min(rows, len(spool))))
            change = expect[i] if expect is not None and i < len(expect) else None
            yield name, (change(values) if change is not None else values)


def quantization_report(ctx: BuildContext, make_converter: Callable[[TensorStream], Any],
                        outputs: Mapping[str, str] | None = None,
                        expect: Sequence[Callable | None] | None = None,
                        clamped: Mapping[str, tuple[float, float]] | None = None) -> dict:
    """The report for ``ctx``'s int8 conversion: worst layers, mixed-range findings, hints.

    ``make_converter`` gives the instrumented int8 model (or a ``TFLiteConverter``) calibrated
    on the stream it is handed (``ctx.representative()``); ``outputs`` maps the int8 model's output tensor names
    to the outputs' names; ``expect`` what rewrites made of each output (:func:`reference_sample`:
    an output a rewrite already normalised gets no "normalise the boxes" hint); ``clamped`` the
    tensors whose int8 range is a clamp's (:func:`worst_layers`).
    A debugger failure (the API is experimental) is recorded as ``error`` and the hints are
    still given: the report explains a gate failure, it never causes one.
    """
    report: dict[str, Any] = {"metric": "rmse_over_scale", "ideal": round(IDEAL_RMSE_OVER_SCALE, 4)}
    try:
        rep = ctx.representative()
        report["worst_layers"], report["images"] = layer_errors(make_converter(rep), rep, outputs=outputs,
                                                                clamped=clamped)
    except Exception as exc:  # noqa: BLE001 - TensorFlow raises anything; a diagnosis must not end the build
        first = first_line(exc, 200)
        report.update(worst_layers=[], images=0, error=f"QuantizationDebugger failed: {first}")
    detect = getattr(ctx, "detect", None)  # the detect head says which output axis counts boxes
    layout = getattr(detect, "layout", None)
    classes = getattr(getattr(getattr(detect, "detector", None), "config", None), "num_classes", None)
    mixed = [f for name, values in reference_sample(ctx, expect=expect)
             for f in mixed_ranges({name: values}, layout=layout, num_classes=classes)]
    report["mixed_ranges"] = mixed
    report["hints"] = [hint_text(f) for f in mixed]
    return report


def report_lines(report: dict) -> list[str]:
    """The report as log lines: one per worst layer, then the error and hints."""
    lines = [f"  {i}. {layer['op']} {_fused(layer['tensor'])}"
             + (f" (output {layer['output']})" if layer.get("output") else "")
             + f": RMSE/scale {layer['rmse_over_scale']:.2f}" + _within(layer.get("clamp"))
             for i, layer in enumerate(report.get("worst_layers", []), 1)]
    if lines:
        lines.insert(0, f"worst layers on {report.get('images')} calibration images, RMSE in int8 steps "
                        f"(rounding alone gives {IDEAL_RMSE_OVER_SCALE:.2f}):")
    if report.get("error"):
        lines.append(report["error"])
    lines += [f"hint: {h}" for h in report.get("hints", [])]
    return lines


def _within(clamp: list | None) -> str:
    """What a clamped layer's error is measured against, for its log line."""
    if not clamp:
        return ""
    low, high = (f"{b:g}" if b is not None else "" for b in clamp)
    return f" (against the float values clipped to its clamp [{low or '-inf'}, {high or 'inf'}])"


def _fused(tensor: str) -> str:
    """A tensor's name for a log line: the converter names a fused op's output after every op
    it fused (``a;b;c``); the first is shown, the rest counted (edgekit.json keeps them all)."""
    first, *rest = tensor.split(";")
    return f"{first} (+{len(rest)} fused)" if rest else first


def summary(report: dict, layers: int = 3) -> str:
    """One short clause for a gate failure's reason: the worst layers, and each mixed-range
    output in a few words (the full hint is in the report and the build log)."""
    worst = report.get("worst_layers") or []
    text = ", ".join(f"{_layer_name(w)} ({w['op']}) {w['rmse_over_scale']:.2f}" for w in worst[:layers])
    parts = [f"worst int8 layers by RMSE/scale: {text}"] if text else []
    for f in report.get("mixed_ranges") or []:
        w, n = f["wide"]["channels"], f["narrow"]["channels"]
        parts.append(f"output {f['output']} mixes ranges (channels {w[0]}-{w[1] - 1} vs {n[0]}-{n[1] - 1}, "
                     f"{f['ratio']:g}x): split the outputs or normalise the boxes to [0, 1]")
    return "; ".join(parts)


def _layer_name(layer: dict) -> str:
    """A model output by its name, another tensor by the first of its fused names."""
    return f"output {layer['output']}" if layer.get("output") else layer["tensor"].split(";")[0]
