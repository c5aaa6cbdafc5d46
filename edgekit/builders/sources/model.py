"""The loaded original model (:class:`SourceModel`) and its outputs, whatever its format.

Every SourceModel names its outputs; every SavedModel edgekit exports keys its signature
outputs by :attr:`SourceOutput.key`, so a converted model's outputs are found by name
however a converter orders them. Loading lives in :mod:`edgekit.builders.sources.load` (Keras,
SavedModel) and :mod:`edgekit.builders.sources.onnx` (ONNX).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.builders.tf import import_tf
from edgekit.errors import ModelError


@dataclass(frozen=True)
class SourceOutput:
    """One output of the original model: its name, the signature key it is exported under,
    and its per-image shape (None where the model leaves a dimension open)."""

    name: str
    key: str
    shape: tuple[int | None, ...]

    @property
    def size(self) -> int | None:
        """Values per image, when every dimension is known."""
        return int(np.prod(self.shape)) if all(isinstance(d, int) and d > 0 for d in self.shape) else None


def signature_keys(names: list[str]) -> list[str]:
    """Signature keys for output names: letters, digits and ``_`` only, unique, never empty."""
    keys: list[str] = []
    for i, name in enumerate(names):
        key = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or f"output_{i}"
        if not key[0].isalpha():
            key = f"o_{key}"
        keys.append(key if key not in keys else f"{key}_{i}")
    return keys


def make_outputs(names: list[str], shapes: list[Any]) -> tuple[SourceOutput, ...]:
    """SourceOutputs from names and full shapes (batch first)."""
    dims = [tuple(d if isinstance(d, int) and d > 0 else None for d in list(s)[1:]) for s in shapes]
    return tuple(SourceOutput(n, k, d) for n, k, d in zip(names, signature_keys(names), dims))


@dataclass
class SourceModel:
    """A loaded model: its kind, input (H, W, C) and layout, its outputs, and a batch predict.

    ``layout`` is the original input layout (NCHW for most PyTorch exports); ``input_shape``
    the input's dimensions as the file declares them (symbolic ones by name); ``onnx``
    the prepared ONNX bytes (static shape, sanitised node names) for ONNX sources.
    """

    path: Path
    kind: str  # keras | savedmodel | onnx | tflite
    input_hwc: tuple[int, int, int]
    handle: Any
    input_name: str = ""
    static_batch: bool = False
    layout: str = "NHWC"
    outputs: tuple[SourceOutput, ...] = ()
    input_shape: list = field(default_factory=list)
    onnx: bytes | None = None
    opset: int | None = None
    signature: str = "serving_default"  # the SavedModel signature built (a SavedModel source)
    scales_own_pixels: str | None = None  # why the model takes raw 0-255 pixels (its own Rescaling layer)
    _graph: Any = field(default=None, repr=False, compare=False)

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    def output_size(self) -> int | None:
        """Values per image of the model's only output (None for several, or when not static)."""
        return self.outputs[0].size if len(self.outputs) == 1 else None

    def predict(self, x: np.ndarray, batch_size: int = 8) -> list[np.ndarray]:
        """A float32 batch in the model's own layout -> float32 outputs, one array per output.

        Runs ``batch_size`` images at a time: a Keras model through one traced graph
        (:meth:`_keras_graph`), never eagerly on the whole batch.
        """
        chunks: list[list[np.ndarray]] = []
        for i in range(0, len(x), batch_size):
            chunk = x[i : i + batch_size]
            if self.kind == "keras":
                chunks.append(_as_list(self._keras_graph()(chunk), self.output_names))
            elif self.kind == "savedmodel":
                res = self.handle(**{self.input_name: import_tf().constant(chunk)})
                chunks.append([np.asarray(res[o.name]) for o in self.outputs])
            elif self.kind == "tflite":  # builders/sources/tflite.py: LiteRT, one image per run
                chunks.append(self.handle.predict(chunk))
            else:
                # a prepared ONNX has batch 1: one image per run, as the device runs it
                runs = [self.handle.run(self.output_names, {self.input_name: chunk[j : j + 1]})
                        for j in range(len(chunk))]
                chunks.append([self._stack([r[k] for r in runs], k) for k in range(len(self.outputs))])
        if not chunks:
            return [np.zeros((0,) + tuple(d or 1 for d in o.shape), np.float32) for o in self.outputs]
        return [np.concatenate([c[k] for c in chunks]).astype(np.float32) for k in range(len(self.outputs))]

    def _stack(self, rows: list[np.ndarray], k: int) -> np.ndarray:
        """One output's per-image arrays as one batch; ModelError when its shape changes with the image."""
        output = self.outputs[k]
        shapes = {r.shape[1:] for r in rows}
        if len(shapes) > 1 or any(d is not None and d != got for d, got in zip(output.shape, next(iter(shapes)))):
            seen = ", ".join(str(list(s)) for s in sorted(shapes | {tuple(d or 0 for d in output.shape)}))
            raise ModelError(f"output '{output.name}' of {self.path.name} changes shape with the image ({seen}): "
                             "edgekit converts and runs models whose outputs have a fixed size",
                             "export the model without the steps that keep a varying number of results "
                             "(NMS, top-k by threshold: Ultralytics nms=False); edgekit's detect head does NMS")
        return np.concatenate(rows)

    def _keras_graph(self) -> Any:
        """The Keras model as one ``tf.function`` over any batch size, traced once.

        Calling a Keras model eagerly allocates every layer's activations op by op and the
        allocator keeps the peak: 30 MobileNetV2 images at 224x224 in one eager call left the
        process 2.7 GB larger; the traced graph on chunks of 8 adds about 170 MB
        (benchmarks/build_scaling.py).
        """
        if self._graph is None:
            tf = import_tf()
            model = self.handle
            spec = tf.TensorSpec((None, *self.input_shape[1:]), tf.float32)
            self._graph = tf.function(lambda t: model(t, training=False), input_signature=[spec])
        return self._graph

    def export_static(self, out_dir: Path) -> Path:
        """Write a SavedModel with a static batch-1 input (the Edge TPU needs static shapes) whose
        signature outputs are keyed by :attr:`SourceOutput.key`."""
        tf = import_tf()
        import keras

        spec = tf.TensorSpec((1,) + self.input_hwc, tf.float32, name="image")
        if self.kind == "keras":
            model = self.handle
        elif self.kind == "savedmodel":
            # Wrapping the SavedModel in a Keras layer keeps its variables tracked; re-exporting a
            # bare signature from a tf.Module fails with "untracked resource".
            layer = keras.layers.TFSMLayer(str(self.path), call_endpoint=self.signature)
            inp = keras.Input(shape=self.input_hwc, batch_size=1)
            model = keras.Model(inp, layer(inp))
        else:
            raise ModelError(f"{self.kind} models are not exported to a SavedModel (ONNX goes through onnx2tf, "
                             "a .tflite is converted on its own graph)")
        names, keys = self.output_names, [o.key for o in self.outputs]
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint(
            "serving_default",
            fn=lambda image: dict(zip(keys, _as_list(model(image, training=False), names, numpy=False))),
            input_signature=[spec],
        )
        archive.write_out(str(out_dir), verbose=False)
        return out_dir


def _as_list(out: Any, names: list[str], numpy: bool = True) -> list:
    """A model call's result (tensor, list or dict by output name) as a list in ``names`` order."""
    if isinstance(out, dict):
        out = [out[n] for n in names]
    elif not isinstance(out, (list, tuple)):
        out = [out]
    return [np.asarray(o) for o in out] if numpy else list(out)
