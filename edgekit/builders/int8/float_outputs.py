"""An output whose producer an int8 recovery attempt keeps in float stays float.

When recovery keeps layers in float (TensorFlow's ``denylisted_nodes``, builders/int8/recovery.py)
and one of them produces a model output, TensorFlow's quantiser still ends that output in int8: the
float op's result goes through a ``QUANTIZE`` to int8 and, for uint8 I/O, another to uint8. That
rounds the output to 256 levels for nothing (the op ran in float; the device's heads read a float
output as readily as an int8 one, builders/gate and edgekit/heads/tensors.py): on MediaPipe's
pose_landmark_full the segmentation mask's IoU went 0.744 with its heads in float to 0.819 with the
same heads in float and float outputs (issue 37).

TensorFlow's quantiser takes one type for all outputs (``mlir_quantize``'s ``output_data_type``,
the converter's ``inference_output_type``): float for all would add a ``DEQUANTIZE`` after every int8
output too. So the trailing ``QUANTIZE`` ops are dropped on the flatbuffer, output by output: an
output reached from a float tensor through ``QUANTIZE`` ops only becomes that float tensor (under the
output's name, in the subgraph's outputs and its signature), and the ``QUANTIZE`` ops nothing else reads
go. Every other output keeps its type. The edit is checked on calibration images like the graph
rewrites: each freed output equals the int8 one it replaces within a step of that int8's scale
(rounding; clipped to its range), every other output is unchanged; else the int8 file is kept.

The Edge TPU never gets this: its recovery keeps nothing in float (full-integer models only, so
no output has a float producer), and its compiler maps a graph from the input until the first op
it cannot run, so an int8 output is what keeps the last ops on the TPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.builders.graph.edit import FLOAT32, constant_data, load_schema, pruned, read, valid_indices, write

if TYPE_CHECKING:
    from edgekit.builders.context import BuildContext
    from edgekit.target import Target

CHECK_IMAGES = 4
MAX_STEPS = 1.0
"""The most a freed output may differ from the int8 one it replaces, in that int8's steps: half a step
rounding to int8, up to half again requantising to the I/O type."""


def float_outputs(blob: bytes) -> tuple[bytes, dict[int, str]]:
    """The model with each output whose value comes from a float op through ``QUANTIZE`` ops only made
    that float tensor, and the outputs so freed: position -> name (the signature's key, a SavedModel's
    output name, else the tensor's; ``blob`` itself when none)."""
    _, fb = load_schema()
    model = read(blob)
    sg = model.subgraphs[0]
    producer = {t: op for op in sg.operators for t in valid_indices(op.outputs)}
    outputs = valid_indices(sg.outputs)
    chains, freed = [], {}
    for position, tensor in enumerate(outputs):
        chain, source = [], tensor
        while (op := producer.get(source)) is not None and fb.opcode_to_name(model, op.opcodeIndex) == "QUANTIZE":
            chain.append(op)
            source = valid_indices(op.inputs)[0]
            if sg.tensors[source].type == FLOAT32:
                break
        if not chain or sg.tensors[source].type != FLOAT32 or source not in producer or source in outputs \
                or constant_data(model, sg.tensors[source]) is not None:
            continue  # an int8 producer, a graph input or a constant: nothing float to hand over
        sg.tensors[source].name = sg.tensors[tensor].name
        sg.outputs[position] = source
        keys = []
        for sig in model.signatureDefs or []:
            for item in sig.outputs or []:
                if item.tensorIndex == tensor:
                    item.tensorIndex = source
                    keys.append(item.name)
        chains.extend(chain)
        freed[position] = _text(keys[0] if keys else sg.tensors[tensor].name)
    if not freed:
        return blob, {}
    _drop_unread(sg, chains)
    return write(pruned(model)), freed


def _text(name: bytes | str) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def _drop_unread(sg, candidates: list) -> None:
    """Remove the ``candidates`` ops whose outputs no remaining op reads and no output is (one
    ``QUANTIZE`` may also feed int8 ops: it stays), repeated down each chain."""
    removed = True
    while removed:
        read_now = {t for op in sg.operators for t in valid_indices(op.inputs)} | set(valid_indices(sg.outputs))
        unread = [op for op in candidates if op in sg.operators
                  and not read_now.intersection(valid_indices(op.outputs))]
        removed = bool(unread)
        sg.operators = [op for op in sg.operators if not any(op is u for u in unread)]


def steps_apart(before: bytes, after: bytes, freed: dict[int, str], images: list[np.ndarray]) -> float:
    """The largest difference over ``images`` between each freed float output of ``after`` and the int8
    output of ``before`` it replaces, in that int8's steps (the float value clipped to the int8's
    range first: int8 clips, float need not); ``inf`` when any other output differs at all."""
    worst = 0.0
    for x in images:
        old, new = _run(before, x), _run(after, x)
        for position, ((q, (scale, zero), dtype), (value, _, _)) in enumerate(zip(old, new)):
            if position not in freed:
                if not np.array_equal(q, value):
                    return float("inf")
                continue
            info = np.iinfo(dtype)
            low, high = (info.min - zero) * scale, (info.max - zero) * scale
            dequantised = (q.astype(np.float64) - zero) * scale
            worst = max(worst, float(np.abs(np.clip(value, low, high) - dequantised).max()) / scale)
    return worst


def _run(blob: bytes, x: np.ndarray) -> list[tuple[np.ndarray, tuple[float, int], Any]]:
    """Every output of ``blob`` on one float image (quantised to the input's type when it is integer):
    (value, (scale, zero point), dtype), on LiteRT's own kernels (the same ones for both models)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(model_content=blob,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    detail = interp.get_input_details()[0]
    if np.dtype(detail["dtype"]) != np.float32:
        scale, zero = detail["quantization"]
        info = np.iinfo(detail["dtype"])
        x = np.clip(np.round(x / scale + zero), info.min, info.max).astype(detail["dtype"])
    interp.set_tensor(detail["index"], x)
    interp.invoke()
    return [(interp.get_tensor(d["index"]).copy(), d["quantization"], d["dtype"]) for d in interp.get_output_details()]


def outputs_kept_float(blob: bytes, ctx: BuildContext, target: Target, label: str) -> tuple[bytes, str]:
    """``blob`` (an attempt that kept layers in float) with the outputs of float producers float, checked
    on a few calibration images, and the attempt's label saying which (one log line either way)."""
    edited, freed = float_outputs(blob)
    if not freed:
        return blob, label
    images = [np.asarray(x, np.float32)[None] for _, x in zip(range(CHECK_IMAGES), ctx.representative())]
    apart = steps_apart(blob, edited, freed, images)
    names = ", ".join(f"'{name}'" for name in freed.values())
    prefix = f"[{target.name}] int8 recovery: {label}:"
    if apart > MAX_STEPS:
        ctx.log.warn(f"{prefix} output(s) {names} left int8: the float one(s) differ by {apart:.3g} int8 steps "
                     f"(more than {MAX_STEPS:g}) on {len(images)} calibration images")
        return blob, label
    ctx.log.info(f"{prefix} output(s) {names} kept float, as their producer is (the trailing QUANTIZE dropped; "
                 f"within {apart:.2f} of an int8 step of the int8 output(s) on {len(images)} calibration images)")
    return edited, f"{label}, float output{'s' if len(freed) > 1 else ''}"
