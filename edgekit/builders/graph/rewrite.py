"""Rewrites of a float TFLite graph into equivalent ops an int8 accelerator maps, before quantising.

MobileNetV3-family blocks are everywhere in published models, and their activations are the
ops int8 back ends lack: the Edge TPU has no ``HARD_SWISH`` (google-coral/edgetpu#272: the graph
is cut at the first one, so PaddleOCR's orientation classifier is predicted 3/115 ops on the
TPU) and XNNPACK leaves int8 ``HARD_SWISH`` and ``RELU_0_TO_1`` on built-in kernels (an int8
model 8.8x slower than its fp32). Each is rewritten exactly, in ops both map:

- ``HARD_SWISH(x)`` -> ``x * RELU6(x + 3) * (1/6)`` (ADD, RELU6, MUL, MUL)
- ``RELU_0_TO_1(x)`` (a hard sigmoid's clip) -> ``RELU6(x * 6) * (1/6)`` (MUL, RELU6, MUL)

The rewritten float graph computes the same function (to float rounding); the caller verifies it
against the original on the calibration images before quantising it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgekit.builders.graph import edit, prelu
from edgekit.builders.graph import ops as tflite_ops

HARD_SWISH, RELU_0_TO_1 = 117, 152  # tflite::BuiltinOperator
ADD, MUL, RELU6 = 0, 18, 21


@dataclass(frozen=True)
class Rewrite:
    """What was rewritten: the op name and how many."""

    op: str
    count: int
    into: str
    expect: tuple | None = field(default=None, compare=False, repr=False)
    """Per output, what turns the original graph's output into this rewrite's (None: unchanged);
    not in the manifest. Verification compares the rewritten model with the original through
    it (:func:`source_expect`; a YOLO output's boxes are normalised and clamped)."""

    task_options: dict | None = field(default=None, compare=False, repr=False)
    """What the rewritten model's task head must be told (a YOLO output's ``box_units``), laid
    over the model's ``task_options`` in the manifest (:func:`manifest_extra`)."""

    def to_dict(self) -> dict:
        return {"op": self.op, "count": self.count, "into": self.into}


def source_expect(rewrites: list[Rewrite], order: list[int]) -> list | None:
    """Per source output ``j``, what turns the original's output into what the rewritten model
    gives at its output ``order[j]`` (None: unchanged); None when no rewrite changed an output.
    Verification compares a variant with the original through it (builders/context.py)."""
    steps = [r.expect for r in rewrites if r.expect]
    if not steps:
        return None

    def chain(position: int):
        funcs = [e[position] for e in steps if position < len(e) and e[position] is not None]
        if not funcs:
            return None
        return lambda ref: _apply(funcs, ref)

    return [chain(position) for position in order]


def _apply(funcs: list, ref: np.ndarray) -> np.ndarray:
    for f in funcs:
        ref = f(ref)
    return ref


def manifest_extra(rewrites: list[Rewrite], extra: dict) -> dict:
    """A model entry's ``extra`` with what ``rewrites`` add: their list (``rewrites``) and the
    task options they imply laid over ``extra``'s (the rewritten model's own truth wins)."""
    if not rewrites:
        return extra
    options = {k: v for r in rewrites for k, v in (r.task_options or {}).items()}
    out = {**extra, "rewrites": [r.to_dict() for r in rewrites]}
    if options:
        out["task_options"] = {**(extra.get("task_options") or {}), **options}
    return out


REWRITES = {HARD_SWISH: ("HARD_SWISH", "x * RELU6(x + 3) / 6"), RELU_0_TO_1: ("RELU_0_TO_1", "RELU6(6x) / 6")}


def rewrite_for_int8(blob: bytes) -> tuple[bytes, list[Rewrite]]:
    """The float model with every op of :data:`REWRITES` expanded; and what was rewritten.

    A model with none comes back unchanged with an empty list.
    """
    model = edit.read(edit.float32_weights(blob))
    counts: dict[int, int] = {}
    for sg in model.subgraphs:
        ops = []
        for op in sg.operators:
            code = edit.opcode_of(model, op.opcodeIndex)
            if code in REWRITES and sg.tensors[op.inputs[0]].type == edit.FLOAT32:
                ops += _expand(model, sg, op, code)
                counts[code] = counts.get(code, 0) + 1
            else:
                ops.append(op)
        sg.operators = ops
    if not counts:
        return blob, []
    done = [Rewrite(REWRITES[c][0], n, REWRITES[c][1]) for c, n in sorted(counts.items())]
    return edit.write(edit.pruned(model)), done


def _expand(model, sg, op, code: int) -> list:
    """The ops replacing one HARD_SWISH or RELU_0_TO_1 ``op`` (same input and output tensors)."""
    x, out = int(op.inputs[0]), int(op.outputs[0])
    if code == HARD_SWISH:
        shifted = _temp(model, sg, out, "hswish_add")
        clipped = _temp(model, sg, out, "hswish_relu6")
        gated = _temp(model, sg, out, "hswish_mul")
        return [_op(model, sg, ADD, [x, _scalar(model, sg, 3.0)], shifted),
                _op(model, sg, RELU6, [shifted], clipped),
                _op(model, sg, MUL, [x, clipped], gated),
                _op(model, sg, MUL, [gated, _scalar(model, sg, 1 / 6)], out)]
    scaled = _temp(model, sg, out, "hsig_mul")
    clipped = _temp(model, sg, out, "hsig_relu6")
    return [_op(model, sg, MUL, [x, _scalar(model, sg, 6.0)], scaled),
            _op(model, sg, RELU6, [scaled], clipped),
            _op(model, sg, MUL, [clipped, _scalar(model, sg, 1 / 6)], out)]


# the shared graph edits (builders/graph/ops.py), by the names this module's code uses
_temp, _scalar, _op = tflite_ops.temp, tflite_ops.scalar, tflite_ops.op


CHECK_IMAGES = 8
MAX_RELATIVE_ERROR = 1e-3


def rewrite_checked(blob: bytes, representative, log, target: str,
                    xnnpack: bool = False) -> tuple[bytes, list[Rewrite]]:
    """:func:`rewrite_for_int8` (and, for a target whose int8 runs on XNNPACK, PRELU in ops it
    maps: builders/graph/prelu.py), kept only when the rewritten float graph gives the original's
    outputs on the first calibration images (largest difference within 0.1 % of the output's
    range); logged either way. Returns the graph to quantise and the rewrites it holds."""
    images = [np.asarray(x, np.float32)[None] for _, x in zip(range(CHECK_IMAGES), representative)]
    rewritten, done = rewrite_for_int8(blob)
    if xnnpack:
        rewritten, count = prelu.rewrite_prelu(rewritten)
        done = [*done, Rewrite("PRELU", count, prelu.INTO)] if count else done
    rewritten, more, factors = accelerator_rewrites(blob, rewritten, images)
    done = [*done, *more]
    if not done:
        return blob, []
    error = _relative_error(blob, rewritten, images, factors)
    what = ", ".join(f"{r.op} x{r.count} into {r.into}" for r in done)
    if error > MAX_RELATIVE_ERROR:
        log.warn(f"[{target}] int8: rewriting {what} changed the float outputs ({error:.2g} of their range on "
                 f"{len(images)} calibration images): quantising the graph as it is")
        return blob, []
    log.info(f"[{target}] int8: rewrote {what} before quantising (ops the Edge TPU and XNNPACK map in int8; "
             f"float outputs within {error:.2g} of their range on {len(images)} calibration images)")
    return rewritten, done


def accelerator_rewrites(original: bytes, blob: bytes, images: list[np.ndarray]
                         ) -> tuple[bytes, list[Rewrite], list | None]:
    """Layout and output rewrites for int8 accelerators on ``blob`` (``original`` rewritten so
    far): layout TRANSPOSEs dropped (builders/graph/layout.py, transposes.py), grouped convolutions
    of one channel a group made depthwise (grouped.py), a YOLO output's pixel boxes normalised
    (yolo.py) and Edge TPU-mapped ops ordered first (layout.py).
    Returns the graph, what was rewritten, and per output what turns the original's values into
    the rewritten graph's (None: the same values)."""
    from edgekit.builders.graph import grouped, transposes, yolo
    from edgekit.builders.graph import layout as tflite_layout
    from edgekit.tflite.edgetpu_ops import SUPPORTED_OPS

    model = edit.read(blob)
    done, factors = [], None
    cut = tflite_layout.first_unmapped(model, lambda name: name in SUPPORTED_OPS)
    dropped = tflite_layout.drop_transpose_pairs(model) + transposes.drop_layout_regions(model)
    if dropped:
        now = tflite_layout.first_unmapped(model, lambda name: name in SUPPORTED_OPS)
        done.append(Rewrite("TRANSPOSE", dropped, "none: the ops between a layout TRANSPOSE and its inverse run on the "
                                                  "untransposed tensors (Edge TPU-mapped ops before the first "
                                                  f"unmapped one: {now[0]}/{now[1]}, was {cut[0]}/{cut[1]})"))
    depthwise = grouped.depthwise_convolutions(model)
    if depthwise:
        done.append(Rewrite("CONV_2D", depthwise, "DEPTHWISE_CONV_2D (grouped, one input channel a group)"))
    found = yolo.yolo_output(model)
    if found is not None and images and yolo.pixel_boxes(float_outputs(original, images), found[1]):
        axis, _ = yolo.normalise_boxes(model) or found[1:]
        sg = model.subgraphs[0]
        shape, (w, h) = tuple(int(d) for d in sg.tensors[int(sg.outputs[0])].shape), yolo.input_size(model)
        clamped = yolo.clamp_corners(model, yolo.yolo_output(model)[0])
        factors = [yolo.expected(shape, axis, (w, h), clamped)]
        done.append(Rewrite("YOLO pixel boxes", 1, f"boxes / {w}x{h} (normalised to [0, 1] like the scores; "
                                                   "box_units=normalized in the manifest)"
                                                   + ("; corners clamped to the input" if clamped else ""),
                            expect=tuple(factors), task_options={"box_units": "normalized"}))
    before, after = tflite_layout.defer_unmapped(model, lambda name: name in SUPPORTED_OPS)
    if after > before:
        done.append(Rewrite("op order", after - before, f"Edge TPU-mapped ops first: first unmapped op at "
                                                        f"{after}, was {before}"))
    if not done:
        return blob, [], None
    return edit.write(edit.pruned(model)), done, factors


def float_outputs(blob: bytes, images: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Per image, the float outputs of a float model."""
    from edgekit.util.quiet import litert_interpreter

    interp = litert_interpreter(model_content=blob)
    interp.allocate_tensors()
    index = interp.get_input_details()[0]["index"]
    outs = []
    for x in images:
        interp.set_tensor(index, x)
        interp.invoke()
        outs.append([np.array(interp.get_tensor(d["index"]), np.float64) for d in interp.get_output_details()])
    return outs


def _relative_error(a: bytes, b: bytes, images: list[np.ndarray], expect: list | None = None) -> float:
    """The largest output difference of two float models over ``images``, relative to the range;
    ``expect``: per output, what turns ``a``'s into what ``b`` should give (a rewrite that rescaled it)."""
    worst = 0.0
    for ref, got in zip(float_outputs(a, images), float_outputs(b, images)):
        for i, (r, g) in enumerate(zip(ref, got)):
            r = expect[i](r) if expect is not None and expect[i] is not None else r
            span = float(np.max(np.abs(r))) or 1.0
            worst = max(worst, float(np.max(np.abs(r - g))) / span)
    return worst


MAXIMUM, MINIMUM = 55, 57
SCORE_CLAMP = 16.0
"""Sigmoid score logits are clamped to +-16 at most (sigmoid(16) = 1 - 1.1e-7): the decoded scores
do not change, and per-tensor int8 keeps its 256 levels where the scores live."""


def clamp_outputs(blob: bytes, positions: list[int], bound: float) -> bytes:
    """The model with each output at ``positions`` clamped to ``[-bound, bound]`` in the graph
    (MINIMUM then MAXIMUM, ops the Edge TPU maps); the clamped tensor keeps the output's name.

    A detector's raw score logits can span hundreds one way (BlazeFace: about -266 to 3): one
    int8 scale for that range leaves 5 distinct scores, and a threshold above the fourth finds
    nothing. MediaPipe clips the logits after the fact (``score_clipping_thresh``); clipping them
    before quantising keeps the resolution.
    """
    model = edit.read(blob)
    sg = model.subgraphs[0]
    outputs = [int(t) for t in sg.outputs]
    for p in positions:
        old = outputs[p]
        name = sg.tensors[old].name or b"scores"
        mid, new = _temp(model, sg, old, "clamp_min"), _temp(model, sg, old, "clamped")
        sg.tensors[new].name, sg.tensors[old].name = name, name + b"/unclamped"
        sg.operators += [_op(model, sg, MINIMUM, [old, _scalar(model, sg, bound)], mid),
                         _op(model, sg, MAXIMUM, [mid, _scalar(model, sg, -bound)], new)]
        outputs[p] = new
        for sig in model.signatureDefs or []:
            for item in sig.outputs or []:
                if int(item.tensorIndex) == old:
                    item.tensorIndex = new
    sg.outputs = outputs
    return edit.write(model)


def box_clamp(detect) -> tuple[int, float] | None:
    """``(source output index, bound)`` of a MediaPipe-decoded SSD's box/keypoint regressors:
    values past twice the decode scale put a box outside the image, and on scenes the detector
    was not made for they reach +-1400 (BlazeFace), which per-tensor int8 pays for with an 11 px
    step on every box; clamped to twice the largest scale, the step is 2 px."""
    decode = getattr(getattr(getattr(detect, "detector", None), "config", None), "ssd_decode", None)
    if detect is None or detect.layout != "ssd" or not detect.roles or decode is None:
        return None
    scales = [getattr(decode, k, None) for k in ("x_scale", "y_scale", "w_scale", "h_scale")]
    scales = [float(v) for v in scales if v]
    return (int(detect.roles[0]), 2 * max(scales)) if scales else None


def score_clamp(detect, logits=None) -> tuple[int, float] | None:
    """``(source output index, bound)`` of an SSD detector's sigmoid score logits, else None.

    With ``score_activation`` auto the decoder applies the sigmoid to scores outside [0, 1];
    ``logits(index)`` says whether the float model's output ``index`` holds such values on the
    calibration images (None: treat auto as not logits)."""
    if detect is None or detect.layout != "ssd" or not detect.roles or len(detect.roles) < 2:
        return None
    config = detect.detector.config
    decode = getattr(config, "ssd_decode", None)
    sigmoid = config.score_activation == "sigmoid" or (decode is not None and decode.sigmoid_score)
    if config.score_activation == "auto" and not sigmoid and logits is not None:
        sigmoid = bool(logits(int(detect.roles[1])))
    if not sigmoid:
        return None
    thresh = decode.score_clipping_thresh if decode is not None else None
    return int(detect.roles[1]), min(float(thresh), SCORE_CLAMP) if thresh else SCORE_CLAMP
