"""Small real TFLite models for the tests, converted with the REAL ``tf.lite.TFLiteConverter``.

Each Keras model is exported as a SavedModel with a static ``(1, H, W, C)`` input
signature (so the batch dimension is static, as the Edge TPU needs), then converted
with ``TFLiteConverter.from_saved_model``; int8 variants use a representative dataset,
``TFLITE_BUILTINS_INT8`` and uint8 input/output, like ``edgekit build --target edgetpu``.

Conversion is cached per process (:func:`model_path`), so a test session pays for each
model once, whichever test module asks first. TensorFlow is imported only here.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

_CACHE: dict[str, Path] = {}
_DIR: list[Path] = []


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def convert(model, shape: tuple, int8: bool, samples: int = 4, signature: tuple | None = None) -> bytes:
    """Export ``model`` and convert it; ``signature`` overrides the exported input shape."""
    tf = _tf()
    with tempfile.TemporaryDirectory() as saved:
        model.export(saved, input_signature=[tf.TensorSpec(signature or shape, tf.float32)], verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(saved)
        if int8:
            rng = np.random.default_rng(0)

            def representative():
                for _ in range(samples):
                    yield [rng.random(shape, dtype=np.float32)]

            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = representative
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            converter.inference_input_type = tf.uint8
            converter.inference_output_type = tf.uint8
        return converter.convert()


def _small_cnn(channels: int = 1):
    import keras
    from keras import layers

    inp = keras.Input((32, 32, channels))
    x = layers.Conv2D(8, 3, activation="relu")(inp)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(16, 3, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(5, activation="softmax")(x))


def _gather_cnn():
    """GATHER (not in the Edge TPU op table) as the third op: the graph is cut there."""
    import keras
    from keras import layers

    tf = _tf()
    inp = keras.Input((32, 32, 3))
    x = layers.Conv2D(8, 3, activation="relu")(inp)
    x = layers.Lambda(lambda t: tf.gather(t, [0, 2, 4, 6, 1, 3, 5, 7], axis=-1))(x)
    x = layers.Conv2D(16, 3, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(5, activation="softmax")(x))


def _dilated_cnn():
    """A Conv2D with dilation 2 in y and 1 in x: Coral requires equal dilations."""
    import keras
    from keras import layers

    inp = keras.Input((32, 32, 1))
    x = layers.Conv2D(8, 3, dilation_rate=(2, 1), activation="relu")(inp)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(5, activation="softmax")(x))


def _dense_on_4d():
    """Dense applied to a 4-D tensor -> FULLY_CONNECTED with keep_num_dims (4-D output)."""
    import keras
    from keras import layers

    inp = keras.Input((8, 8, 4))
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    x = layers.Dense(6)(x)
    x = layers.Conv2D(8, 3)(x)
    return keras.Model(inp, layers.GlobalAveragePooling2D()(x))


def _anki():
    from robot.models import build_model

    return build_model("anki", (200, 200, 1), 27)  # random weights: only the graph matters


# name -> (keras builder, input shape, int8, representative samples, exported signature)
MODELS: dict[str, tuple[Callable, tuple, bool, int, tuple | None]] = {
    "small_int8": (_small_cnn, (1, 32, 32, 1), True, 4, None),
    "small_float": (_small_cnn, (1, 32, 32, 1), False, 0, None),
    "gather_int8": (_gather_cnn, (1, 32, 32, 3), True, 4, None),
    "dilated_int8": (_dilated_cnn, (1, 32, 32, 1), True, 4, None),
    "dense4d_int8": (_dense_on_4d, (1, 8, 8, 4), True, 4, None),
    "dynamic_int8": (_small_cnn, (1, 32, 32, 1), True, 4, (None, 32, 32, 1)),
    "batch2_int8": (_small_cnn, (2, 32, 32, 1), True, 4, None),
    # 17.3 M parameters; 2 samples keep the int8 calibration at a few seconds.
    "anki_int8": (_anki, (1, 200, 200, 1), True, 2, None),
}


def model_path(name: str, directory: Path | None = None) -> Path:
    """Convert model ``name`` once per process and return its ``.tflite`` path."""
    if name in _CACHE:
        return _CACHE[name]
    if not _DIR:
        _DIR.append(Path(directory) if directory else Path(tempfile.mkdtemp(prefix="edgekit-tflite-")))
    build, shape, int8, samples, signature = MODELS[name]
    path = _DIR[0] / f"{name}.tflite"
    path.write_bytes(convert(build(), shape, int8, samples, signature))
    _CACHE[name] = path
    return path
