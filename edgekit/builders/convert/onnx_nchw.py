"""An ONNX model's image input made channels-first, for converters that take NCHW only.

RKNN-Toolkit2 refuses an NHWC input (its quantiser reads ``(1, C, H, W)`` tensors), while
edgekit's ONNX of a Keras or TFLite source keeps the channels-last input tf2onnx gives it. The
input is therefore re-declared as ``[N, C, H, W]`` under the same name and a ``Transpose``
(perm 0, 2, 3, 1) hands the graph the NHWC tensor it was built for: the same function, a
different input layout. The toolkit fuses that Transpose into the first convolution (seen on
the demo models: no extra op in its layer table).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import ModelError, first_line

TRANSPOSED = "__nhwc"
"""The suffix of the tensor the inserted Transpose writes (the original input, channels-last)."""


@dataclass(frozen=True)
class OnnxIO:
    """What a converter needs to load an ONNX model with a static input: its input's name and
    NCHW shape, and its output names in the graph's order (the order a runtime returns them)."""

    input: str
    shape: tuple[int, int, int, int]
    outputs: tuple[str, ...]
    transposed: bool


def input_dims(model) -> tuple[str, list[int | str]]:
    """The single graph input's name and dims (a symbolic dim by its name), initializers left out."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise ModelError(f"the ONNX model has {len(inputs)} inputs; this target takes one image input",
                         "export the model with a single image input")
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in inputs[0].type.tensor_type.shape.dim]
    return inputs[0].name, dims


def to_nchw(src: Path, dest: Path, hwc: tuple[int, int, int], layout: str) -> OnnxIO:
    """Write ``src`` to ``dest`` with a static batch-1 NCHW input; what it takes and gives.

    ``hwc`` is the source's image size and channels, ``layout`` its declared layout (``NHWC``
    or ``NCHW``). An NHWC input gets the Transpose of the module docstring; an NCHW one is
    copied with its batch fixed at 1. Anything but a 4-D image input is refused (ModelError).
    """
    import onnx

    model = onnx.load(str(src))
    name, dims = input_dims(model)
    h, w, c = hwc
    if len(dims) != 4:
        raise ModelError(f"the ONNX model's input {name} has shape {dims}: this target takes a 4-D image input",
                         "export the model with a [1, C, H, W] or [1, H, W, C] input")
    rest = list(dims[1:])
    nhwc = rest == [h, w, c] and (rest != [c, h, w] or layout == "NHWC")
    if not nhwc and rest != [c, h, w]:
        raise ModelError(f"the ONNX model's input {name} has shape {dims}, not [1, {c}, {h}, {w}] or "
                         f"[1, {h}, {w}, {c}]", "give the input a static image size (--input-size HxW)")
    shape = (1, c, h, w)
    graph_input = next(i for i in model.graph.input if i.name == name)
    if nhwc:
        _transpose_input(model, name)
    for dim, value in zip(graph_input.type.tensor_type.shape.dim, shape):
        dim.Clear()
        dim.dim_value = value
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"the ONNX model with an NCHW input does not check: {first_line(exc)}",
                         "report it with build.log (--debug)") from exc
    onnx.save(model, str(dest))
    return OnnxIO(name, shape, tuple(o.name for o in model.graph.output), nhwc)


def _transpose_input(model, name: str) -> None:
    """Every node that read ``name`` reads ``name + TRANSPOSED``, a Transpose of the (now NCHW) input."""
    from onnx import helper

    inner = name + TRANSPOSED
    for node in model.graph.node:
        for i, value in enumerate(node.input):
            if value == name:
                node.input[i] = inner
    for output in model.graph.output:  # an input passed straight through: rare, but the graph must stay valid
        if output.name == name:
            raise ModelError(f"the ONNX model's input {name} is also an output", "export the model without it")
    model.graph.node.insert(0, helper.make_node("Transpose", [name], [inner], perm=[0, 2, 3, 1],
                                                name=f"{name}_nchw_to_nhwc"))
