"""Model architectures for the sign demo (Keras; host side only).

- ``anki``: the seed CNN from Anki's sign-language example (200x200x1 input, 27 classes).
  Its Flatten -> Dense(128) head holds ~17.3 M parameters, too big for the Edge TPU's
  ~8 MiB parameter cache (it streams from the host every inference).
- ``edge``: the same idea with a global-average-pooling head: ~50 k parameters, fully
  int8-friendly, fits the Edge TPU cache.
- ``resnet``: a small residual network for users with more data.
"""

from __future__ import annotations


def build_model(arch: str, input_shape: tuple[int, int, int], num_classes: int):
    """Return an uncompiled Keras model of architecture ``arch`` (anki, edge, resnet)."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape, name="image")
    if arch == "anki":
        x = layers.Conv2D(32, 3, activation="relu")(inputs)
        x = layers.MaxPooling2D(2)(x)
        x = layers.Conv2D(64, 3, activation="relu")(x)
        x = layers.MaxPooling2D(2)(x)
        x = layers.Conv2D(64, 3, activation="relu")(x)
        x = layers.Flatten()(x)
        x = layers.Dense(128, activation="relu")(x)
        x = layers.Dropout(0.5)(x)
    elif arch == "edge":
        x = inputs
        for filters, stride in ((16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (96, 2)):
            x = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
            x = layers.BatchNormalization()(x)
            x = layers.ReLU(max_value=6.0)(x)
        x = layers.GlobalAveragePooling2D()(x)
        x = layers.Dropout(0.2)(x)
    elif arch == "resnet":
        x = layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(inputs)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
        for filters in (32, 64, 128):
            stride = 1 if filters == 32 else 2
            shortcut = x
            y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
            y = layers.BatchNormalization()(y)
            y = layers.ReLU()(y)
            y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
            y = layers.BatchNormalization()(y)
            if stride != 1 or shortcut.shape[-1] != filters:
                shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
                shortcut = layers.BatchNormalization()(shortcut)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
        x = layers.GlobalAveragePooling2D()(x)
    else:
        raise ValueError(f"unknown architecture {arch!r} (anki, edge, resnet)")
    # float32 output even under mixed precision, so softmax stays numerically sound
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32", name="scores")(x)
    return keras.Model(inputs, outputs, name=f"signs_{arch}")
