"""Load the user's trained model (Keras .keras/.h5, SavedModel dir, ONNX, float TFLite) for conversion.

Every failure becomes a ModelError naming the file and the fix; TensorFlow is imported
only inside functions. A model may have several outputs: each keeps its name
(:mod:`edgekit.builders.sources.model`).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np

from edgekit.builders.sources.model import SourceModel, SourceOutput, make_outputs, signature_keys
from edgekit.builders.sources.onnx import INPUT_SIZE_HINT, Precheck
from edgekit.builders.tf import import_tf
from edgekit.errors import ModelError, first_line

__all__ = ["SUPPORTED", "SourceModel", "SourceOutput", "load_source_model", "make_outputs", "signature_keys"]

SUPPORTED = ".keras, .h5, a SavedModel directory, .onnx, or a float .tflite"


def load_source_model(path: str | Path, input_size: tuple[int, int] | None = None,
                      precheck: Precheck | None = None) -> SourceModel:
    """Load a model for building; raises ModelError with a fix for bad files.

    ``input_size`` (H, W) fixes an input whose height and width the model leaves open.
    ``precheck(hwc, activation_bytes)`` is called once the static input shape is known and
    before the model first runs (ONNX Runtime and LiteRT run ONNX and .tflite sources at load):
    the build's memory check (builders/host/preflight.py), which may raise.
    """
    path = Path(path)
    model = _load(path, input_size, precheck)
    if model.kind in ("keras", "savedmodel") and precheck is not None:  # loading ran nothing
        from edgekit.builders.host.memory import keras_activation_bytes, savedmodel_activation_bytes

        measure = keras_activation_bytes if model.kind == "keras" else savedmodel_activation_bytes
        precheck(model.input_hwc, measure(model.handle) if list(model.input_shape[1:3]) == list(model.input_hwc[:2])
                 else None)
    return model


def _load(path: Path, input_size: tuple[int, int] | None, precheck: Precheck | None) -> SourceModel:
    if not path.exists():
        raise ModelError(f"model {path} does not exist", f"give a trained model: {SUPPORTED}")
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise ModelError(f"{path} is a directory but not a SavedModel (no saved_model.pb)", f"give {SUPPORTED}")
        return _load_savedmodel(path, input_size)
    suffix = path.suffix.lower()
    if suffix == ".keras":
        if not zipfile.is_zipfile(path):
            raise ModelError(f"{path} is corrupt: a .keras file must be a zip archive",
                             "re-save the model with model.save()")
        return _load_keras(path, input_size)
    if suffix in (".h5", ".hdf5"):
        with open(path, "rb") as f:
            if f.read(8) != b"\x89HDF\r\n\x1a\n":
                raise ModelError(f"{path} is corrupt: not an HDF5 file", "re-save the model")
        return _load_keras(path, input_size)
    if suffix == ".onnx":
        from edgekit.builders.sources.onnx import load_onnx

        return load_onnx(path, input_size, precheck)
    if suffix == ".tflite":
        from edgekit.builders.sources.tflite import load_tflite

        return load_tflite(path, input_size, precheck)
    raise ModelError(f"{path}: unsupported model format {suffix or '(no suffix)'}", f"edgekit build takes {SUPPORTED}")


def _input_hwc(shape, path: Path, input_size: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """(H, W, C) of an NHWC image input; ``input_size`` fixes a height/width the model leaves open."""
    dims = list(shape)[1:]
    if len(dims) != 3 or dims[2] is None or int(dims[2]) not in (1, 3):
        raise ModelError(f"{path}: input shape {list(shape)} is not an NHWC image batch with 1 or 3 channels",
                         "give the model an image input of shape (height, width, 1 or 3)")
    open_hw = [d is None or int(d) <= 0 for d in dims[:2]]
    if any(open_hw) and input_size is None:
        raise ModelError(f"{path}: input shape {list(shape)}: its height/width are not fixed", INPUT_SIZE_HINT)
    if input_size is not None and not any(open_hw) and tuple(int(d) for d in dims[:2]) != tuple(input_size):
        raise ModelError(f"--input-size {input_size[0]}x{input_size[1]} does not fit {path}, fixed at "
                         f"{dims[0]}x{dims[1]}", "leave out --input-size for this model")
    if any(open_hw):
        return int(input_size[0]), int(input_size[1]), int(dims[2])
    return tuple(int(d) for d in dims)


def _load_keras(path: Path, input_size: tuple[int, int] | None = None) -> SourceModel:
    import_tf()
    import keras

    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as exc:  # keras raises many types for damaged archives
        raise _keras_load_error(path, exc) from exc
    if len(model.inputs) != 1:
        raise ModelError(f"{path} has {len(model.inputs)} inputs; edgekit builds single-image models",
                         "export a model with one image input")
    _check_float_input(path, model.inputs[0].name, model.inputs[0].dtype)
    names = _keras_output_names(model)
    # Keras 3 lists a dict-output model's outputs in name order, model.outputs in the same order
    shapes = [o.shape for o in model.outputs]
    return SourceModel(path, "keras", _input_hwc(model.inputs[0].shape, path, input_size), model,
                       outputs=make_outputs(names, shapes), input_shape=list(model.inputs[0].shape),
                       scales_own_pixels=scales_own_pixels(model))


def scales_own_pixels(model) -> str | None:
    """The layer with which a Keras model scales raw 0-255 pixels itself, or None.

    keras.applications models built with their preprocessing (EfficientNet, MobileNetV3,
    ConvNeXt) and models following the Keras guides start with ``Rescaling`` (1/255, 1/127.5)
    or a ``Normalization`` whose mean is in pixel units: fed edgekit's default [0, 1] pixels,
    they would see inputs 255 times too small, and convert and pass the gate all the same.
    Random* augmentation layers (inactive when predicting) and nested models are looked through.
    """
    layers = list(model.layers)
    while layers:
        layer = layers.pop(0)
        kind = type(layer).__name__
        if kind == "InputLayer" or kind.startswith("Random"):
            continue
        if hasattr(layer, "layers") and layer.layers:  # a nested Sequential/Model: its first layers
            layers = list(layer.layers) + layers
            continue
        if kind == "Rescaling" and float(np.max(np.abs(layer.scale))) < 0.1:
            return f"its first layer '{layer.name}' is Rescaling({float(np.ravel(layer.scale)[0]):.6g})"
        mean = getattr(layer, "mean", None)
        if kind == "Normalization" and mean is not None and float(np.max(np.asarray(mean))) > 2.0:
            return f"its first layer '{layer.name}' is a Normalization with a mean in pixel units"
        return None
    return None


def _graph_scales_own_pixels(fn) -> str | None:
    """:func:`scales_own_pixels` for a SavedModel signature: its first op on the image (past
    Identity/Cast) divides it by 100 or more (a Keras Rescaling, as a Keras 2 ``model.save(dir)``
    or a Keras 3 ``model.export(dir)`` keeps it)."""
    try:  # reading a graph is best effort: the default stays [0, 1] when anything is unexpected
        from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

        graph = convert_variables_to_constants_v2(fn, lower_control_flow=False,
                                                  aggressive_inlining=True).graph.as_graph_def()
        nodes = {n.name: n for n in graph.node}
        frontier = {n.name for n in graph.node if n.op == "Placeholder"}
        for _ in range(8):
            users = [n for n in graph.node if any(i.split(":")[0] in frontier for i in n.input)]
            for n in users:
                divisor = _constant_divisor(n, nodes)
                if divisor is not None and divisor >= 100:
                    return f"its first op '{n.name}' divides the image by {divisor:.6g}"
            frontier = {n.name for n in users if n.op in ("Identity", "Cast")}
            if not frontier:
                return None
    except Exception:
        return None
    return None


def _constant_divisor(node, nodes: dict) -> float | None:
    """What a Mul or RealDiv node by a constant divides by (1 / the factor of a Mul), else None."""
    from tensorflow.python.framework import tensor_util

    if node.op not in ("Mul", "RealDiv"):
        return None
    for name in node.input:
        const = nodes.get(name.split(":")[0])
        if const is not None and const.op == "Const":
            value = float(np.max(np.abs(tensor_util.MakeNdarray(const.attr["value"].tensor))))
            if value > 0:
                return 1 / value if node.op == "Mul" else value
    return None


def _check_float_input(path: Path, name: str, dtype) -> None:
    """edgekit feeds float32 pixels ((value - mean) / std): refuse, by type, an input of another type
    (a TF Object Detection API export takes uint8) instead of failing inside TensorFlow."""
    kind = getattr(dtype, "name", None) or str(dtype)
    if kind != "float32":
        raise ModelError(f"{path}: input '{name}' is {kind}; edgekit feeds a model float32 images "
                         "(scaled with --mean/--std)",
                         "re-export it behind a float32 input (a function that takes float32, casts it and calls "
                         "the model), then build with --mean 0 --std 1")


def _keras_load_error(path: Path, exc: Exception) -> ModelError:
    """What went wrong loading a Keras file: code the file needs (a lambda, a custom class) or damage."""
    text = str(exc)
    portable = ("export it with model.export(DIR) where it was trained and build that SavedModel "
                "(it needs no Python code)")
    if "Lambda" in text and "lambda" in text and "safe_mode" in text:
        return ModelError(f"{path} holds a Keras Lambda layer (Python code), which edgekit does not run from a file",
                          portable)
    missing = re.search(r"Could not locate (class|function) '([^']+)'", text)
    if missing:
        return ModelError(f"{path} needs the custom Keras {missing.group(1)} '{missing.group(2)}', "
                          "which is not importable here", portable)
    return ModelError(f"cannot load Keras model {path}: {first_line(exc, 200)}",
                      "check the file is a complete model saved with model.save()")


def _keras_output_names(model) -> list[str]:
    """A Keras model's output names: a functional model's ``output_names``; a Sequential (which
    has no such attribute in Keras 3) is named after its last layer."""
    names = getattr(model, "output_names", None)
    if names:
        return list(names)
    if len(model.outputs) == 1 and model.layers:
        return [model.layers[-1].name]
    return [getattr(t, "name", None) or f"output_{i}" for i, t in enumerate(model.outputs)]


def _load_savedmodel(path: Path, input_size: tuple[int, int] | None = None) -> SourceModel:
    tf = import_tf()
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        raise ModelError(f"cannot load SavedModel {path}: {first_line(exc, 200)}",
                         "export it with model.export(dir) or tf.saved_model.save") from exc
    signature = _signature_key(path, list(loaded.signatures.keys()))
    fn = loaded.signatures[signature]
    inputs = fn.structured_input_signature[1]
    if len(inputs) != 1:
        raise ModelError(f"{path} serving signature has {len(inputs)} inputs; edgekit builds single-image models",
                         "export a model with one image input")
    name, spec = next(iter(inputs.items()))
    _check_float_input(path, name, spec.dtype)
    outs = dict(sorted(fn.structured_outputs.items()))
    model = SourceModel(path, "savedmodel", _input_hwc(spec.shape, path, input_size), fn, input_name=name,
                        outputs=make_outputs(list(outs), [o.shape for o in outs.values()]),
                        input_shape=list(spec.shape), signature=signature,
                        scales_own_pixels=_graph_scales_own_pixels(fn))
    model._keepalive = loaded  # type: ignore[attr-defined]  # the signature needs its object alive
    return model


def _signature_key(path: Path, keys: list[str]) -> str:
    """The signature to build: ``serving_default``, else the only one there is."""
    if "serving_default" in keys:
        return "serving_default"
    if len(keys) == 1:
        return keys[0]
    found = f"it has {', '.join(sorted(keys))}" if keys else "it has none"
    raise ModelError(f"SavedModel {path} has no serving_default signature ({found})",
                     "export it with model.export(dir), or tf.saved_model.save(obj, dir, "
                     "signatures={'serving_default': fn})")
