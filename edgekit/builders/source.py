"""Load the user's trained model (Keras .keras/.h5, SavedModel dir, ONNX) for conversion.

Every failure becomes a ModelError naming the file and the fix; TensorFlow is imported
only here, inside functions.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import ModelError

SUPPORTED = ".keras, .h5, a SavedModel directory, or .onnx (jetson target only)"


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as exc:
        from edgekit.errors import BackendUnavailable

        raise BackendUnavailable("building needs TensorFlow", "pip install 'edgekit[build]'") from exc
    return tf


@dataclass
class SourceModel:
    """A loaded model: its kind, input shape (H, W, C) and a batch predict function."""

    path: Path
    kind: str  # keras | savedmodel | onnx
    input_hwc: tuple[int, int, int]
    handle: Any
    input_name: str = ""
    static_batch: bool = False

    def output_size(self) -> int | None:
        """Number of values in the (single) output per image, when static."""
        try:
            if self.kind == "keras":
                shape = self.handle.outputs[0].shape
            elif self.kind == "savedmodel":
                shape = next(iter(self.handle.structured_outputs.values())).shape
            else:
                shape = self.handle.get_outputs()[0].shape
            dims = [d for d in list(shape)[1:]]
            return int(np.prod(dims)) if all(isinstance(d, int) and d > 0 for d in dims) else None
        except (AttributeError, TypeError, StopIteration):
            return None

    def predict(self, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """Float32 NHWC batch -> float32 outputs of the original model (first output)."""
        outs = []
        for i in range(0, len(x), batch_size):
            chunk = x[i : i + batch_size]
            if self.kind == "keras":
                outs.append(np.asarray(self.handle(chunk, training=False)))
            elif self.kind == "savedmodel":
                res = self.handle(**{self.input_name: _tf().constant(chunk)})
                outs.append(np.asarray(next(iter(res.values()))))
            elif self.static_batch:
                outs += [self.handle.run(None, {self.input_name: chunk[j : j + 1]})[0] for j in range(len(chunk))]
            else:
                outs.append(self.handle.run(None, {self.input_name: chunk})[0])
        return np.concatenate(outs, axis=0).astype(np.float32)

    def export_static(self, out_dir: Path) -> Path:
        """Write a SavedModel with a static batch-1 input (the Edge TPU needs static shapes)."""
        tf = _tf()
        spec = tf.TensorSpec((1,) + self.input_hwc, tf.float32, name="image")
        if self.kind == "keras":
            self.handle.export(str(out_dir), format="tf_saved_model", input_signature=[spec], verbose=False)
            return out_dir
        if self.kind == "savedmodel":
            import keras

            # Wrapping the SavedModel in a Keras layer keeps its variables tracked; re-exporting a
            # bare signature from a tf.Module fails with "untracked resource".
            layer = keras.layers.TFSMLayer(str(self.path), call_endpoint="serving_default")
            inp = keras.Input(shape=self.input_hwc, batch_size=1)
            out = layer(inp)
            out = next(iter(out.values())) if isinstance(out, dict) else out
            keras.Model(inp, out).export(str(out_dir), format="tf_saved_model", input_signature=[spec], verbose=False)
            return out_dir
        raise ModelError("an ONNX model cannot be converted to TFLite by edgekit", "use --target jetson for ONNX input")


def load_source_model(path: str | Path) -> SourceModel:
    """Load a model for building; raises ModelError with a fix for bad files."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"model {path} does not exist", f"give a trained model: {SUPPORTED}")
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise ModelError(f"{path} is a directory but not a SavedModel (no saved_model.pb)", f"give {SUPPORTED}")
        return _load_savedmodel(path)
    suffix = path.suffix.lower()
    if suffix == ".keras":
        if not zipfile.is_zipfile(path):
            raise ModelError(f"{path} is corrupt: a .keras file must be a zip archive",
                             "re-save the model with model.save()")
        return _load_keras(path)
    if suffix in (".h5", ".hdf5"):
        with open(path, "rb") as f:
            if f.read(8) != b"\x89HDF\r\n\x1a\n":
                raise ModelError(f"{path} is corrupt: not an HDF5 file", "re-save the model")
        return _load_keras(path)
    if suffix == ".onnx":
        return _load_onnx(path)
    raise ModelError(f"{path}: unsupported model format {suffix or '(no suffix)'}", f"edgekit build takes {SUPPORTED}")


def _input_hwc(shape, path: Path) -> tuple[int, int, int]:
    dims = list(shape)[1:]
    if len(dims) != 3 or any(d is None or int(d) <= 0 for d in dims):
        raise ModelError(f"{path}: input shape {list(shape)} is not a static H x W x C image",
                         "give the model a fixed NHWC image input")
    return tuple(int(d) for d in dims)


def _load_keras(path: Path) -> SourceModel:
    _tf()
    import keras

    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as exc:  # keras raises many types for damaged archives
        raise ModelError(f"cannot load Keras model {path}: {str(exc).splitlines()[0][:200]}",
                         "check the file is a complete model saved with model.save()") from exc
    if len(model.inputs) != 1:
        raise ModelError(f"{path} has {len(model.inputs)} inputs; edgekit builds single-image models")
    if len(model.outputs) != 1:
        raise ModelError(f"{path} has {len(model.outputs)} outputs; edgekit builds single-output classifiers",
                         "export a model with one output (e.g. keras.Model(inputs, outputs[0]))")
    return SourceModel(path, "keras", _input_hwc(model.inputs[0].shape, path), model)


def _load_savedmodel(path: Path) -> SourceModel:
    tf = _tf()
    try:
        loaded = tf.saved_model.load(str(path))
        fn = loaded.signatures["serving_default"]
    except Exception as exc:
        raise ModelError(f"cannot load SavedModel {path}: {str(exc).splitlines()[0][:200]}",
                         "export it with model.export(dir) or tf.saved_model.save") from exc
    inputs = fn.structured_input_signature[1]
    if len(inputs) != 1:
        raise ModelError(f"{path} serving signature has {len(inputs)} inputs; edgekit builds single-image models")
    name, spec = next(iter(inputs.items()))
    if len(fn.structured_outputs) != 1:
        raise ModelError(f"{path} serving signature has {len(fn.structured_outputs)} outputs; "
                         "edgekit builds single-output classifiers")
    model = SourceModel(path, "savedmodel", _input_hwc(spec.shape, path), fn, input_name=name)
    model._keepalive = loaded  # type: ignore[attr-defined]  # the signature needs its object alive
    return model


def _load_onnx(path: Path) -> SourceModel:
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelError("ONNX input needs onnx and onnxruntime", "pip install 'edgekit[build]'") from exc
    try:
        onnx.checker.check_model(str(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelError(f"{path} is not a valid ONNX model: {str(exc).splitlines()[0][:200]}") from exc
    if len(sess.get_inputs()) != 1 or len(sess.get_outputs()) != 1:
        raise ModelError(f"{path} has {len(sess.get_inputs())} inputs and {len(sess.get_outputs())} outputs; "
                         "edgekit builds single-input, single-output classifiers")
    node = sess.get_inputs()[0]
    if len(node.shape) != 4:
        raise ModelError(f"{path}: input {node.shape} is not an image batch")
    if not all(isinstance(d, int) and d > 0 for d in node.shape[1:]):
        raise ModelError(f"{path}: input shape {node.shape} has symbolic dimensions besides the batch",
                         "export the ONNX with a fixed image size (only the batch may be dynamic)")
    shape = [d if isinstance(d, int) else 1 for d in node.shape]
    hwc = tuple(shape[1:]) if shape[3] in (1, 3) else (shape[2], shape[3], shape[1])
    return SourceModel(path, "onnx", hwc, sess, input_name=node.name, static_batch=isinstance(node.shape[0], int))
