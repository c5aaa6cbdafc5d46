"""An ONNX model as a build source: checked, its input made static, its node names made safe.

Third-party exports (PyTorch, Ultralytics, PaddlePaddle) usually take NCHW images with a
symbolic batch and often symbolic height/width. edgekit builds for one static shape: a
symbolic batch becomes 1; a symbolic height/width needs ``--input-size HxW`` and is refused
without it, naming the input and its shape. Node names are rewritten to what TensorFlow
accepts as scope names (onnx2tf turns them into scopes; an ``@`` in a PaddlePaddle export
breaks TF 2.21). The prepared model is kept in memory (``SourceModel.onnx``) and is what
ONNX Runtime runs for the reference outputs, what onnx2tf converts and what the Jetson gets.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from edgekit.builders.sources.model import SourceModel, make_outputs
from edgekit.errors import ModelError, first_line

#: ``precheck((h, w, c), activation_bytes)``: called by a loader before the model first runs
Precheck = Callable[[tuple[int, int, int], "int | None"], None]
INPUT_SIZE_HINT = "give the image size with --input-size HxW (e.g. --input-size 224x224)"


def shape_text(dims: list) -> str:
    """``[?,3,?,?]``-style text of an input shape (symbolic dimensions as ``?``)."""
    return "[" + ",".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in dims) + "]"


def image_layout(dims: list) -> str | None:
    """NCHW or NHWC for a 4-D image input (dims may be symbolic), None when it is neither.

    A static 1 or 3 in position 1 with no such channel count last means NCHW (a PyTorch
    export); a 1 or 3 last means NHWC.
    """
    def channels(d) -> bool:
        return isinstance(d, int) and d in (1, 3)

    if len(dims) != 4:
        return None
    if channels(dims[1]) and not channels(dims[3]):
        return "NCHW"
    if channels(dims[3]):
        return "NHWC"
    return None


def static_dims(name: str, dims: list, input_size: tuple[int, int] | None) -> tuple[list[int], str]:
    """The input's static (N, ., ., .) dims and layout: batch -> 1, H/W from the model or ``input_size``.

    Raises ModelError naming the input and its shape when H/W are symbolic and no size was given.
    """
    layout = image_layout(dims)
    if layout is None:
        raise ModelError(f"input '{name}' has shape {shape_text(dims)}: not an NCHW or NHWC image batch "
                         "with 1 or 3 channels", "export the model with a 1- or 3-channel image input")
    hw_pos = (2, 3) if layout == "NCHW" else (1, 2)
    hw = [dims[i] for i in hw_pos]
    symbolic = [not (isinstance(d, int) and d > 0) for d in hw]
    if any(symbolic) and input_size is None:
        raise ModelError(f"input '{name}' has shape {shape_text(dims)}: its height/width are not fixed",
                         INPUT_SIZE_HINT)
    if input_size is not None and not any(symbolic) and tuple(hw) != tuple(input_size):
        raise ModelError(f"--input-size {input_size[0]}x{input_size[1]} does not fit input '{name}', "
                         f"fixed at {hw[0]}x{hw[1]}", "leave out --input-size for this model")
    out = [1] + [int(d) if isinstance(d, int) and d > 0 else 0 for d in dims[1:]]
    if any(symbolic):
        out[hw_pos[0]], out[hw_pos[1]] = int(input_size[0]), int(input_size[1])
    return out, layout


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in value_info.type.tensor_type.shape.dim]


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _check_float_input(node) -> None:
    """edgekit feeds a float model float32 pixels ((value - mean) / std): refuse another input type."""
    from onnx import TensorProto

    elem = node.type.tensor_type.elem_type
    if elem != TensorProto.FLOAT:
        kind = TensorProto.DataType.Name(elem).lower() if elem in TensorProto.DataType.values() else str(elem)
        raise ModelError(f"input '{node.name}' is {kind}; edgekit feeds an ONNX model float32 images "
                         "(scaled with --mean/--std)",
                         "export the model with a float32 input (before .half(); for a uint8 input, without its "
                         "Cast, then build with --mean 0 --std 1)")


def prepare(model, input_size: tuple[int, int] | None):
    """Fix the input's shape and sanitise node names in place; returns (input name, dims, static dims, layout)."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise ModelError(f"the model has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                         "edgekit builds single-image models", "export the model with one image input")
    if model.ir_version >= 4:
        # torch.onnx.export(keep_initializers_as_inputs=True) lists every weight as an optional
        # input too; nothing feeds them, and the FP16 converter turns the weights to float16 but not
        # those inputs, which ONNX Runtime then refuses ("has element type tensor(float16)")
        for graph_input in [i for i in model.graph.input if i.name in initializers]:
            model.graph.input.remove(graph_input)
    node = inputs[0]
    _check_float_input(node)
    dims = _dims(node)
    static, layout = static_dims(node.name, dims, input_size)
    for d, value in zip(node.type.tensor_type.shape.dim, static):
        d.Clear()
        d.dim_value = value
    for i, n in enumerate(model.graph.node):
        # TensorFlow scope names allow [A-Za-z0-9_.\-/] only (onnx2tf turns node names into scopes)
        clean = re.sub(r"[^A-Za-z0-9_.\-/]", "_", n.name) or f"node_{i}"
        n.name = clean if re.match(r"[A-Za-z0-9.]", clean) else f"n{clean}"
    return node.name, dims, static, layout


def _check_external_data(path: Path) -> None:
    """A model whose weights live in another file (``model.onnx.data``: torch.onnx.export for a
    model over 2 GB, or ``external_data=True``) that is missing: say which file to copy."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not even the graph parses: the caller's message stands
        return
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if location and not (path.parent / location).is_file():
            raise ModelError(f"{path.name} keeps its weights in a separate file, {location}, which is not beside it",
                             f"copy {location} into {path.parent} with the model (both files are the model)")


def load_onnx(path: Path, input_size: tuple[int, int] | None = None, precheck: Precheck | None = None) -> SourceModel:
    """Load, check and prepare an ONNX model; its reference runs in ONNX Runtime (CPU).

    ``precheck`` (the build's memory check) sees the static input and the graph's widest step
    before ONNX Runtime runs the model once on zeros (a 16384x16384 input was OOM-killed there).
    """
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelError("ONNX input needs onnx and onnxruntime", "pip install 'edgekit-vision[build]'") from exc
    try:
        onnx.checker.check_model(str(path))
        model = onnx.load(str(path))
    except Exception as exc:
        _check_external_data(path)
        raise ModelError(f"{path} is not a valid ONNX model: {first_line(exc, 200)}",
                         "export the model again (torch.onnx.export, tf2onnx); a copy may be truncated") from exc
    try:
        name, dims, static, layout = prepare(model, input_size)
    except ModelError as exc:
        raise ModelError(f"{path.name}: {exc.message}", exc.hint) from exc
    hwc = (static[2], static[3], static[1]) if layout == "NCHW" else (static[1], static[2], static[3])
    if precheck is not None:
        from edgekit.builders.host.memory import onnx_activation_bytes

        precheck(hwc, onnx_activation_bytes(model))
    blob = model.SerializeToString()
    try:
        sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    except Exception as exc:  # unknown ops and bad graphs: ONNX Runtime names the node
        raise ModelError(f"ONNX Runtime cannot run {path.name}: {first_line(exc)}",
                         _run_hint(dims, None)) from exc
    outs = sess.get_outputs()
    try:  # the declared output shapes may be symbolic: one run on zeros gives the real ones
        import numpy as np

        shapes = [r.shape for r in sess.run(None, {name: np.zeros(static, np.float32)})]
    except Exception as exc:
        raise ModelError(f"ONNX Runtime cannot run {path.name} at input {shape_text(static)}: "
                         f"{first_line(exc, 200)}", _run_hint(dims, input_size)) from exc
    for out, shape in zip(outs, shapes):
        if not shape or shape[0] != 1:  # edgekit stacks outputs image by image along the first dimension
            raise ModelError(f"{path.name}: output '{out.name}' has shape {list(shape)} for one image: it has no "
                             "batch dimension (a constant such as anchors, or a count)",
                             "export the model without that output, or give it a leading batch dimension")
    return SourceModel(path, "onnx", hwc, sess, input_name=name, static_batch=True, layout=layout,
                       outputs=make_outputs([o.name for o in outs], shapes), input_shape=dims, onnx=blob,
                       opset=_opset(model), scales_own_pixels=scales_own_pixels(model, name))


def scales_own_pixels(model, input_name: str) -> str | None:
    """Why the model takes 0-255 pixels, or None: its first op on the image (past Transpose,
    Identity, Cast) divides it by 100 or more, as a Keras Rescaling exported by tf2onnx does
    (the rule of :func:`edgekit.modelinfo.rescale.rescale_reason`, which run and bench apply too)."""
    from onnx import numpy_helper

    from edgekit.modelinfo.rescale import Node, rescale_reason

    arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            arrays[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    consts = {name: float(abs(a).max()) for name, a in arrays.items() if a.size and a.dtype.kind in "fiu"}
    nodes = [Node(n.name, n.op_type.upper(), tuple(n.input), tuple(n.output)) for n in model.graph.node]
    return rescale_reason(nodes, consts, input_name)


def _run_hint(dims: list, input_size: tuple[int, int] | None) -> str:
    """What to change when the model fails at the static shape edgekit gave it."""
    if isinstance(dims[0], int) and dims[0] > 1:
        return (f"edgekit runs one image at a time and the model was exported for batch {dims[0]}: export it "
                "with batch 1 or a dynamic batch (torch.onnx.export(..., dynamic_axes={'input': {0: 'batch'}}))")
    if input_size is not None:
        return "check --input-size: the model may need another image size (a multiple of its stride)"
    return "the model must run in ONNX Runtime at batch 1 (the reference for the accuracy gate)"
