"""Variants of a float ``.tflite`` source made on its own graph, with no detour through ONNX.

A model that ships as a float TFLite file (MediaPipe, TF Hub, Model Maker) is converted where it
stands: ``fp32`` is the graph with float32 weights, ``fp16`` the same graph with float16 weights
(each read through a ``DEQUANTIZE``, as TensorFlow's converter writes them), and ``int8`` is
calibrated and quantised by TensorFlow's own post-training quantiser, the very steps
``TFLiteConverter`` runs after converting a SavedModel (``Calibrator`` then ``mlir_quantize``:
:mod:`edgekit.builders.int8.quantize`).
The int8 graph therefore holds exactly the ops a Keras build of the same network holds: no
TRANSPOSE is added, which would cut the Edge TPU graph.

Published float models often carry float16 weights already (every MediaPipe model does: 74
``DEQUANTIZE`` ops in BlazeFace); TensorFlow's quantiser refuses those ("scale out of expressed
type range"), so weights go back to float32 first (:func:`float32_weights`).

Edits use TensorFlow's flatbuffer object API (``tensorflow.lite.tools.flatbuffer_utils``); this
module is build-side only and imports TensorFlow inside its functions.
"""

from __future__ import annotations

import numpy as np

from edgekit.errors import ModelError

FLOAT32, FLOAT16 = 0, 1  # tflite::TensorType
DEQUANTIZE, DENSIFY = 6, 124  # tflite::BuiltinOperator
FP16_MAX = 65504.0
MIN_FP16_ELEMENTS = 2
"""Smaller float constants (a scalar added or multiplied) stay float32, as TensorFlow leaves them."""


def load_schema():
    from edgekit.builders.tf import import_tf

    import_tf()  # TF's C++ log level set first
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    return schema, flatbuffer_utils


def read(blob: bytes):
    """The model object of a TFLite flatbuffer (ModelError when it is not one)."""
    _, fb = load_schema()
    try:
        return fb.convert_bytearray_to_object(bytearray(blob))
    except Exception as exc:  # the generated reader raises whatever a bad offset gives
        raise ModelError(f"not a readable TFLite flatbuffer ({type(exc).__name__})",
                         "give the .tflite file as exported, not truncated or edited") from exc


def write(model) -> bytes:
    """A model object back as flatbuffer bytes."""
    _, fb = load_schema()
    return bytes(fb.convert_object_to_bytearray(model))


def opcode_of(model, index: int) -> int:
    return max_code(model.operatorCodes[index])


def max_code(code) -> int:
    """An operator code's builtin number (codes past 127 live only in ``builtinCode``)."""
    return max(int(code.builtinCode or 0), int(code.deprecatedBuiltinCode or 0))


def constant_data(model, tensor) -> np.ndarray | None:
    """A tensor's constant data as a flat uint8 array, or None for an activation."""
    data = model.buffers[tensor.buffer].data if 0 < tensor.buffer < len(model.buffers) else None
    return None if data is None or len(data) == 0 else np.asarray(data, np.uint8)


def weight_precision(blob: bytes) -> str:
    """``float16-weights`` when constants are stored as float16 and dequantised, else ``float32``."""
    model = read(blob)
    for sg in model.subgraphs:
        for op in sg.operators:
            if opcode_of(model, op.opcodeIndex) == DEQUANTIZE and op.inputs is not None and len(op.inputs):
                tensor = sg.tensors[op.inputs[0]]
                if tensor.type == FLOAT16 and constant_data(model, tensor) is not None:
                    return "float16-weights"
    return "float32"


def float32_weights(blob: bytes) -> bytes:
    """The model with every float16 constant read through a ``DEQUANTIZE`` stored as float32,
    and MediaPipe's ``Convolution2DTransposeBias`` custom op as the builtin ``TRANSPOSE_CONV``.

    Values are unchanged (float16 -> float32 is exact); the DEQUANTIZE ops and the float16
    tensors go. int8 weights of a dynamic-range ("hybrid") model, read directly by float ops or
    through a DEQUANTIZE, become their float32 values ``(q - zero_point) * scale``. A model
    without any of these comes back as it was.
    """
    model = read(blob)
    changed = _builtin_transpose_conv(model) | _dequantized_int8_weights(model)
    densified = _densified(model, blob)
    for sg_index, sg in enumerate(model.subgraphs):
        producer = {int(t): op for op in sg.operators for t in valid_indices(op.outputs)}
        drop = set()
        for op in sg.operators:
            src = sg.tensors[op.inputs[0]] if op.inputs is not None and len(op.inputs) else None
            if opcode_of(model, op.opcodeIndex) != DEQUANTIZE or src is None or src.type != FLOAT16:
                continue
            data = constant_data(model, src)
            if data is not None:
                values = data.view(np.float16).astype(np.float32)
            elif sg_index == 0 and int(op.outputs[0]) in densified:
                values = densified[int(op.outputs[0])]
                drop.add(id(producer[int(op.inputs[0])]))
            else:
                continue
            sg.tensors[op.outputs[0]].buffer = new_buffer(model, values)
            drop.add(id(op))
            changed = True
        sg.operators = [op for op in sg.operators if id(op) not in drop]
    return write(pruned(model)) if changed else blob


INT8, UINT8, INT16 = 9, 3, 7  # tflite::TensorType
QUANTIZED = (INT8, UINT8, INT16)


def quantized_activations(blob: bytes) -> list[str]:
    """Names of the non-constant int8/uint8/int16 tensors: a model that computes in integers
    (whatever its I/O type), as opposed to a float model with int8 weights only."""
    model = read(blob)
    return [(t.name or b"").decode(errors="replace") for sg in model.subgraphs for t in sg.tensors
            if t.type in QUANTIZED and constant_data(model, t) is None][:5]


def _dequantized_int8_weights(model) -> bool:
    """Store the int8 weights of a float model (dynamic-range quantisation: TFLiteConverter with
    ``Optimize.DEFAULT`` and no representative data) as float32; True when any were.

    A hybrid op (CONV_2D with int8 filters and float input) is left to XNNPACK's float path only
    once its weights are float; a model with integer activations is not touched."""
    if any(t.type in QUANTIZED and constant_data(model, t) is None for sg in model.subgraphs for t in sg.tensors):
        return False
    changed = False
    for sg in model.subgraphs:
        for tensor in sg.tensors:
            data = constant_data(model, tensor)
            q = tensor.quantization
            if tensor.type not in (INT8, UINT8) or data is None or q is None or q.scale is None or not len(q.scale):
                continue
            values = data.view(np.int8 if tensor.type == INT8 else np.uint8).astype(np.float32)
            shape = [int(d) for d in tensor.shape] if tensor.shape is not None else [values.size]
            values = values.reshape(shape) if int(np.prod(shape)) == values.size else values
            scale, zero = np.asarray(q.scale, np.float32), np.asarray(q.zeroPoint if q.zeroPoint is not None else 0)
            if scale.size > 1 and values.ndim > int(q.quantizedDimension or 0):  # per-channel, along that axis
                axis = int(q.quantizedDimension or 0)
                view = [1] * values.ndim
                view[axis] = scale.size
                scale, zero = scale.reshape(view), zero.reshape(view) if zero.size == scale.size else zero
            tensor.buffer = new_buffer(model, ((values - zero) * scale).astype(np.float32))
            tensor.type, tensor.quantization = FLOAT32, None
            changed = True
    for sg in model.subgraphs:  # a DEQUANTIZE of weights now float: read the tensor directly
        drop = [op for op in sg.operators if opcode_of(model, op.opcodeIndex) == DEQUANTIZE
                and sg.tensors[op.inputs[0]].type == FLOAT32
                and constant_data(model, sg.tensors[op.inputs[0]]) is not None]
        for op in drop:
            sg.tensors[op.outputs[0]].buffer = sg.tensors[op.inputs[0]].buffer
        sg.operators = [op for op in sg.operators if all(op is not d for d in drop)]
    return changed


MEDIAPIPE_TRANSPOSE_CONV = b"Convolution2DTransposeBias"
TFLITE_PADDING = {1: 0, 2: 1}  # TfLitePadding (kTfLitePaddingSame, kTfLitePaddingValid) -> tflite::Padding


def _builtin_transpose_conv(model) -> bool:
    """Replace MediaPipe's ``Convolution2DTransposeBias`` (a transposed convolution plus bias, in
    every MediaPipe segmentation model) by the builtin ``TRANSPOSE_CONV`` with its bias input.

    TensorFlow's calibrator, the Edge TPU compiler and tf2onnx have no kernel for the custom op
    (tf2onnx leaves it in the graph without an error). Its options are MediaPipe's raw
    ``TfLiteTransposeConvParams``: int32 padding, stride_width, stride_height. Returns True when
    an op was replaced.
    """
    import struct

    schema, _ = load_schema()
    customs = {i for i, code in enumerate(model.operatorCodes) if code.customCode == MEDIAPIPE_TRANSPOSE_CONV}
    found = False
    for sg in model.subgraphs:
        for op in sg.operators:
            raw = bytes(op.customOptions) if op.customOptions is not None else b""
            if op.opcodeIndex not in customs or len(raw) < 12 or len(valid_indices(op.inputs)) != 3:
                continue
            padding, stride_w, stride_h = struct.unpack("<3i", raw[:12])
            if padding not in TFLITE_PADDING or not (0 < stride_w <= 64 and 0 < stride_h <= 64):
                continue
            shape = schema.TensorT()
            shape.shape, shape.type, shape.name = [4], 2, (sg.tensors[op.outputs[0]].name or b"") + b"_shape"  # INT32
            shape.buffer = new_buffer(model, np.asarray(sg.tensors[op.outputs[0]].shape, np.int32))
            sg.tensors.append(shape)
            image, weights, bias = valid_indices(op.inputs)
            options = schema.TransposeConvOptionsT()
            options.padding, options.strideW, options.strideH = TFLITE_PADDING[padding], stride_w, stride_h
            op.opcodeIndex = builtin_code_index(model, schema, 67, 3)  # TRANSPOSE_CONV v3: with a bias input
            op.inputs = [len(sg.tensors) - 1, weights, image, bias]
            op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.TransposeConvOptions, options
            op.customOptions, op.customOptionsFormat = None, 0
            found = True
    return found


def builtin_code_index(model, schema, builtin: int, version: int) -> int:
    """The index of a builtin operator code (at least ``version``), added when the model has none."""
    for i in range(len(model.operatorCodes)):
        if opcode_of(model, i) == builtin and not model.operatorCodes[i].customCode:
            model.operatorCodes[i].version = max(int(model.operatorCodes[i].version or 1), version)
            return i
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _densified(model, blob: bytes) -> dict[int, np.ndarray]:
    """Float32 values of each ``DENSIFY`` -> ``DEQUANTIZE`` chain of a sparse float16 constant
    (MediaPipe's pose detector stores 38 kernels so), by DEQUANTIZE output tensor.

    TFLite's sparse formats are decoded by the interpreter itself, not re-implemented here: it
    runs once with every intermediate tensor kept, and the dense values are read back.
    """
    sg = model.subgraphs[0]
    producer = {int(t): op for op in sg.operators for t in valid_indices(op.outputs)}
    wanted = []
    for op in sg.operators:
        src = valid_indices(op.inputs)[:1]
        feeder = producer.get(src[0]) if src else None
        if (opcode_of(model, op.opcodeIndex) == DEQUANTIZE and feeder is not None
                and opcode_of(model, feeder.opcodeIndex) == DENSIFY
                and constant_data(model, sg.tensors[valid_indices(feeder.inputs)[0]]) is not None):
            wanted.append(int(op.outputs[0]))
    if not wanted:
        return {}
    import warnings

    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    with warnings.catch_warnings():  # "preserve_all_tensors is for debugging": here it is the point
        warnings.simplefilter("ignore", UserWarning)
        # built-in kernels only: XNNPACK would take the constant chains over and never fill them in
        interp = Interpreter(model_content=blob, experimental_preserve_all_tensors=True,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    for detail in interp.get_input_details():
        interp.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
    interp.invoke()
    return {t: np.array(interp.get_tensor(t), np.float32) for t in wanted}


def float16_weights(blob: bytes) -> bytes:
    """The model with its float32 constants stored as float16 and dequantised at load.

    XNNPACK folds these DEQUANTIZE ops into the weights when it prepares the model, so the
    file halves while compute stays float32. Constants out of float16's range stay float32.
    """
    schema, _ = load_schema()
    model = read(float32_weights(blob))
    deq = builtin_code_index(model, schema, DEQUANTIZE, 3)  # DEQUANTIZE v3 reads float16
    for sg in model.subgraphs:
        consumed = {int(t) for op in sg.operators for t in (op.inputs if op.inputs is not None else []) if t >= 0}
        front = []
        for index in sorted(consumed):
            tensor = sg.tensors[index]
            data = constant_data(model, tensor)
            if tensor.type != FLOAT32 or data is None or data.size // 4 < MIN_FP16_ELEMENTS:
                continue
            values = data.view(np.float32)
            if not np.all(np.isfinite(values)) or float(np.max(np.abs(values))) > FP16_MAX:
                continue
            half = schema.TensorT()
            half.shape, half.type = tensor.shape, FLOAT16
            half.name = (tensor.name or b"") + b"_fp16"
            half.buffer = new_buffer(model, values.astype(np.float16))
            sg.tensors.append(half)
            tensor.buffer = 0  # now the DEQUANTIZE's output, computed at load
            op = schema.OperatorT()
            op.opcodeIndex, op.inputs, op.outputs = deq, [len(sg.tensors) - 1], [index]
            front.append(op)
        sg.operators = front + list(sg.operators)
    return write(pruned(model))


def new_buffer(model, values: np.ndarray) -> int:
    schema, _ = load_schema()
    buf = schema.BufferT()
    buf.data = np.frombuffer(np.ascontiguousarray(values).tobytes(), np.uint8)
    model.buffers.append(buf)
    return len(model.buffers) - 1


def pruned(model):
    """The model without tensors no op, input, output or signature uses, without operator codes
    no op uses, and with the data of buffers nothing refers to any more dropped (buffer indices
    kept: buffer 0 stays the empty one)."""
    for sg in model.subgraphs:
        used = set(valid_indices(sg.inputs)) | set(valid_indices(sg.outputs))
        for op in sg.operators:
            used |= set(valid_indices(op.inputs)) | set(valid_indices(op.outputs))
            used |= set(valid_indices(op.intermediates))
        new = {old: i for i, old in enumerate(sorted(used))}
        sg.tensors = [sg.tensors[old] for old in sorted(used)]
        sg.inputs = [new[int(t)] for t in valid_indices(sg.inputs)]
        sg.outputs = [new[int(t)] for t in valid_indices(sg.outputs)]
        for op in sg.operators:
            op.inputs = [new[int(t)] if t >= 0 else -1 for t in (op.inputs if op.inputs is not None else [])]
            op.outputs = [new[int(t)] for t in valid_indices(op.outputs)]
            if op.intermediates is not None:
                op.intermediates = [new[int(t)] for t in valid_indices(op.intermediates)]
        for sig in model.signatureDefs or []:
            if sig.subgraphIndex == model.subgraphs.index(sg):
                for item in list(sig.inputs or []) + list(sig.outputs or []):
                    item.tensorIndex = new.get(int(item.tensorIndex), item.tensorIndex)
    codes = sorted({op.opcodeIndex for sg in model.subgraphs for op in sg.operators})
    model.operatorCodes = [model.operatorCodes[c] for c in codes]  # an unused code can fail registration
    for sg in model.subgraphs:
        for op in sg.operators:
            op.opcodeIndex = codes.index(op.opcodeIndex)
    referenced = {t.buffer for sg in model.subgraphs for t in sg.tensors}
    referenced |= {m.buffer for m in model.metadata or []} | set(valid_indices(model.metadataBuffer))
    for i, buf in enumerate(model.buffers):
        if i and i not in referenced:
            buf.data = None
    return model


def valid_indices(values) -> list[int]:
    return [int(v) for v in values if v >= 0] if values is not None else []


def reorder_outputs(blob: bytes, order: list[int]) -> bytes:
    """The model with its main subgraph's outputs listed as ``order`` says: ``order[j]`` is the
    current position of the output that becomes output ``j``.

    TensorFlow's converter lists a SavedModel's outputs by signature key, not as the model
    declares them; putting them back makes ``infer()[j]`` the model's own output ``j``.
    """
    model = read(blob)
    sg = model.subgraphs[0]
    current = valid_indices(sg.outputs)
    if sorted(order) != list(range(len(current))):
        raise ModelError(f"output order {order} is not a permutation of {len(current)} outputs")
    sg.outputs = [current[p] for p in order]
    return write(model)
