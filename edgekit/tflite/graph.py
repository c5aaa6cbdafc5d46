"""Read a ``.tflite`` file into plain dataclasses: operators, tensors, parameter bytes.

The file is parsed with the flatbuffer schema of the ``tflite`` package (no TensorFlow,
no interpreter), so it works for models an interpreter cannot load: a float model on an
int8-only device, a compiled ``*_edgetpu.tflite`` with its custom op, a model with
dynamic shapes. Only the first subgraph (the one the interpreter runs) is described in
detail; ``subgraph_count`` says whether there are more (control flow, ``WHILE``/``IF``).

>>> graph = read_graph("model.tflite")                     # doctest: +SKIP
>>> [op.opcode for op in graph.operators]                   # doctest: +SKIP
['QUANTIZE', 'CONV_2D', 'MAX_POOL_2D', ...]
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import ModelError, first_line

_FILE_IDENTIFIER = b"TFL3"  # bytes 4..8 of every TFLite flatbuffer

# TensorType enum values -> numpy-style names (schema.fbs order).
_DTYPES = {
    0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "string", 6: "bool",
    7: "int16", 8: "complex64", 9: "int8", 10: "float64", 11: "complex128", 12: "uint64",
    13: "resource", 14: "variant", 15: "uint32", 16: "uint16", 17: "int4", 18: "bfloat16",
}  # fmt: skip
_NUMPY = {"float32", "float16", "int32", "uint8", "int64", "int16", "int8", "float64", "uint64",
          "uint32", "uint16", "bool"}  # fmt: skip


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the main subgraph.

    ``shape_signature`` keeps ``-1`` for dynamic dimensions (``None`` when the file does
    not record one, i.e. the shape is static). ``constant_bytes`` is the size of the
    tensor's constant data (weights, biases, shape operands); 0 for activations.
    """

    index: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...] | None
    quantised: bool
    scale: tuple[float, ...] = ()
    zero_point: tuple[int, ...] = ()
    constant_bytes: int = 0
    is_variable: bool = False

    @property
    def is_constant(self) -> bool:
        """True for a tensor with data in the file (weights, biases, shape operands)."""
        return self.constant_bytes > 0

    @property
    def dynamic(self) -> bool:
        """True when any dimension is unknown until run time."""
        return self.shape_signature is not None and any(d < 0 for d in self.shape_signature)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``edgekit inspect --json``)."""
        return {
            "index": self.index,
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "shape_signature": list(self.shape_signature) if self.shape_signature is not None else None,
            "quantised": self.quantised,
            "constant_bytes": self.constant_bytes,
        }


@dataclass(frozen=True)
class OperatorInfo:
    """One operator, in execution order (``index`` is its position in the subgraph).

    ``opcode`` is the builtin name (``CONV_2D``) or, for custom ops, the custom code
    (``edgetpu-custom-op``, ``TFLite_Detection_PostProcess``) with ``custom`` set.
    ``options`` holds the builtin options as plain values with snake_case keys, e.g.
    ``fused_activation_function: "RELU"``, ``dilation_h_factor: 1``, ``keep_num_dims``.
    """

    index: int
    opcode: str
    custom: bool
    version: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``edgekit inspect --json``)."""
        return {
            "index": self.index,
            "opcode": self.opcode,
            "custom": self.custom,
            "version": self.version,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "options": dict(self.options),
        }


@dataclass(frozen=True)
class Graph:
    """A parsed ``.tflite`` model (main subgraph) plus whole-file facts."""

    path: Path
    file_bytes: int
    schema_version: int
    subgraph_count: int
    tensors: tuple[TensorInfo, ...]
    operators: tuple[OperatorInfo, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    description: str = ""
    _constants: dict = field(default_factory=dict, repr=False, compare=False)

    def tensor(self, index: int) -> TensorInfo | None:
        """The tensor at ``index``; None for the ``-1`` marker of an omitted optional input."""
        return self.tensors[index] if 0 <= index < len(self.tensors) else None

    def constant(self, index: int) -> np.ndarray | None:
        """The value of a constant tensor (a read-only view), or None for activations."""
        tensor = self.tensor(index)
        raw = self._constants.get(index)
        if tensor is None or raw is None or tensor.dtype not in _NUMPY:
            return None
        arr = np.frombuffer(raw, dtype=np.dtype(tensor.dtype).newbyteorder("<"))
        try:
            return arr.reshape(tensor.shape) if tensor.shape else arr.reshape(())
        except ValueError:  # packed/sparse encodings: give the flat data rather than fail
            return arr

    @property
    def parameter_bytes(self) -> int:
        """Bytes of constant data the operators read (weights, biases, shape operands)."""
        used = {i for op in self.operators for i in op.inputs if i >= 0}
        return sum(self.tensors[i].constant_bytes for i in used)

    def op_parameter_bytes(self, op: OperatorInfo) -> int:
        """Constant bytes read by one operator."""
        return sum(t.constant_bytes for t in (self.tensor(i) for i in set(op.inputs)) if t is not None)

    def dtype_label(self, op: OperatorInfo) -> str:
        """The op's activation dtypes: ``"int8"``, or ``"uint8->int8"`` when they change."""

        def kinds(indices: tuple[int, ...]) -> list[str]:
            seen: list[str] = []
            for i in indices:
                t = self.tensor(i)
                if t is not None and not t.is_constant and t.dtype not in seen:
                    seen.append(t.dtype)
            return seen

        ins, outs = kinds(op.inputs), kinds(op.outputs)
        if not ins or ins == outs:
            return ",".join(outs or ins) or "-"
        return f"{','.join(ins)}->{','.join(outs)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``edgekit inspect --json``)."""
        return {
            "path": str(self.path),
            "file_bytes": self.file_bytes,
            "schema_version": self.schema_version,
            "subgraph_count": self.subgraph_count,
            "parameter_bytes": self.parameter_bytes,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "operators": [op.to_dict() for op in self.operators],
            "tensors": [t.to_dict() for t in self.tensors],
        }


def read_graph(path: str | Path) -> Graph:
    """Parse a ``.tflite`` file.

    Raises:
        ModelError: the file is missing, not a TFLite flatbuffer, or corrupt.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model {path} does not exist", "give the path of a .tflite file")
    data = path.read_bytes()
    return parse_graph(data, path)


def parse_graph(data: bytes, path: str | Path = "<bytes>") -> Graph:
    """Parse TFLite flatbuffer bytes (see :func:`read_graph`)."""
    path = Path(path)
    if len(data) < 8 or data[4:8] != _FILE_IDENTIFIER:
        raise ModelError(
            f"{path} is not a TFLite model (no TFL3 identifier)",
            "give a .tflite file written by the TFLite converter",
        )
    try:
        import tflite
    except ImportError as exc:
        raise ModelError("reading .tflite graphs needs the 'tflite' package", "pip install tflite") from exc
    try:
        return _parse(tflite, data, path)
    except ModelError:
        raise
    except Exception as exc:  # flatbuffers raises struct.error/IndexError/... on corrupt offsets
        raise ModelError(
            first_line(f"{path} is corrupt or truncated: {type(exc).__name__}: {exc}", None),
            "re-export the model; check the copy is complete",
        ) from exc


def _parse(tflite: Any, data: bytes, path: Path) -> Graph:
    buf = bytearray(data)  # flatbuffers accessors index into a mutable buffer
    model = tflite.Model.GetRootAs(buf, 0)
    if model.SubgraphsLength() < 1:
        raise ModelError(f"{path} has no subgraph", "re-export the model")
    sub = model.Subgraphs(0)
    opcodes = [_opcode(tflite, model.OperatorCodes(i)) for i in range(model.OperatorCodesLength())]

    tensors: list[TensorInfo] = []
    constants: dict[int, bytes] = {}
    for i in range(sub.TensorsLength()):
        t = sub.Tensors(i)
        raw = _buffer_data(model, t.Buffer(), data)
        if raw:
            constants[i] = raw
        tensors.append(_tensor(t, i, len(raw) if raw else 0))

    operators = []
    for i in range(sub.OperatorsLength()):
        op = sub.Operators(i)
        idx = op.OpcodeIndex()
        if idx >= len(opcodes):
            raise ModelError(f"{path}: operator {i} names opcode {idx}, the file has {len(opcodes)}")
        name, custom, version = opcodes[idx]
        operators.append(
            OperatorInfo(
                index=i,
                opcode=name,
                custom=custom,
                version=version,
                inputs=_ints(op.InputsAsNumpy()),
                outputs=_ints(op.OutputsAsNumpy()),
                options=_options(tflite, op),
            )
        )
    _check_indices(path, len(tensors), operators, sub)
    description = model.Description()
    return Graph(
        path=path,
        file_bytes=len(data),
        schema_version=int(model.Version()),
        subgraph_count=int(model.SubgraphsLength()),
        tensors=tuple(tensors),
        operators=tuple(operators),
        inputs=_ints(sub.InputsAsNumpy()),
        outputs=_ints(sub.OutputsAsNumpy()),
        description=description.decode("utf-8", "replace") if description else "",
        _constants=constants,
    )


def _check_indices(path: Path, count: int, operators: list[OperatorInfo], sub: Any) -> None:
    """Every tensor index an op or the graph names exists (-1: an omitted optional input)."""
    fix = "re-export the model; check the copy is complete"
    for op in operators:
        for i in (*op.inputs, *op.outputs):
            if i < -1 or i >= count:
                raise ModelError(f"{path}: operator {op.index} ({op.opcode}) names tensor {i}, "
                                 f"the file has {count}", fix)
    for kind, indices in (("input", _ints(sub.InputsAsNumpy())), ("output", _ints(sub.OutputsAsNumpy()))):
        for i in indices:
            if not 0 <= i < count:
                raise ModelError(f"{path}: the graph's {kind} names tensor {i}, the file has {count}", fix)


def _ints(arr: Any) -> tuple[int, ...]:
    # The generated accessors return 0 (not an empty array) for an absent vector.
    return tuple(int(v) for v in arr) if isinstance(arr, np.ndarray) else ()


def _opcode(tflite: Any, code: Any) -> tuple[str, bool, int]:
    # Schema 3a moved builtin codes > 127 to a new int32 field; old files only fill the
    # deprecated int8 one. The larger of the two is the real code.
    builtin = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
    version = int(code.Version())
    if builtin == tflite.BuiltinOperator.CUSTOM:
        custom = code.CustomCode()
        return (custom.decode("utf-8", "replace") if custom else "CUSTOM"), True, version
    try:
        return tflite.opcode2name(builtin), False, version
    except ValueError:
        return f"BUILTIN_{builtin}", False, version


def _buffer_data(model: Any, index: int, data: bytes) -> bytes:
    if index <= 0 or index >= model.BuffersLength():
        return b""  # buffer 0 is the schema's empty sentinel
    b = model.Buffers(index)
    # Models over 2 GB keep buffers outside the flatbuffer: offset/size into the file.
    offset, size = int(b.Offset()), int(b.Size())
    if offset > 1 and size:
        return bytes(data[offset : offset + size])
    arr = b.DataAsNumpy()
    return arr.tobytes() if isinstance(arr, np.ndarray) else b""


def _tensor(t: Any, index: int, constant_bytes: int) -> TensorInfo:
    q = t.Quantization()
    scale: tuple[float, ...] = ()
    zero: tuple[int, ...] = ()
    if q is not None:
        s = q.ScaleAsNumpy()
        z = q.ZeroPointAsNumpy()
        scale = tuple(float(v) for v in s) if isinstance(s, np.ndarray) else ()
        zero = tuple(int(v) for v in z) if isinstance(z, np.ndarray) else ()
    signature = _ints(t.ShapeSignatureAsNumpy()) if not t.ShapeSignatureIsNone() else None
    name = t.Name()
    return TensorInfo(
        index=index,
        name=name.decode("utf-8", "replace") if name else "",
        dtype=_DTYPES.get(int(t.Type()), f"type{int(t.Type())}"),
        shape=_ints(t.ShapeAsNumpy()),
        shape_signature=signature,
        quantised=bool(scale),
        scale=scale,
        zero_point=zero,
        constant_bytes=constant_bytes,
        is_variable=bool(t.IsVariable()),
    )


_OPTION_CLASSES: dict[int, str] = {}
_SKIP_SUFFIXES = ("Length", "IsNone")
_ENUMS = {"FusedActivationFunction": "ActivationFunctionType", "Padding": "Padding",
          "WeightsFormat": "FullyConnectedOptionsWeightsFormat"}  # fmt: skip


def _options(tflite: Any, op: Any) -> dict[str, Any]:
    """Builtin options as a plain dict, read generically from the generated accessors.

    Every zero-argument accessor of the options table is called (scalars and
    ``...AsNumpy`` vectors); enum fields the rules need are turned into names.
    """
    kind = int(op.BuiltinOptionsType())
    table = op.BuiltinOptions()
    if kind == 0 or table is None:
        return {}
    if not _OPTION_CLASSES:
        enum = tflite.BuiltinOptions
        _OPTION_CLASSES.update({v: k for k, v in vars(enum).items() if isinstance(v, int)})
    cls_name = _OPTION_CLASSES.get(kind)
    cls = getattr(tflite, cls_name, None) if cls_name else None
    if cls is None:
        return {"options_type": cls_name or kind}
    obj = cls()
    obj.Init(table.Bytes, table.Pos)
    out: dict[str, Any] = {}
    for name, fn in inspect.getmembers(obj, predicate=inspect.ismethod):
        if not name[:1].isupper() or name in ("Init",) or name.startswith("GetRootAs"):
            continue
        if name.endswith(_SKIP_SUFFIXES) or len(inspect.signature(fn).parameters) != 0:
            continue
        value = fn()
        key = name[: -len("AsNumpy")] if name.endswith("AsNumpy") else name
        if isinstance(value, np.ndarray):
            value = value.tolist()
        elif name.endswith("AsNumpy"):
            value = []  # absent vector
        elif isinstance(value, (bytes, bytearray)):
            value = value.decode("utf-8", "replace")
        elif not isinstance(value, (int, float, bool, str)):
            continue  # nested tables: no rule needs them
        if key in _ENUMS and isinstance(value, int):
            value = _enum_name(getattr(tflite, _ENUMS[key], None), value)
        out[_snake(key)] = value
    return out


def _enum_name(enum: Any, value: int) -> Any:
    if enum is None:
        return value
    for k, v in vars(enum).items():
        if v == value and not k.startswith("_"):
            return k
    return value


def _snake(name: str) -> str:
    # DilationHFactor -> dilation_h_factor, FusedActivationFunction -> fused_activation_function
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
