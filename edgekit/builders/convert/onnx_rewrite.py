"""Rewrites of the ONNX copy handed to onnx2tf, for graphs TFLite could not take as exported.

PyTorch exports ``nn.GELU`` (the exact, erf form; timm, torchvision ViT/ConvNeXt/Swin) below
opset 20 as ``Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5``. TFLite has no Erf
("tf.Erf is neither a custom op nor a flex op"), and onnx2tf fuses the chain only when its
divisor arrives as a TensorFlow tensor (onnx2tf ``ops/Div.py``, PINTO0309/onnx2tf#465), never
for initializers. Each such chain becomes one ``com.microsoft.Gelu`` node (the same function,
ONNX Runtime's contrib op): onnx2tf converts it by op type to ``tf.nn.gelu``, TFLite's GELU
builtin, which has int8 kernels. Only this copy changes: ONNX Runtime's reference and the
Jetson bundle keep the model as exported.

One-element constant operands of Add/Sub/Mul/Div (PaddlePaddle's ``[1]`` scales and biases) are
given as 0-D (:func:`scalar_operands`): onnx2tf ran the ops after each such Add in NCHW between
layout TRANSPOSEs, which cut the Edge TPU graph.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

GELU_DOMAIN = "com.microsoft"


def _constants(graph: Any) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs with a single value, by tensor name."""
    from onnx import numpy_helper

    found = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return {k: v for k, v in found.items() if v.size == 1 and np.issubdtype(v.dtype, np.floating)}


def _is(consts: dict, name: str, value: float) -> bool:
    return name in consts and math.isclose(float(consts[name].reshape(())), value, rel_tol=1e-5)


def _other(node: Any, name: str) -> str | None:
    """The other input of a two-input node that takes ``name``."""
    if len(node.input) == 2 and name in node.input:
        return node.input[1] if node.input[0] == name else node.input[0]
    return None


def _gelu_chain(div: Any, consumers: dict, consts: dict) -> tuple[str, list, str] | None:
    """(x, the chain's nodes, its output) when ``div`` starts an erf-GELU chain, else None."""
    if len(div.input) != 2:
        return None
    divisor = {"Div": math.sqrt(2), "Mul": math.sqrt(0.5)}[div.op_type]  # x / sqrt 2 or x * (1 / sqrt 2)
    if _is(consts, div.input[1], divisor):
        x = div.input[0]
    elif div.op_type == "Mul" and _is(consts, div.input[0], math.sqrt(0.5)):
        x = div.input[1]
    else:
        return None

    def only(name: str, op: str) -> Any:
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op else None

    erf = only(div.output[0], "Erf")
    add = erf and only(erf.output[0], "Add")
    if not add or not _is(consts, _other(add, erf.output[0]) or "", 1.0):
        return None
    mul = only(add.output[0], "Mul")
    if mul is None:
        return None
    y = _other(mul, add.output[0])
    if y == x:  # x * (1 + erf) * 0.5: PyTorch's order
        half = only(mul.output[0], "Mul")
        if half is None or not _is(consts, _other(half, mul.output[0]) or "", 0.5):
            return None
        return x, [div, erf, add, mul, half], half.output[0]
    pre = next((n for n in consumers.get(x, []) if n.op_type == "Mul" and n.output[0] == y), None)
    if pre is not None and _is(consts, _other(pre, x) or "", 0.5) and len(consumers.get(y, [])) == 1:
        return x, [pre, div, erf, add, mul], mul.output[0]  # (0.5 * x) * (1 + erf): tf2onnx's order
    return None


def fuse_gelu(model: Any) -> int:
    """Replace every erf-GELU chain of ``model`` (a ModelProto, in place) by one Gelu node; returns how many."""
    from onnx import helper

    graph = model.graph
    consts = _constants(graph)
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    chains = []
    for node in graph.node:
        if node.op_type in ("Div", "Mul"):
            chain = _gelu_chain(node, consumers, consts)
            # a chain whose inner tensors are also graph outputs must stay as it is
            if chain and not any(o in outputs for n in chain[1][:-1] for o in n.output if o != chain[2]):
                chains.append(chain)
    if not chains:
        return 0
    drop = {id(n) for _, nodes, _ in chains for n in nodes}
    first = {id(nodes[0]): (x, out, i) for i, (x, nodes, out) in enumerate(chains)}
    kept = []
    for node in graph.node:
        if id(node) in first:
            x, out, i = first[id(node)]
            kept.append(helper.make_node("Gelu", [x], [out], name=f"edgekit_gelu_{i}", domain=GELU_DOMAIN))
        elif id(node) not in drop:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    if not any(o.domain == GELU_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(GELU_DOMAIN, 1))
    return len(chains)


_NON_NEGATIVE = {"Relu", "Sigmoid", "HardSigmoid", "Softmax", "Abs", "Exp", "Sqrt"}
_KEEPS_SIGN = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Identity", "Reshape", "Flatten",
               "Transpose", "Resize", "Concat"}


def _non_negative(name: str, producers: dict, consts: dict, depth: int = 8) -> bool:
    """Whether tensor ``name`` can never be negative (a Relu's output, and what only pools or moves it)."""
    node = producers.get(name)
    if node is None or depth == 0:
        return False
    if node.op_type in _NON_NEGATIVE:
        return True
    if node.op_type == "Clip":  # ReLU6: Clip(x, 0, 6)
        return len(node.input) > 1 and node.input[1] in consts and float(np.min(consts[node.input[1]])) >= 0
    if node.op_type in _KEEPS_SIGN:
        data = [i for i in node.input[: None if node.op_type == "Concat" else 1] if i]
        return bool(data) and all(_non_negative(i, producers, consts, depth - 1) for i in data)
    return False


def _ceil_extra(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int) -> int:
    """End padding that makes a floor-mode pool give ceil_mode's output size (PyTorch's rule: the
    last window starts inside the input or its begin padding)."""
    span = (kernel - 1) * dilation + 1
    out = -(-(size + begin + end - span) // stride) + 1
    if (out - 1) * stride >= size + begin:
        out -= 1
    return max(0, (out - 1) * stride + span - (size + begin + end))


def same_padded(kernel: list[int], strides: list[int], dilations: list[int], pads: list[int],
                sizes: list[int], ceil_mode: bool = False) -> bool:
    """Whether a pool's explicit ``pads`` are exactly TensorFlow's ``SAME`` padding for ``sizes``.

    ONNX's MaxPool leaves padded cells out of the maximum, as TF's ``SAME`` pooling does, so
    such a pool is one ``MAX_POOL_2D`` with ``padding=SAME``: onnx2tf makes that itself when the
    pads agree (``ops/MaxPool.py``), no PAD/PADV2 in front (the Edge TPU report counted them
    among YOLOv8's worst int8 layers: SPPF's three k5 s1 p2 pools)."""
    if ceil_mode or not any(pads) or any(d != 1 for d in dilations) or not all(sizes):
        return False
    begin, end = [], []
    for size, k, s in zip(sizes, kernel, strides, strict=True):
        total = max((-(-size // s) - 1) * s + k - size, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    return list(pads) == begin + end


def pad_maxpools(model: Any, floors: dict[str, float] | None = None) -> int:
    """Give padded (or ceil_mode) MaxPools an explicit finite Pad; returns how many.

    onnx2tf pads a MaxPool with float32's lowest value (-3.4e38; onnx2tf ``ops/MaxPool.py``,
    PINTO0309/onnx2tf#444): int8 calibration then sees that value, and the int8 model of a
    torchvision ResNet stem (Conv, ReLU, MaxPool pads 1) agreed with the original on 0 % of
    images. After a ReLU every value is >= 0, so padding with 0 gives the same maxima; another
    input is padded with ``floors[name]`` (twice the lowest value seen on the calibration
    images, :func:`maxpool_floors`), below what int8 can represent of it anyway. A pool whose
    pads are TF's ``SAME`` (:func:`same_padded`) is left to onnx2tf, which makes it a SAME pool
    with no pad value at all.
    """
    from onnx import helper, numpy_helper, shape_inference

    graph = model.graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in shape_inference.infer_shapes(model).graph.value_info}
    shapes.update({v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input})
    consts = {**{i.name: numpy_helper.to_array(i) for i in graph.initializer}, **_constants(graph)}
    producers = {o: n for n in graph.node for o in n.output}
    done = 0
    for node in list(graph.node):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "MaxPool" or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        shape = shapes.get(node.input[0], [])
        kernel = list(attrs.get("kernel_shape", []))
        rank = len(kernel)
        pads = list(attrs.get("pads", [0] * 2 * rank))
        if (not any(pads) and not attrs.get("ceil_mode")) or len(shape) != rank + 2 or not all(shape[2:]):
            continue
        strides = list(attrs.get("strides", [1] * rank))
        dilations = list(attrs.get("dilations", [1] * rank))
        if same_padded(kernel, strides, dilations, pads, shape[2:], bool(attrs.get("ceil_mode"))):
            continue
        value = 0.0 if _non_negative(node.input[0], producers, consts) else (floors or {}).get(node.input[0])
        if value is None:
            continue
        if attrs.get("ceil_mode"):
            pads[rank:] = [e + _ceil_extra(shape[2 + i], kernel[i], strides[i], dilations[i], pads[i], e)
                           for i, e in enumerate(pads[rank:])]
        padded = f"{node.input[0]}_edgekit_pad{done}"
        pad_name = f"{padded}_pads"
        graph.initializer.append(numpy_helper.from_array(np.array([0, 0, *pads[:rank], 0, 0, *pads[rank:]],
                                                                  np.int64), pad_name))
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), f"{padded}_value"))
        graph.node.insert(list(graph.node).index(node), helper.make_node(
            "Pad", [node.input[0], pad_name, f"{padded}_value"], [padded], name=f"edgekit_pad_{done}"))
        node.input[0] = padded
        for a in node.attribute:
            if a.name == "pads":
                a.ints[:] = [0] * 2 * rank
            elif a.name == "ceil_mode":
                a.i = 0
        done += 1
    return done


def same_maxpools(model: Any) -> int:
    """How many padded MaxPools of ``model`` have TF ``SAME`` pads (:func:`same_padded`): left to
    onnx2tf, which makes each one ``MAX_POOL_2D`` with ``padding=SAME``."""
    from onnx import helper, shape_inference

    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*shape_inference.infer_shapes(model).graph.value_info, *model.graph.input]}
    found = 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        kernel = list(attrs.get("kernel_shape", []))
        shape, rank = shapes.get(node.input[0] if node.input else "", []), len(kernel)
        if node.op_type == "MaxPool" and len(shape) == rank + 2 and same_padded(
                kernel, list(attrs.get("strides", [1] * rank)), list(attrs.get("dilations", [1] * rank)),
                list(attrs.get("pads", [0] * 2 * rank)), shape[2:], bool(attrs.get("ceil_mode"))):
            found += 1
    return found


def maxpool_floors(blob: bytes, input_name: str, samples: np.ndarray) -> dict[str, float]:
    """For each padded MaxPool whose input may be negative: twice the lowest value that input
    takes on ``samples`` (batch first, in the model's layout), run in ONNX Runtime; {} when none."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(blob)
    consts = {**{i.name: numpy_helper.to_array(i) for i in model.graph.initializer}, **_constants(model.graph)}
    producers = {o: n for n in model.graph.node for o in n.output}
    wanted = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MaxPool" and (any(attrs.get("pads", [])) or attrs.get("ceil_mode")) \
                and not _non_negative(node.input[0], producers, consts) and node.input[0] not in wanted:
            wanted.append(node.input[0])
    if not wanted or not len(samples):
        return {}
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                              for n in wanted if n not in outputs)
    try:  # best effort: without floors those MaxPools keep onnx2tf's padding
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        lows = np.full(len(wanted), np.inf)
        for x in samples:
            lows = np.minimum(lows, [float(np.min(t)) for t in session.run(wanted, {input_name: x[None]})])
    except Exception:
        return {}
    return {n: min(0.0, 2 * float(low)) for n, low in zip(wanted, lows) if np.isfinite(low)}


_BROADCASTING = ("Add", "Sub", "Mul", "Div")


def scalar_operands(model: Any) -> int:
    """Give every one-element constant operand of an Add/Sub/Mul/Div as a 0-D initializer (in
    place); returns how many operands changed.

    onnx2tf (1.29) broadcasts a ``[1]`` constant to the rank of the other operand (``[1, 1, 1, 1]``)
    and its ``Add`` then finds its NHWC result unlike the ONNX (NCHW) output shape and "rescues" it
    by transposing both operands to NCHW; the ops after it follow in NCHW between TRANSPOSEs, and a
    depthwise Conv after one comes out as a grouped CONV_2D. PaddlePaddle exports write every
    learnable scale and bias so: PP-OCRv4's text detector got 53 TRANSPOSEs (the Edge TPU graph cut
    at op 4 of 299) and failed onnx2tf's strict mode. A 0-D operand converts as a scalar. The same
    values: a one-element operand broadcasts to the other operand's shape either way; a node whose
    other operand's rank is not known to be at least the constant's keeps its operand.
    """
    from onnx import numpy_helper

    graph, consts, ranks = model.graph, _constants(model.graph), _ranks(model)
    made: dict[str, str] = {}
    names = {n for node in graph.node for n in (*node.input, *node.output)} | {i.name for i in graph.initializer}
    changed = 0
    for node in graph.node:
        if node.op_type not in _BROADCASTING or len(node.input) != 2:
            continue
        for i, name in enumerate(list(node.input)):
            value, other = consts.get(name), node.input[1 - i]
            if value is None or value.ndim == 0 or other in consts or ranks.get(other, -1) < value.ndim:
                continue
            if name not in made:
                made[name] = next(f"{name}_scalar{k or ''}" for k in range(len(names) + 1)
                                  if f"{name}_scalar{k or ''}" not in names)
                graph.initializer.append(numpy_helper.from_array(value.reshape(()), made[name]))
            node.input[i] = made[name]
            changed += 1
    return changed


def _ranks(model: Any) -> dict[str, int]:
    """The rank of each tensor of ``model`` that shape inference, an input or a constant gives."""
    from onnx import shape_inference

    try:
        graph = shape_inference.infer_shapes(model).graph
    except Exception:  # a model shape inference cannot take: only the declared tensors
        graph = model.graph
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in (*graph.input, *graph.output, *graph.value_info)
             if v.type.tensor_type.HasField("shape")}
    ranks.update({i.name: len(i.dims) for i in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            ranks[node.output[0]] = len(node.attribute[0].t.dims)
    return ranks
