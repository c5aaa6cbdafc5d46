"""Models that divide the image by 255 themselves (a Keras ``Rescaling(1/255)`` as tf2onnx exports
it: a first Mul by 1/255 or Div by 255), written with onnx.helper in milliseconds, and folders of
one-colour images they classify.

The model scores ``softmax(8 * mean of each channel / 255 + (0, 0, 0.5))``: fed [0, 1] pixels and
divided again, every class scores about 1/3 and blue wins (issue 39's "green 0.340 red 0.338 blue
0.322"); fed 0-255, the bright channel scores over 0.98.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def rescale_onnx(path: Path, op: str = "Mul", factor: float = 1 / 255, constant_node: bool = False,
                 nchw: bool = False, big_weight: bool = False, gain: float = 8.0) -> Path:
    """``y = softmax(gain * mean_hw(x op factor) + (0, 0, 0.5))`` for a 16x16 RGB image (NHWC, or NCHW
    behind a Transpose). ``factor=1, gain=8/255``: the /255 folded into the weights, as TensorFlow's
    converter folds a Rescaling into the first convolution."""
    k = numpy_helper.from_array(np.array(factor, np.float32), "k")
    nodes = [helper.make_node("Constant", [], ["k"], value=k)] if constant_node else []
    x = "x"
    if nchw:
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 3, 1]))
        x = "xt"
    nodes += [helper.make_node(op, [x, "k"], ["s"], name="rescaling/mul"),
              helper.make_node("ReduceMean", ["s"], ["m"], axes=[1, 2], keepdims=0),
              helper.make_node("Mul", ["m", "gain"], ["g"]),
              helper.make_node("Add", ["g", "bias"], ["z"]),
              helper.make_node("Softmax", ["z"], ["y"], axis=1)]
    inits = [numpy_helper.from_array(np.array(gain, np.float32), "gain"),
             numpy_helper.from_array(np.array([0, 0, 0.5], np.float32), "bias")] + ([] if constant_node else [k])
    if big_weight:  # weights larger than any divisor are skipped unread
        inits.append(numpy_helper.from_array(np.zeros(50_000, np.float32), "unused"))
    shape = [1, 3, 16, 16] if nchw else [1, 16, 16, 3]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def colour_folder(parent: Path, colour: str = "green") -> Path:
    """``parent/colour/``: three 24x24 images, that channel bright, the others dark (000.png ... 002.png)."""
    from PIL import Image

    folder = parent / colour
    folder.mkdir()
    for i in range(3):
        img = np.zeros((24, 24, 3), np.uint8)
        img[..., ("red", "green", "blue").index(colour)] = 200 + i
        Image.fromarray(img).save(folder / f"{i:03d}.png")
    return folder
