"""A small float TFLite graph shaped like MediaPipe's SSD detectors (BlazeFace, the pose detector),
for the clamp tests: two feature maps, each with a classifier and a regressor CONV_2D, reshaped
to ``[1, anchors, k]`` and concatenated into ``regressors [1, N, 4]`` and ``classificators
[1, N, 1]``. The second map's classifier has a bias of -250, as BlazeFace's logits reach about
-266 on frames without a face: clamped to +-16 in the graph (builders/int8/recipe.py), that
CONV_2D takes the clamp's int8 range through RESHAPE and CONCATENATION."""

from __future__ import annotations

import numpy as np

SIZE = 8
ANCHORS = SIZE * SIZE + (SIZE // 2) ** 2
"""Anchors: one per cell of the 8x8 map and of the 4x4 map."""


def ssd_tflite(seed: int = 0) -> bytes:
    """The float model ``x [1, 8, 8, 3]`` -> ``regressors [1, 80, 4]``, ``classificators [1, 80, 1]``."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def w(*shape):
        return tf.constant(rng.normal(0, 0.5, shape).astype(np.float32))

    w1, c8, c16, r8, r16 = w(1, 1, 3, 8), w(1, 1, 8, 1), w(1, 1, 8, 1), w(1, 1, 8, 4), w(1, 1, 8, 4)

    @tf.function(input_signature=[tf.TensorSpec([1, SIZE, SIZE, 3], tf.float32)])
    def f(x):
        fine = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
        coarse = tf.nn.max_pool2d(fine, 2, 2, "VALID")
        cls = [tf.reshape(tf.nn.conv2d(fine, c8, 1, "SAME") + 1.0, [1, -1, 1]),
               tf.reshape(tf.nn.conv2d(coarse, c16, 1, "SAME") * 10.0 - 250.0, [1, -1, 1])]
        reg = [tf.reshape(tf.nn.conv2d(m, k, 1, "SAME") * 8.0, [1, -1, 4]) for m, k in ((fine, r8), (coarse, r16))]
        return {"regressors": tf.concat(reg, 1), "classificators": tf.concat(cls, 1)}

    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def images(n: int = 16, seed: int = 1) -> np.ndarray:
    """``n`` random input tensors ``[8, 8, 3]`` in [0, 1] (no batch axis, as calibration streams them)."""
    return np.random.default_rng(seed).random((n, SIZE, SIZE, 3), dtype=np.float32)


def output_position(blob: bytes, size: int) -> int:
    """Where the output of ``size`` values lies among the model's outputs (the converter's order)."""
    from ai_edge_litert.interpreter import Interpreter

    sizes = [int(np.prod(d["shape"])) for d in Interpreter(model_content=blob).get_output_details()]
    return sizes.index(size)
