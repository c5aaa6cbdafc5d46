"""Whether a model divides the image by 255 itself: its first op on the image, read from the graph.

A Keras ``Rescaling(1/255)`` exported to ONNX (tf2onnx) or .tflite stays in the graph as a ``Mul``
by 0.00392 (or a ``Div`` by 255) on the input, past any ``Transpose``/``Cast``. Fed edgekit's
default [0, 1] pixels, such a model sees inputs 255 times too small and still answers, wrongly:
``build`` feeds it 0-255 (:func:`edgekit.builders.sources.load.scales_own_pixels` for Keras), and so
must ``run`` and ``bench`` on the bare file. The rule is the build's: a first op (past
pass-through ops, at most 8 steps in) that divides by 100 or more.

Device side: no TensorFlow, no ``onnx`` package. An ONNX file's protobuf is walked field by
field (the graph's large weights are skipped unread); a .tflite is read with
:mod:`edgekit.tflite.graph`. Reading is best effort: anything unexpected leaves the answer None
(the default scaling), never an error. The TFLite converter often folds such a ``Mul`` into the
first convolution's weights; nothing in the graph then says it, and only a record of the
preprocessing (a bundle's ``edgekit.json``, a sidecar, ``--std 1``) can.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

PASS_THROUGH = frozenset({"TRANSPOSE", "IDENTITY", "CAST", "RESHAPE", "QUANTIZE", "DEQUANTIZE"})
MIN_DIVISOR = 100.0  # /255 and /127.5 count; a std of 58 (ImageNet in pixel units) does not
MAX_STEPS = 8
MAX_CONST_BYTES = 4096  # a divisor is one value (or one per channel): bigger tensors are weights
MAX_NODE_BYTES = 1 << 20
MAX_NODES = 200_000


@dataclass(frozen=True)
class Node:
    """One op of a graph in the form the walk reads: upper-case op type, tensor names in and out."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def rescale_reason(nodes: Iterable[Node], consts: dict[str, float], start: str) -> str | None:
    """Why the graph takes 0-255 pixels, or None: its first op on ``start`` (past
    :data:`PASS_THROUGH` ops) multiplies by a constant of at most 1/100 or divides by one of at
    least 100. ``consts``: each small constant tensor's largest absolute value."""
    nodes = list(nodes)
    frontier = {start}
    for _ in range(MAX_STEPS):
        users = [n for n in nodes if frontier.intersection(n.inputs)]
        for node in users:
            divisor = _divisor(node, consts)
            if divisor is not None and divisor >= MIN_DIVISOR:
                return f"its first op '{node.name or node.op}' divides the image by {divisor:.6g}"
        frontier = {o for n in users if n.op in PASS_THROUGH for o in n.outputs}
        if not frontier:
            return None
    return None


def _divisor(node: Node, consts: dict[str, float]) -> float | None:
    """What a MUL or DIV by a constant divides by (1 / the factor of a MUL), else None."""
    if node.op == "MUL":
        factors = [consts[i] for i in node.inputs if i in consts]
        return 1 / factors[0] if factors and factors[0] > 0 else None
    if node.op == "DIV" and len(node.inputs) > 1 and consts.get(node.inputs[1], 0) > 0:
        return consts[node.inputs[1]]
    return None


def in_graph_rescale(path: str | Path) -> str | None:
    """Why the model file at ``path`` (.onnx or .tflite) takes raw 0-255 pixels, or None."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".onnx":
            nodes, consts, start = onnx_graph(path)
        elif suffix == ".tflite":
            nodes, consts, start = tflite_graph(path)
        else:
            return None
    except Exception:  # a damaged or unusual file: the runtime that opens it says what is wrong
        return None
    return rescale_reason(nodes, consts, start) if start else None


# --- TFLite ----------------------------------------------------------------------------------------


def tflite_graph(path: Path) -> tuple[list[Node], dict[str, float], str]:
    """A .tflite's main subgraph as Nodes (named after their first output tensor), its small
    constants (dequantised; a DEQUANTIZE of a float16 constant counts as the constant) and the
    name of its first input."""
    from edgekit.tflite.graph import read_graph

    graph = read_graph(path)
    names = [t.name or f"t{t.index}" for t in graph.tensors]
    consts: dict[str, float] = {}
    for t in graph.tensors:
        if 0 < t.constant_bytes <= MAX_CONST_BYTES:
            value = graph.constant(t.index)
            if value is not None and value.size:
                value = value.astype(np.float64)
                if t.quantised and t.scale:  # one scale per tensor or per channel: the largest
                    value = (value - (t.zero_point[0] if t.zero_point else 0)) * max(t.scale)
                consts[names[t.index]] = float(np.max(np.abs(value)))
    nodes = []
    for op in graph.operators:
        ins = tuple(names[i] for i in op.inputs if 0 <= i < len(names))
        outs = tuple(names[i] for i in op.outputs if 0 <= i < len(names))
        if op.opcode == "DEQUANTIZE" and ins and ins[0] in consts:  # fp16 weights read as float32
            consts.update({o: consts[ins[0]] for o in outs})
            continue
        nodes.append(Node(outs[0] if outs else op.opcode, op.opcode.upper(), ins, outs))
    start = names[graph.inputs[0]] if graph.inputs else ""
    return nodes, consts, start


# --- ONNX: a protobuf walk (onnx.proto field numbers), no onnx package ----------------------------

_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT = 1, 5, 11
_ONNX_DTYPES = {1: "<f4", 2: "u1", 3: "i1", 5: "<i2", 6: "<i4", 7: "<i8", 10: "<f2", 11: "<f8"}


def onnx_graph(path: Path) -> tuple[list[Node], dict[str, float], str]:
    """An ONNX file's nodes, small constants (initializers and Constant nodes) and the name of
    its first input that is not an initializer, read without the onnx package."""
    from edgekit.modelinfo.embedded import protobuf_fields

    nodes: list[Node] = []
    consts: dict[str, float] = {}
    inputs: list[str] = []
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        for number, length in protobuf_fields(f, size):
            if number == _MODEL_GRAPH and length is not None:
                _read_graph(f, f.tell() + length, nodes, consts, inputs)
                break
            if length is not None:
                f.seek(length, 1)
    start = next((name for name in inputs if name not in consts), "")
    return nodes, consts, start


def _read_graph(f: BinaryIO, end: int, nodes: list[Node], consts: dict[str, float], inputs: list[str]) -> None:
    """GraphProto's nodes, small initializers and input names, the large initializers skipped."""
    from edgekit.modelinfo.embedded import protobuf_fields

    for number, length in protobuf_fields(f, end):
        if length is None:
            continue
        small = length <= (MAX_CONST_BYTES + 256 if number == _GRAPH_INITIALIZER else MAX_NODE_BYTES)
        if number in (_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT) and small and len(nodes) < MAX_NODES:
            fields = _message(f.read(length))
            if number == _GRAPH_NODE:
                _add_node(fields, nodes, consts)
            elif number == _GRAPH_INITIALIZER:
                _add_tensor(fields, consts)
            else:
                inputs.append(_text(fields, 1))
        else:
            f.seek(length, 1)


def _add_node(fields: dict[int, list], nodes: list[Node], consts: dict[str, float]) -> None:
    """NodeProto: input 1, output 2, name 3, op_type 4, attribute 5; a Constant's value is a constant."""
    outs = tuple(v.decode("utf-8", "replace") for v in fields.get(2, []))
    op = _text(fields, 4)
    if op == "Constant" and outs:
        for attr in fields.get(5, []):
            a = _message(attr)
            if _text(a, 1) == "value" and a.get(5):
                _add_tensor(_message(a[5][0]), consts, outs[0])
        return
    ins = tuple(v.decode("utf-8", "replace") for v in fields.get(1, []))
    nodes.append(Node(_text(fields, 3), op.upper(), ins, outs))


def _add_tensor(fields: dict[int, list], consts: dict[str, float], name: str | None = None) -> None:
    """TensorProto: data_type 2, float_data 4, name 8, raw_data 9 -> the largest absolute value."""
    dtype = _ONNX_DTYPES.get(fields.get(2, [0])[0])
    if fields.get(9) and dtype:
        value = np.frombuffer(fields[9][0], dtype=np.dtype(dtype))
    elif fields.get(4):
        value = np.concatenate([np.frombuffer(v if isinstance(v, bytes) else v.to_bytes(4, "little"), "<f4")
                                for v in fields[4]])
    else:
        return
    if value.size:
        consts[name or _text(fields, 8)] = float(np.max(np.abs(value.astype(np.float64))))


def _message(data: bytes) -> dict[int, list]:
    """Every field of one small protobuf message: bytes for length-delimited ones, ints for the rest."""
    from edgekit.modelinfo.embedded import MalformedProtobuf, read_varint

    f, out = io.BytesIO(data), {}
    while f.tell() < len(data):
        tag = read_varint(f)
        if tag is None:
            break
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            length = read_varint(f) or 0
            value: bytes | int | None = f.read(length)
        elif wire == 0:
            value = read_varint(f)
        elif wire in (1, 5):
            value = int.from_bytes(f.read(8 if wire == 1 else 4), "little")
        else:
            raise MalformedProtobuf(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _text(fields: dict[int, list], number: int) -> str:
    value = fields.get(number, [b""])[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""
