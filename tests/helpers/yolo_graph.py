"""A small float TFLite graph shaped like an onnx2tf-converted YOLOv8 export, for the int8
rewrite tests: conv, SiLU, a head whose ``[1, 4 + nc, N]`` output holds pixel boxes (decoded from
corners as YOLOv8's dist2bbox does, times each anchor's stride) beside sigmoid scores."""

from __future__ import annotations

import numpy as np


def yolo_tflite(size: int = 32, nc: int = 2, seed: int = 0, c2f: bool = False) -> bytes:
    """The float TFLite model ``x [1, size, size, 3]`` -> ``[1, 4 + nc, size * size]``; ``c2f`` adds a
    C2f-style split and concatenation done in NCHW between transposes, then a second conv, as onnx2tf
    leaves them."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def w(*shape):
        return tf.constant(rng.normal(0, 0.4, shape).astype(np.float32))

    w1 = w(1, 1, 3, 8)
    w2 = w(1, 1, 8, 8) if c2f else None  # drawn in this order: the same weights as before
    wb, ws = w(1, 1, 8, 4), w(1, 1, 8, nc)
    stride = np.repeat(np.array([1.0, 2.0], np.float32), size * size // 2)[None]
    centres = (np.stack(np.meshgrid(np.arange(size), np.arange(size)), 0).reshape(2, -1) + 0.5).astype(np.float32)
    anchors = tf.constant((centres / stride)[None])

    @tf.function(input_signature=[tf.TensorSpec([1, size, size, 3], tf.float32)])
    def f(x):
        y = tf.nn.silu(tf.nn.conv2d(x, w1, 1, "SAME"))
        if c2f:
            nchw = [tf.transpose(y[..., :4], [0, 3, 1, 2]), tf.transpose(y[..., 4:], [0, 3, 1, 2])]
            y = tf.nn.silu(tf.nn.conv2d(tf.transpose(tf.concat(nchw, 1), [0, 2, 3, 1]), w2, 1, "SAME"))
        box = tf.reshape(tf.transpose(tf.nn.conv2d(y, wb, 1, "SAME"), [0, 3, 1, 2]), [1, 4, size * size])
        score = tf.reshape(tf.transpose(tf.nn.conv2d(y, ws, 1, "SAME"), [0, 3, 1, 2]), [1, nc, size * size])
        d = tf.sigmoid(box) * 4.0
        x1y1, x2y2 = anchors - d[:, :2], anchors + d[:, 2:]
        box = tf.concat([(x1y1 + x2y2) * 0.5, x2y2 - x1y1], 1) * stride
        return tf.concat([box, tf.sigmoid(score)], 1)

    return tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()


def images(n: int = 4, size: int = 32, seed: int = 1) -> list[np.ndarray]:
    """``n`` random float input tensors ``[1, size, size, 3]`` in [0, 1]."""
    rng = np.random.default_rng(seed)
    return [rng.random((1, size, size, 3), dtype=np.float32) for _ in range(n)]


def run(blob: bytes, x: np.ndarray) -> np.ndarray:
    """The float model's one output for ``x``."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=blob)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return np.array(interp.get_tensor(interp.get_output_details()[0]["index"]), np.float32)
