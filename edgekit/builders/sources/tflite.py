"""A float ``.tflite`` file as the model to build (MediaPipe, TF Hub, Model Maker, vendors).

The file is checked and opened in LiteRT, which is also the reference the variants are compared
against: the original's outputs are the file's own outputs as LiteRT computes them, in the
file's own output order and under its own tensor names. Variants are made on the TFLite graph
itself (:mod:`edgekit.builders.graph.edit`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from edgekit.builders.sources.model import SourceModel, make_outputs
from edgekit.builders.sources.onnx import INPUT_SIZE_HINT, Precheck
from edgekit.errors import ModelError, first_line
from edgekit.util.quiet import litert_interpreter

MAX_BYTES = 2 << 30  # a flatbuffer cannot address more; a bigger file is not one model
CUSTOM_OP_HINT = ("export the model without custom ops (MediaPipe's Convolution2DTransposeBias is a TRANSPOSE_CONV "
                  "plus a bias add), or build it from its original Keras/ONNX model")


class TFLiteReference:
    """The source model's reference run: one image at a time through LiteRT, outputs in the
    file's order as float32 arrays the caller owns."""

    def __init__(self, path: Path, blob: bytes, input_shape: list[int]):
        self.blob = blob
        self.interp = litert_interpreter(model_content=blob)
        detail = self.interp.get_input_details()[0]
        if list(detail["shape"]) != list(input_shape):
            self.interp.resize_tensor_input(detail["index"], input_shape, strict=True)
        self.interp.allocate_tensors()
        self.input_index = detail["index"]
        self.output_indices = [d["index"] for d in self.interp.get_output_details()]

    def run(self, image: np.ndarray) -> list[np.ndarray]:
        """One float32 image with its batch axis -> one array per output (copies)."""
        self.interp.set_tensor(self.input_index, np.ascontiguousarray(image, np.float32))
        self.interp.invoke()
        return [np.array(self.interp.get_tensor(i), np.float32) for i in self.output_indices]

    def predict(self, batch: np.ndarray) -> list[np.ndarray]:
        """A batch of images -> one stacked array per output."""
        runs = [self.run(batch[j : j + 1]) for j in range(len(batch))]
        return [np.concatenate([r[k] for r in runs]) for k in range(len(self.output_indices))]


def load_tflite(path: Path, input_size: tuple[int, int] | None = None, precheck: Precheck | None = None) -> SourceModel:
    """Load and check a float TFLite model for building; ModelError with a fix for bad files.

    ``precheck`` (the build's memory check) sees the static input and the graph's widest step
    (unknown for an open height/width) before LiteRT allocates and runs the model once on zeros.
    """
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except ImportError as exc:
        from edgekit.errors import BackendUnavailable

        raise BackendUnavailable("a .tflite source needs LiteRT", "pip install 'edgekit-vision[build]'") from exc
    blob = _read(path)
    try:  # tensors are allocated once the input shape is known (an open height/width needs --input-size)
        interp = litert_interpreter(model_content=blob)
    except (ValueError, RuntimeError) as exc:
        raise _open_error(path, str(exc)) from exc
    inputs = interp.get_input_details()
    if len(inputs) != 1:
        raise ModelError(f"{path} has {len(inputs)} inputs; edgekit builds single-image models",
                         "export a model with one image input")
    detail = inputs[0]
    if np.dtype(detail["dtype"]) != np.float32:
        raise ModelError(f"{path}: input '{detail['name']}' is {np.dtype(detail['dtype']).name}: the model is "
                         "already quantised, and edgekit builds from a float model",
                         f"give the float .tflite; run this one as it is with: edgekit run {path.name}")
    _refuse_integer_graph(path, blob)
    shape, layout = _input_shape(path, detail, input_size)
    hwc = (shape[1], shape[2], shape[3]) if layout == "NHWC" else (shape[2], shape[3], shape[1])
    if precheck is not None:
        from edgekit.builders.host.memory import tflite_activation_bytes

        precheck(hwc, tflite_activation_bytes(interp))
    try:
        reference = TFLiteReference(path, blob, shape)
        outputs = reference.run(np.zeros(shape, np.float32))
    except (ValueError, RuntimeError) as exc:
        if "custom op" in str(exc):
            raise _open_error(path, str(exc)) from exc
        raise ModelError(f"LiteRT cannot run {path.name} at input {shape}: {first_line(exc)}",
                         INPUT_SIZE_HINT if input_size else "check the file is a complete float .tflite model") from exc
    for out, detail_out in zip(outputs, reference.interp.get_output_details()):
        if out.ndim == 0 or out.shape[0] != 1:
            raise ModelError(f"{path.name}: output '{detail_out['name']}' has shape {list(out.shape)} for one image: "
                             "it has no batch dimension", "export the model with a leading batch dimension")
    names = [d["name"] for d in reference.interp.get_output_details()]
    return SourceModel(path, "tflite", hwc, reference, input_name=detail["name"], static_batch=True, layout=layout,
                       outputs=make_outputs(names, [o.shape for o in outputs]), input_shape=shape)


def _refuse_integer_graph(path: Path, blob: bytes) -> None:
    """A model that computes in integers behind float I/O (QUANTIZE in, DEQUANTIZE out) is
    already quantised: re-quantising it would compound the error. int8 weights alone (dynamic
    range) are fine: they are read back as float32 (builders/graph/edit.py)."""
    from edgekit.builders.graph.edit import quantized_activations

    found = quantized_activations(blob)
    if found:
        raise ModelError(f"{path.name} computes in integers (tensor '{found[0]}' and others) behind its float "
                         "input: the model is already quantised, and edgekit builds from a float model",
                         f"give the float .tflite; run this one as it is with: edgekit run {path.name}")


def _read(path: Path) -> bytes:
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ModelError(f"{path} is {size / 2**30:.1f} GiB: more than a TFLite flatbuffer can hold",
                         "give the .tflite file of one model")
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8 or blob[4:8] != b"TFL3":
        raise ModelError(f"{path} is not a TFLite model (no TFL3 identifier)",
                         "give the .tflite file as exported; a copy may be truncated")
    return blob


def _open_error(path: Path, text: str) -> ModelError:
    custom = re.findall(r"unresolved custom ops?: \[?([A-Za-z0-9_, ]+)\]?", text) or re.findall(
        r"custom op:? ([A-Za-z0-9_]+)", text)
    if custom:
        ops = ", ".join(sorted({op.strip() for found in custom for op in found.split(",") if op.strip()}))
        return ModelError(f"{path.name} uses the custom op {ops}, which LiteRT has no kernel for", CUSTOM_OP_HINT)
    return ModelError(f"LiteRT cannot load {path.name}: {first_line(text) or 'unknown error'}",
                      "check the file is a complete .tflite model (a copy may be truncated)")


def _input_shape(path: Path, detail: dict, input_size: tuple[int, int] | None) -> tuple[list[int], str]:
    """The static batch-1 input shape and its layout (NHWC, or NCHW for 1/3 channels first)."""
    declared = [int(d) for d in detail.get("shape_signature", detail["shape"])]
    if len(declared) != 4:
        raise ModelError(f"{path.name}: input shape {declared} is not an image batch (4 dimensions)",
                         "give a model with one image input")
    layout = "NCHW" if declared[1] in (1, 3) and declared[3] not in (1, 3) else "NHWC"
    hw = [1, 2] if layout == "NHWC" else [2, 3]
    channels = declared[3] if layout == "NHWC" else declared[1]
    if channels not in (1, 3):
        raise ModelError(f"{path.name}: input shape {declared} does not have 1 or 3 channels",
                         "give a model with a grey or colour image input")
    shape = [1] + declared[1:]
    open_hw = [declared[i] <= 0 for i in hw]
    if any(open_hw) and input_size is None:
        raise ModelError(f"{path.name}: input shape {declared}: its height/width are not fixed", INPUT_SIZE_HINT)
    if input_size is not None:
        if not any(open_hw) and [declared[i] for i in hw] != list(input_size):
            raise ModelError(f"--input-size {input_size[0]}x{input_size[1]} does not fit {path.name}, fixed at "
                             f"{declared[hw[0]]}x{declared[hw[1]]}", "leave out --input-size for this model")
        shape[hw[0]], shape[hw[1]] = int(input_size[0]), int(input_size[1])
    return shape, layout
