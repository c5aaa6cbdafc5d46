"""SavedModel -> TFLite by TensorFlow's own converter, and where each output lands.

``TFLiteConverter.from_saved_model`` is used; ``from_concrete_functions`` is avoided because it
can write a weightless model that outputs NaN without any error. Build-side only.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from edgekit.builders.log import progress
from edgekit.builders.tf import NATIVE_LOG, converter_error
from edgekit.errors import ModelError
from edgekit.util.quiet import converter_level, litert_interpreter, native_stderr_to_log


def convert(saved_model: Path, variant: str, representative: Iterable[np.ndarray] | None = None,
            io_dtype: str = "uint8") -> bytes:
    """Convert a static-shape SavedModel to a TFLite flatbuffer of the given variant.

    ``representative``: the int8 calibration tensors, one image each (no batch axis); an array,
    or a sized re-iterable such as :class:`~edgekit.builders.sources.images.TensorStream` that decodes
    them lazily. TensorFlow's calibrator keeps running min/max statistics: one image at a time.
    """
    conv = converter(saved_model, variant, representative, io_dtype)
    try:
        with native_stderr_to_log(NATIVE_LOG, converter_level):  # MLIR's and absl's notes: DEBUG
            return conv.convert()
    except Exception as exc:  # the converter raises ConverterError and friends
        raise ModelError(f"TFLite conversion ({variant}) failed: {converter_error(str(exc)) or type(exc).__name__}",
                         "the model uses ops TFLite cannot convert; see build.log with --debug") from exc


def converter(saved_model: Path, variant: str, representative: Iterable[np.ndarray] | None = None,
              io_dtype: str = "uint8"):
    """The ``TFLiteConverter`` :func:`convert` runs, set up for ``variant`` (the quantisation
    report's debugger calibrates with the very same settings)."""
    from edgekit.builders.tf import import_tf

    tf = import_tf()  # TF's C++ log level set first: an ONNX build imports TensorFlow here, not at loading

    conv = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    if variant == "fp16":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    elif variant == "int8":
        if representative is None or not len(representative):
            raise ModelError("int8 conversion needs calibration images", "pass --calib DIR")
        conv.optimizations = [tf.lite.Optimize.DEFAULT]

        def rep():
            for x in progress(representative, "int8 calibration", total=len(representative)):
                yield [np.asarray(x, np.float32)[None]]

        conv.representative_dataset = rep
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = {"uint8": tf.uint8, "int8": tf.int8}[io_dtype]
        conv.inference_output_type = conv.inference_input_type
    elif variant != "fp32":
        raise ModelError(f"unknown TFLite variant {variant!r}", "use fp32, fp16 or int8")
    return conv


def output_order(path: Path, keys: list[str]) -> list[int]:
    """Where each source output (by signature key) lies among the interpreter's outputs.

    TensorFlow's converter may order a model's outputs differently from the SavedModel (by
    signature key, not by position); the TFLite signature keeps the key of every output
    tensor, so outputs are mapped by name, never by position. Raises ModelError when a key
    is missing (an output renamed or dropped in conversion).
    """
    interp = litert_interpreter(model_path=str(path))
    positions = {d["index"]: i for i, d in enumerate(interp.get_output_details())}
    try:
        by_key = interp.get_signature_runner("serving_default").get_output_details()
    except ValueError as exc:
        raise ModelError(f"{path.name} has no serving signature: its outputs cannot be matched by name") from exc
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise ModelError(f"output(s) {', '.join(missing)} were renamed or dropped in conversion "
                         f"({path.name} has {', '.join(by_key)})", "report it with build.log")
    return [positions[by_key[k]["index"]] for k in keys]


def same_outputs(path: Path, count: int) -> list[int]:
    """The output order of a variant made on a .tflite source's own graph: the source's, as the
    graph edits and TensorFlow's quantiser keep the subgraph's output list (checked by count)."""
    found = len(litert_interpreter(model_path=str(path)).get_output_details())
    if found != count:
        raise ModelError(f"{path.name} has {found} outputs after conversion, the original {count}",
                         "report it with build.log")
    return list(range(count))
