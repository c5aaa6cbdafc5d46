"""When an int8 model misses the gate: try what the field knows works, within a time budget.

Attempts, in order, each quantised by TensorFlow's post-training quantiser on the float TFLite
graph (rewrites included) and verified like the first:

1. the calibration ranges as TensorFlow's calibrator logs them (builders/int8/quantize.py:
   wider where an op wrote over its input; wider ranges clip less on images unlike the
   calibration ones: the demo detector's box sizes);
2. when the calibration check (builders/int8/stability.py) found the int8 depends on its
   sample, calibration on the count it recommended (as many of the drawn images as there are),
   the row's label saying so;
3. on targets that may run float ops (cpu, rpi: not the Edge TPU, which needs full integer),
   the layers whose int8 output differs most from the float graph's kept in float (TensorFlow's
   ``denylisted_nodes``), 3 then 10 of them; a model output one of them produces stays float
   (builders/int8/float_outputs.py: no int8 rounding after a float op);
4. on the same targets, int16 activations with int8 weights ("16x8", float I/O): 256 times
   finer activation steps, but no XNNPACK kernel runs them, so on cpu and rpi only when
   ``--recover-16x8`` asks (:func:`sixteen_by_eight`, one log line when skipped);
5. calibration on every drawn calibration image (the first saw ``--calib-steps`` of them).

The first attempt that passes is kept; when none does, the best of them (its figure: top-1 or
mAP ratio, a detector without an eval set its agreement with the original's detections, else the
worst output's cosine; a landmark model's: the least mean pixel error; builders/gate/figures.py),
so the ``.rejected`` evidence is the closest miss.
Every attempt is a row of ``verification.recovery`` and a log line, which name each figure the
attempt missed with its value and limit (a classifier's top-1 agreement beside its ratio).
Recovery starts no attempt once it has spent three times the first attempt's time (at least 30 s),
or ``--recovery-budget`` seconds; the log names the attempt it stopped before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.builders.gate.figures import figures, judged, missed
from edgekit.builders.gate.landmarks import judged_px
from edgekit.builders.gate.verdict import failed
from edgekit.builders.int8.float_outputs import outputs_kept_float
from edgekit.builders.int8.recipe import float_graphs
from edgekit.builders.int8.recovery_table import missed_text, table_lines
from edgekit.errors import ModelError

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.builders.contract import BuiltModel
    from edgekit.target import Target

PROBE_IMAGES = 4
HOPELESS = 0.5
"""A first attempt whose figure (ratio or cosine) is under this is a broken calibration or
conversion, not a few layers' rounding: recovery is not tried (it would only cost time)."""
FLOAT_LAYERS = (3, 10)
COST_TIMING_S = 0.3
"""Seconds each attempt is timed for its row's p50 (the build's speed line times the kept one longer)."""
LOGGED_RANGES_LABEL = "calibration ranges as TensorFlow logs them (wider)"
SIXTEEN_BY_EIGHT_LABEL = "int16 activations, int8 weights (16x8; float I/O)"


@dataclass(frozen=True)
class Attempt:
    """One recovery attempt: its row's label, the calibration images, the layers kept in float,
    and the quantiser: ``int8`` (observed ranges), ``logged`` (TensorFlow's ranges) or ``16x8``."""

    label: str
    images: Any
    denied: list[str] | None = None
    quantiser: str = "int8"

    def quantise(self, float_model: bytes, representative, io_dtype: str) -> bytes:
        """The attempt's model from the float graph, calibrated on ``representative``."""
        from edgekit.builders.int8.quantize import quantize_16x8, quantize_int8

        if self.quantiser == "16x8":
            return quantize_16x8(float_model, representative)
        return quantize_int8(float_model, representative, io_dtype, denylisted_nodes=self.denied,
                             logged_ranges=self.quantiser == "logged")


def recover(ctx: BuildContext, target: Target, path: Path, first: tuple[BuiltModel, dict],
            finish, first_seconds: float) -> tuple[BuiltModel, dict]:
    """Retry a missed int8 (see the module doc); ``finish(blob, rewrites, seconds)`` writes
    ``path`` and verifies it. Returns the kept (model, coverage); ``path`` holds its file."""
    rows = [_row("as built", first[0], _cost(ctx, target, path, first[0]), ctx.task, ctx.request)]
    if _hopeless(rows[0], first[0]):
        first_figure = f"{rows[0]['figure_name']} {rows[0]['figure']}"
        ctx.log.info(f"[{target.name}] int8 recovery: not tried ({first_figure} is too far from the gate for float "
                     "layers or more calibration to close; check the calibration images)")
        return replace(first[0], verification=dict(first[0].verification, recovery=rows)), first[1]
    budget = time_budget(ctx, first_seconds)
    started = time.monotonic()
    best, best_blob, kept = first, path.read_bytes(), 0
    graphs = float_graphs(ctx)
    float_model, rewrites = graphs.for_int8, graphs.rewrites
    io_dtype = first[0].input.dtype if first[0].input.dtype in ("uint8", "int8") else "uint8"
    for attempt in _attempts(ctx, target, float_model, first[0]):
        label = attempt.label
        if time.monotonic() - started > budget:
            ctx.log.info(f"[{target.name}] int8 recovery: time budget ({budget:.0f} s) spent; stopping before "
                         f"'{label}' (--recovery-budget S gives the attempts longer)")
            break
        if _over_cap(ctx, target, label):  # an attempt converts again: it peaks as high as the first did
            continue
        try:
            with ctx.log.step(f"[{target.name}] int8 recovery: {label}") as step:
                blob = attempt.quantise(float_model, attempt.images.stream(ctx._nhwc, ctx.chunk), io_dtype)
                if attempt.denied:  # an output whose producer stays float stays float (builders/int8/float_outputs.py)
                    blob, label = outputs_kept_float(blob, ctx, target, label)
            candidate = finish(blob, rewrites, step["seconds"], report=False)
        except ModelError as exc:  # one attempt TensorFlow cannot make (16x8 of DEPTH_TO_SPACE): the next
            ctx.log.info(f"[{target.name}] int8 recovery: {label}: not possible ({exc.message[:200]})")
            continue
        rows.append(_row(label, candidate[0], _cost(ctx, target, path, candidate[0]), ctx.task, ctx.request))
        ctx.log.info(f"[{target.name}] int8 recovery: {label}: {rows[-1]['figure_name']} {rows[-1]['figure']}, "
                     + ("passed" if rows[-1]["passed"] else missed_text(rows[-1])))
        if rows[-1]["passed"] or _figure(candidate[0], ctx.task) > _figure(best[0], ctx.task):
            best, best_blob, kept = candidate, blob, len(rows) - 1
        if rows[-1]["passed"]:
            break
    path.write_bytes(best_blob)  # the file is the last one tried; the bundle gets the kept one
    for i, row in enumerate(rows):
        row["kept"] = i == kept
    for line in table_lines(target.name, rows):
        ctx.log.info(line)
    label = rows[kept]["label"]
    precision = (f"int8 ({label.split(' worst')[0]} layers float)" if "in float" in label
                 else "int8 weights, int16 activations (16x8)" if "16x8" in label else best[0].precision)
    verification = dict(best[0].verification, recovery=rows)
    if "quantization" in first[0].verification:  # the per-layer report of the first attempt says where it lost
        verification.setdefault("quantization", first[0].verification["quantization"])
    if "calibration_stability" in first[0].verification:  # builders/int8/stability.py: of the first attempt
        verification["calibration_stability"] = dict(first[0].verification["calibration_stability"], of="as built")
    return replace(best[0], precision=precision, verification=verification), best[1]


def time_budget(ctx: BuildContext, first_seconds: float) -> float:
    """Seconds recovery's attempts may take: ``--recovery-budget``, else three times the first int8's
    build (at least 30 s). Recalibrating on more images costs more than the first attempt: on
    MediaPipe's full-range BlazeFace it and the wider ranges spent the 70 s, and the float-layer
    attempts were never reached."""
    asked = getattr(ctx.request, "recovery_budget", None)
    return float(asked) if asked else max(3 * first_seconds, 30.0)


def _attempts(ctx: BuildContext, target: Target, float_model: bytes, first: BuiltModel):
    """Each :class:`Attempt`, made lazily, the likeliest to help first: TensorFlow's wider ranges
    and the calibration count the calibration check recommended when it found the int8 depends
    on its sample (full-integer models, faster than ones with float layers), then float layers
    and 16x8 where the target allows them, then every calibration image."""
    if ctx.converter_calib is not None:
        yield Attempt(LOGGED_RANGES_LABEL, ctx.converter_calib, quantiser="logged")
    recommended = recommended_attempt(ctx, first)
    if recommended is not None:
        yield Attempt(*recommended)
    if not ctx.options_for(target).get("compile"):  # the Edge TPU runs full-integer models only
        worst, before = worst_layers(float_model, ctx), 0
        for count in FLOAT_LAYERS:  # a small model's every layer, when it has fewer than the next count
            if len(worst) > before or count == FLOAT_LAYERS[0]:
                yield Attempt(f"{min(count, len(worst))} worst layers in float", ctx.converter_calib, worst[:count])
            before = count
        if sixteen_by_eight(ctx, target):
            yield Attempt(SIXTEEN_BY_EIGHT_LABEL, ctx.converter_calib, quantiser="16x8")
    tried = len(recommended[1]) if recommended is not None else None
    if ctx.converter_calib is not None and tried != len(ctx.calib) > len(ctx.converter_calib):
        yield Attempt(f"calibration on all {len(ctx.calib)} images", ctx.calib)


def sixteen_by_eight(ctx: BuildContext, target: Target) -> bool:
    """Whether recovery tries 16x8 on ``target``: not on XNNPACK's (cpu, rpi) unless ``--recover-16x8``
    asks: no XNNPACK kernel runs int16 activations, so it is never a sensible default, only build minutes
    (measured: MediaPipe's selfie segmenter 82.8 ms against fp32's 4.64, its palm detector 1514 ms
    against 20.8, its pose landmarks 695 ms against int8's 9.9)."""
    if target.runtime_options.get("delegate", "xnnpack") != "xnnpack" or ctx.request.recover_16x8:
        return True
    ctx.log.info(f"[{target.name}] int8 recovery: 16x8 (int16 activations) not tried: XNNPACK has no kernel for "
                 "it, so it runs 18-73x slower than fp32 there (--recover-16x8 tries it anyway)")
    return False


def recommended_attempt(ctx: BuildContext, first: BuiltModel) -> tuple[str, Any] | None:
    """``(label, images)`` of the attempt at the calibration count the calibration check
    recommended (builders/int8/stability.py), or None when it recommended none or no more images
    than the first attempt saw are at hand. At most every image drawn: the non-held-back ones
    first, then (when an eval set, not they, is what the gate judges) the held-back ones; the
    label says how many were used and what was recommended."""
    record = first.verification.get("calibration_stability") or {}
    want = record.get("recommended_images")
    if not want or ctx.converter_calib is None:
        return None
    pool = len(ctx.calib)
    held_usable = ctx.evalset is not None and ctx.task != "raw"
    n = min(int(want), len(ctx.calib_all) if held_usable else pool)
    if n <= len(ctx.converter_calib):
        return None
    if n <= pool:
        images = ctx.calib.subset(np.arange(n))
    else:  # the whole pool and the last of the held-back images (calib_all: held back first)
        images = ctx.calib_all.subset(np.arange(len(ctx.calib_all) - n, len(ctx.calib_all)))
    held = f", {n - pool} held-back among them" if n > pool else ""
    how = "the count" if n == want else f"all there are of the {want}"
    return f"calibration on {n} images{held} ({how} the calibration check recommended)", images


def worst_layers(float_model: bytes, ctx: BuildContext) -> list[str]:
    """Tensor names of the int8 model's op outputs, worst first by relative error against the
    float graph's same tensor on a few calibration images (both run with every tensor kept).
    A tensor whose int8 range is a clamp's (builders/graph/clamps.py) is compared with its float
    values clipped as the clamp clips them: the clamp's cut is no error to keep in float."""
    from edgekit.builders.graph.clamps import clamped_ranges
    from edgekit.builders.int8.quantize import quantize_int8

    images = [np.asarray(x, np.float32)[None] for _, x in zip(range(PROBE_IMAGES), ctx.representative())]
    quantized = quantize_int8(float_model, ctx.representative(), "uint8")
    return streamed_ranking(float_model, quantized, images, clamped_ranges(float_model))


def streamed_ranking(reference: bytes, got: bytes, images: list[np.ndarray],
                     clamped: dict[str, tuple[float, float]]) -> list[str]:
    """:func:`ranked_layers` of two models' op outputs over ``images``, one image at a time: each
    tensor's squared error and squared norm are summed image by image, so only one image's tensors
    of each model are held (kept whole, four images of both models in float64 took 20-26x the
    graph's activations of one image: 2.3 GB on MediaPipe's palm detector)."""
    runs = [_TensorRun(reference), _TensorRun(got)]
    sums: dict[str, list[float]] = {}  # name -> [squared error, squared norm, elements, images]
    for x in images:
        ref, out = (run.outputs(x) for run in runs)
        for name, r in ref.items():
            g = out.get(name)
            if g is None or g.shape != r.shape:
                continue
            if name in clamped:
                r = np.clip(r, *clamped[name])
            d, acc = g - r, sums.setdefault(name, [0.0, 0.0, 0, 0])
            acc[0] += float(np.dot(d, d))
            acc[1] += float(np.dot(r, r))
            acc[2] += r.size
            acc[3] += 1
        del ref, out
    scored = [(float(np.sqrt(e) / (np.sqrt(n) + 1e-9)), name) for name, (e, n, size, seen) in sums.items()
              if seen == len(images) and size > 1]
    return [name for _, name in sorted(scored, reverse=True)]


def ranked_layers(reference: dict[str, np.ndarray], got: dict[str, np.ndarray],
                  clamped: dict[str, tuple[float, float]]) -> list[str]:
    """The names of ``got``'s tensors, worst first by relative error against ``reference``'s
    (clipped to ``clamped``'s range where a tensor has one); tensors of one value are left out."""
    scored = []
    for name, ref in reference.items():
        if name in got and got[name].shape == ref.shape and ref.size > 1:
            if name in clamped:
                ref = np.clip(ref, *clamped[name])
            scored.append((float(np.linalg.norm(got[name] - ref) / (np.linalg.norm(ref) + 1e-9)), name))
    return [name for _, name in sorted(scored, reverse=True)]


def _tensors(blob: bytes, images: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Every float (or dequantised) op output of a model over ``images``, stacked, by name (see
    :class:`_TensorRun`)."""
    run, found = _TensorRun(blob), {}
    for x in images:
        for name, value in run.outputs(x).items():
            found.setdefault(name, []).append(value)
    return {name: np.concatenate(v) for name, v in found.items() if len(v) == len(images)}


class _TensorRun:
    """A model run with every tensor kept, giving one image's float (or dequantised) op outputs by
    name: not its constants or input, which no denylist puts in float (a clamp's bound, 16 in float
    and the top of the clamped range in int8, ranked first)."""

    def __init__(self, blob: bytes):
        from edgekit.builders.int8.quantize import every_tensor_kept

        self.interp = every_tensor_kept(blob)
        self.detail = self.interp.get_input_details()[0]
        self.produced = {int(i) for op in self.interp._get_ops_details() for i in op["outputs"]}

    def outputs(self, x: np.ndarray) -> dict[str, np.ndarray]:
        detail, interp = self.detail, self.interp
        if np.dtype(detail["dtype"]) != np.float32:
            scale, zero = detail["quantization"]
            info = np.iinfo(detail["dtype"])
            x = np.clip(np.round(x / scale + zero), info.min, info.max).astype(detail["dtype"])
        interp.set_tensor(detail["index"], x)
        interp.invoke()
        found = {}
        for t in interp.get_tensor_details():
            value = _value(interp, t) if t["index"] in self.produced else None
            if value is not None:
                found[t["name"]] = value.ravel()
        return found


def _value(interp, tensor: dict) -> np.ndarray | None:
    try:
        value = interp.get_tensor(tensor["index"])
    except ValueError:  # a tensor without data (an unused optional input)
        return None
    if value.dtype == np.float32:
        return value.astype(np.float64)
    scale, zero = tensor.get("quantization", (0.0, 0))
    if scale and value.dtype in (np.int8, np.uint8):
        return (value.astype(np.float64) - zero) * scale
    return None


def _hopeless(row: dict[str, Any], model: BuiltModel) -> bool:
    """The first attempt is too far from the gate for recovery: a figure under HOPELESS, or a mean
    landmark error over a tenth of the input (builders/gate/landmarks.py: BROKEN_SHARE)."""
    px = judged_px(model.verification)
    if px is not None:
        return px[0] > px[2]
    return row["figure"] < HOPELESS


def _figure(model: BuiltModel, task: str | None = None) -> float:
    """The number attempts are compared by, higher the better (builders/gate/figures.py: the eval
    ratio, a detector's agreement with its original without an eval set, else the worst cosine;
    a landmark model's mean pixel error, negated)."""
    found = judged(model.verification, task)
    if found is None:
        return float("-inf")
    return -found[1] if found[0] == "px mean" else found[1]


def _cost(ctx: BuildContext, target: Target, path: Path, model: BuiltModel) -> dict[str, Any]:
    """What an attempt costs on the device: its p50 here (XNNPACK or the kernels it runs with,
    a short timing: a proxy, like the build's speed line) and, for the Edge TPU, the ops predicted
    on the TPU (the offline check). Best-effort: a figure that cannot be taken is None."""
    from edgekit.builders.gate.speed import measure
    from edgekit.errors import EdgekitError

    cost: dict[str, Any] = {"p50_ms": None, "tpu_ops": None}
    options = {"delegate": "xnnpack", **(model.runtime_options or {})}
    if options["delegate"] == "edgetpu":  # the plain int8 file runs on this host's CPU
        options["delegate"] = "xnnpack"
    try:
        cost["p50_ms"] = round(measure({"m": (path, options)}, COST_TIMING_S, rounds=1)["m"].p50_ms, 3)
    except (EdgekitError, RuntimeError, ValueError) as exc:
        ctx.log.record(f"int8 recovery: not timed ({exc})", f"[{target.name}] ")
    if ctx.options_for(target).get("compile"):
        from edgekit.tflite.edgetpu_rules import check_model

        report = check_model(path)
        cost["tpu_ops"] = f"{report.tpu_ops}/{report.total_ops}"
    return cost


def _row(label: str, model: BuiltModel, cost: dict[str, Any] | None = None, task: str | None = None,
         request: Any = None) -> dict[str, Any]:
    """One attempt's row: the figure attempts are compared by, every figure it missed (value, limit,
    flag: builders/gate/figures.py) and the figures of its task's gate, what it costs."""
    passed = not failed(model.verification)
    name, figure = judged(model.verification, task) or ("worst cosine", float("-inf"))
    return {"label": label, "figure_name": name, "figure": round(figure, 6), "passed": passed,
            "missed": [m.to_dict() for m in missed(model.verification, task or "", request)],
            "figures": figures(model.verification, task or ""),
            "seconds": round(model.convert_seconds, 2), **(cost or {})}


def _over_cap(ctx: BuildContext, target: Target, label: str) -> bool:
    """Whether ``--max-memory`` rules an attempt out (said in one line): each one quantises the
    float model again, so it needs about what the build has peaked at so far."""
    from edgekit.builders.host.resources import GB, build_peak

    cap, peak = ctx.request.max_memory, build_peak()
    if not cap or peak <= cap:
        return False
    ctx.log.info(f"[{target.name}] int8 recovery: {label}: skipped, it needs about {peak / GB:.2f} GB "
                 f"(the build's peak so far), over --max-memory {cap / GB:.2f} GB")
    return True
