"""Make the second bundled models from ``models/demo.keras`` (run by ``make models``; not committed).

- ``models/demo.onnx``: the demo classifier exported with tf2onnx the way a PyTorch user hands
  a model over: NCHW input, symbolic batch (``--dynamic-hw``: symbolic height/width too, so
  ``--input-size`` is needed), opset 17.
- ``models/two_head.keras``: the demo's trunk with two outputs: ``scores`` (the demo's 10
  class scores) and ``appearance`` (a regression head: mean brightness and the brightness
  centroid y, x of the model's input, each in [0, 1]), fitted by ridge regression on the
  calibration images' pooled features. The output names sort the other way round from
  their order, so a converter that orders outputs by name would swap them: the build must
  map them by name.
- ``models/demo.tflite``: the demo classifier as a float .tflite with float16 weights, the way
  MediaPipe and TF Hub publish models (``edgekit build`` converts it on its own graph).

All are made from ``demo.keras`` when asked, never committed: the demo model is retrained
from time to time and a copy would go stale. Each gets the demo's labels and preprocessing
beside it (``<stem>.labels.txt``, ``<stem>.preprocess.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo.keras"
CALIB = (ROOT / "calib" / "fashion", ROOT / "calib" / "frames")


def _sidecars(src: Path, dest: Path) -> None:
    """Copy the model's labels and preprocessing (those it has) beside ``dest``."""
    for suffix in (".labels.txt", ".preprocess.json"):
        # models/demo.onnx's sidecars are models/demo.keras' own files: nothing to copy
        if src.with_suffix(suffix).is_file() and src.with_suffix(suffix) != dest.with_suffix(suffix):
            shutil.copyfile(src.with_suffix(suffix), dest.with_suffix(suffix))


def export_onnx(model: Path = DEMO, out: Path = ROOT / "models" / "demo.onnx", dynamic_hw: bool = False,
                opset: int = 17) -> Path:
    """Export a Keras image model to an NCHW ONNX file with tf2onnx (batch symbolic)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    import tf2onnx

    net = keras.models.load_model(model, compile=False)
    h, w, c = net.inputs[0].shape[1:]
    spec = tf.TensorSpec((None, None, None, c) if dynamic_hw else (None, h, w, c), tf.float32, name="image")

    @tf.function(input_signature=[spec])
    def serve(image):
        return {"scores": net(image, training=False)}

    proto, _ = tf2onnx.convert.from_function(serve, input_signature=[spec], opset=opset, inputs_as_nchw=["image:0"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    tmp.write_bytes(proto.SerializeToString())
    os.replace(tmp, out)
    _sidecars(model, out)
    return out


def export_tflite(model: Path = DEMO, out: Path = ROOT / "models" / "demo.tflite") -> Path:
    """Export a Keras image model to a float .tflite with float16 weights, as MediaPipe and TF Hub
    publish theirs (static batch 1)."""
    import tempfile

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    net = keras.models.load_model(model, compile=False)
    with tempfile.TemporaryDirectory() as saved:
        net.export(saved, input_signature=[tf.TensorSpec((1, *net.inputs[0].shape[1:]), tf.float32)], verbose=False)
        conv = tf.lite.TFLiteConverter.from_saved_model(saved)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
        blob = conv.convert()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    tmp.write_bytes(blob)
    os.replace(tmp, out)
    _sidecars(model, out)
    return out


def _calibration_inputs(model: Path, count: int = 400) -> np.ndarray:
    """The demo's float inputs for the calibration images (its own preprocessing)."""
    from edgekit.imaging.image import IMAGE_SUFFIXES, InputSpec, Preprocessor, read_image

    pre = json.loads(model.with_suffix(".preprocess.json").read_text())
    pre = {k: tuple(v) if isinstance(v, list) else v for k, v in pre.items()}
    prep = Preprocessor(InputSpec(shape=(1, 32, 32, 1), **pre))
    files = sorted(p for d in CALIB for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)[:count]
    return np.concatenate([prep(read_image(p)) for p in files])


def appearance(x: np.ndarray) -> np.ndarray:
    """Regression targets per image: mean brightness, brightness centroid y and x (all in [0, 1])."""
    img = x[..., 0].astype(np.float64)
    total = img.sum(axis=(1, 2)) + 1e-6
    ys, xs = np.meshgrid(np.linspace(0, 1, img.shape[1]), np.linspace(0, 1, img.shape[2]), indexing="ij")
    return np.stack([img.mean(axis=(1, 2)), (img * ys).sum(axis=(1, 2)) / total,
                     (img * xs).sum(axis=(1, 2)) / total], axis=1).astype(np.float32)


def make_two_head(model: Path = DEMO, out: Path = ROOT / "models" / "two_head.keras") -> Path:
    """The demo trunk with a class head (``scores``) and a fitted regression head (``appearance``)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    net = keras.models.load_model(model, compile=False)
    pool = next(layer for layer in net.layers if isinstance(layer, keras.layers.GlobalAveragePooling2D))
    features = keras.Model(net.inputs[0], pool.output)
    x = _calibration_inputs(model)
    f = np.asarray(features(x, training=False), np.float64)
    y = appearance(x).astype(np.float64)
    # ridge regression on [features, 1]: closed form, deterministic, a second to fit
    a = np.hstack([f, np.ones((len(f), 1))])
    coef = np.linalg.solve(a.T @ a + 1e-3 * np.eye(a.shape[1]), a.T @ y)
    head = keras.layers.Dense(3, name="appearance")
    reg = head(pool.output)
    head.set_weights([coef[:-1].astype(np.float32), coef[-1].astype(np.float32)])
    two = keras.Model(net.inputs[0], [net.outputs[0], reg], name="two_head")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".part.keras")
    two.save(tmp)
    os.replace(tmp, out)
    _sidecars(model, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m scripts.bundled_models [--out-dir models] [--dynamic-hw]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEMO, help="the Keras demo model (default models/demo.keras)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "models", help="where to write (default models/)")
    parser.add_argument("--dynamic-hw", action="store_true", help="ONNX with symbolic height/width as well")
    args = parser.parse_args(argv)
    print(export_onnx(args.model, args.out_dir / "demo.onnx", args.dynamic_hw))
    print(make_two_head(args.model, args.out_dir / "two_head.keras"))
    print(export_tflite(args.model, args.out_dir / "demo.tflite"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
