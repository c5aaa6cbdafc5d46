"""Full-integer int8 of a float TFLite model by TensorFlow's own post-training quantiser.

The steps ``TFLiteConverter`` runs after converting a SavedModel (``Calibrator`` then
``mlir_quantize``), applied to a TFLite graph directly: a .tflite source, or a converted
graph rewritten for the accelerator (:mod:`edgekit.builders.graph.rewrite`). Build-side only.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import numpy as np

from edgekit.builders.graph.edit import FLOAT32, constant_data, float32_weights, load_schema, read, valid_indices, write
from edgekit.builders.tf import NATIVE_LOG, converter_error
from edgekit.errors import ModelError
from edgekit.util.quiet import converter_level, native_stderr_to_log


def quantize_int8(blob: bytes, representative: Iterable[np.ndarray], io_dtype: str = "uint8",
                  denylisted_nodes: list[str] | None = None, numeric_verify: bool = False,
                  logged_ranges: bool = False) -> bytes:
    """Full-integer int8 of a float TFLite model, calibrated on ``representative`` (one float
    tensor per image, no batch axis, in the model's own layout), with ``io_dtype`` I/O.

    TensorFlow's own post-training steps, as ``TFLiteConverter`` runs them with
    ``TFLITE_BUILTINS_INT8``; an op left in float afterwards is refused, naming it, unless it
    was asked for: ``denylisted_nodes`` (op output tensor names) stay float on purpose.
    ``numeric_verify``: the same quantisation instrumented for TensorFlow's QuantizationDebugger
    (each int8 op's output compared with its float op's; float I/O), for the per-layer report.
    ``logged_ranges``: the ranges as TensorFlow's calibrator logs them, not corrected
    (:class:`RangeObserver`): wider where an op overwrote its input, which clips less on images
    unlike the calibration ones (a recovery attempt, builders/int8/recovery.py).
    """
    from edgekit.builders.tf import import_tf

    tf = import_tf()
    from tensorflow.lite.python.convert import mlir_quantize

    if representative is None or not len(representative):
        raise ModelError("int8 conversion needs calibration images", "pass --calib DIR")
    io = tf.float32 if numeric_verify else {"uint8": tf.uint8, "int8": tf.int8}[io_dtype]
    try:
        calibrated = _calibrated(blob, representative, correct=not logged_ranges)
        with native_stderr_to_log(NATIVE_LOG, converter_level):  # "fully_quantize: 0, inference_type: 6 ..."
            quantized = mlir_quantize(calibrated, input_data_type=io, output_data_type=io,
                                      enable_numeric_verify=numeric_verify,
                                      denylisted_nodes=list(denylisted_nodes) if denylisted_nodes else None)
    except (RuntimeError, ValueError) as exc:
        raise ModelError(f"TFLite int8 quantisation failed: {converter_error(str(exc)) or type(exc).__name__}",
                         "see build.log (--debug); the fp32 and fp16 variants do not need it") from exc
    float_ops = [] if denylisted_nodes or numeric_verify else float_ops_left(quantized)
    if float_ops:
        raise ModelError(f"int8: TensorFlow's quantiser left {', '.join(float_ops)} in float (no int8 kernel)",
                         "build --variants fp32,fp16 for this model, or replace those ops before export")
    return quantized


def _calibrated(blob: bytes, representative: Iterable[np.ndarray], correct: bool = True) -> bytes:
    """The float model with each tensor's calibration range: TensorFlow's calibrator, its ranges
    corrected by what :class:`RangeObserver` saw (``correct``)."""
    from tensorflow.lite.python.optimize import calibrator

    from edgekit.builders.log import progress

    prepared = calibrator.add_intermediate_tensors(float32_weights(blob))
    observer = RangeObserver(prepared) if correct else None

    def feed():
        for x in progress(representative, "int8 calibration", total=len(representative)):
            sample = np.asarray(x, np.float32)[None]
            if observer is not None:
                observer.observe(sample)
            yield [sample]

    calibrated = calibrator.Calibrator(prepared).calibrate(feed)
    return observer.corrected(calibrated) if observer is not None else calibrated


def quantize_16x8(blob: bytes, representative: Iterable[np.ndarray]) -> bytes:
    """int8 weights with int16 activations ("16x8": TensorFlow's
    ``EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8``) of a float TFLite model, float32
    I/O: activation steps 256 times finer than int8's, for CPUs only (no accelerator and no XNNPACK
    kernel runs it). TensorFlow quantises 16x8 with its older quantiser, which calibrates on its own
    (the ranges are not checked as :func:`quantize_int8`'s are; int16's steps leave room for that).
    """
    from edgekit.builders.log import progress
    from edgekit.builders.tf import import_tf

    tf = import_tf()
    from tensorflow.lite.python.optimize import calibrator

    def feed():
        for x in progress(representative, "16x8 calibration", total=len(representative)):
            yield [np.asarray(x, np.float32)[None]]

    try:
        prepared = calibrator.add_intermediate_tensors(float32_weights(blob))
        with native_stderr_to_log(NATIVE_LOG, converter_level):
            return calibrator.Calibrator(prepared).calibrate_and_quantize(
                feed, tf.float32, tf.float32, False, activations_type=tf.int16, bias_type=tf.int64)
    except (RuntimeError, ValueError) as exc:
        raise ModelError(f"TFLite 16x8 quantisation failed: {converter_error(str(exc)) or type(exc).__name__}",
                         "see build.log (--debug)") from exc


def every_tensor_kept(blob: bytes):
    """A LiteRT interpreter of ``blob``, allocated, that keeps every tensor after ``invoke`` (no
    buffer shared, no delegate), for reading intermediate values."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    with warnings.catch_warnings():  # "preserve_all_tensors ... is intended for debugging": reading them is the point
        warnings.simplefilter("ignore", UserWarning)
        interp = Interpreter(model_content=blob, experimental_preserve_all_tensors=True,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    return interp


class RangeObserver:
    """Every float activation tensor's min and max over the calibration images, read with each
    tensor kept apart, to correct the ranges TensorFlow's calibrator logged.

    The calibrator logs an op's inputs again after the op ran; where the memory planner let the
    op write its output over an input (an in-place ADD or MUL), the input is logged with the
    output's values (tensorflow/tensorflow#127842). On a YOLOv8n export 70 of 404 ranges came
    out wider than the tensors ever were (a concatenation 25x), and on an SSD whose score is a
    linear branch plus a steep one the linear branch got the sum's range (14x): int8 bits lost
    for nothing. Observing is best-effort: a model this interpreter cannot run keeps the
    calibrator's ranges (logged).
    """

    def __init__(self, prepared: bytes):
        self.low: dict[int, float] = {}
        self.high: dict[int, float] = {}
        self.failed: str | None = None
        try:
            self._interp = every_tensor_kept(prepared)
        except (RuntimeError, ValueError) as exc:
            self.failed = str(exc)[:200]
            return
        inputs = self._interp.get_input_details()
        self._input = inputs[0]["index"] if len(inputs) == 1 else None
        self._tensors = [d["index"] for d in self._interp.get_tensor_details() if d["dtype"] == np.float32]
        if self._input is None:
            self.failed = "more than one input"

    def observe(self, sample: np.ndarray) -> None:
        """Run ``sample`` (batch of one) and widen every tensor's range by what it held."""
        if self.failed:
            return
        try:
            self._interp.set_tensor(self._input, sample)
            self._interp.invoke()
        except (RuntimeError, ValueError) as exc:
            self.failed = str(exc)[:200]
            return
        for index in self._tensors:
            try:
                values = self._interp.tensor(index)()
            except ValueError:  # a tensor with no data (an optional input)
                continue
            if values.size:
                low, high = float(values.min()), float(values.max())
                self.low[index] = min(self.low.get(index, low), low)
                self.high[index] = max(self.high.get(index, high), high)

    def corrected(self, calibrated: bytes) -> bytes:
        """``calibrated`` with each logged range that differs from the observed one replaced by it
        (same tensor indices: the calibrator writes its statistics into the graph it was given)."""
        if self.failed or not self.low:
            NATIVE_LOG.debug("int8 calibration ranges not checked: %s", self.failed or "nothing observed")
            return calibrated
        model = read(calibrated)
        changed = 0
        for index, tensor in enumerate(model.subgraphs[0].tensors):
            q = tensor.quantization
            if index not in self.low or q is None or q.min is None or q.max is None or len(q.min) != 1:
                continue
            low, high = self.low[index], self.high[index]
            if (float(q.min[0]), float(q.max[0])) != (low, high):
                q.min, q.max = np.array([low], np.float32), np.array([high], np.float32)
                changed += 1
        NATIVE_LOG.debug("int8 calibration: %d logged ranges corrected from the observed values", changed)
        return write(model) if changed else calibrated


def float_ops_left(blob: bytes) -> list[str]:
    """Names of the ops of a quantised model that still compute on float32 activations
    (the input QUANTIZE and output DEQUANTIZE excepted)."""
    _, fb = load_schema()
    model = read(blob)
    left: set[str] = set()
    for sg in model.subgraphs:
        for op in sg.operators:
            name = fb.opcode_to_name(model, op.opcodeIndex)
            if name in ("QUANTIZE", "DEQUANTIZE"):
                continue
            for t in valid_indices(op.inputs):
                tensor = sg.tensors[t]
                if tensor.type == FLOAT32 and constant_data(model, tensor) is None:
                    left.add(name)
    return sorted(left)
