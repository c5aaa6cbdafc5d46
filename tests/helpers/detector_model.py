"""A tiny real detector for tests, made with onnx.helper (no TensorFlow) and run by ONNX Runtime.

The model has the YOLOv8 output layout ``[1, 4 + nc, N]`` with two classes and two fixed
candidate boxes: ``cat`` on the left half of the input, ``dog`` on the right half. Each box's
class score is the mean brightness of its half of the input (0..1), so what is detected
depends on the frame: a frame whose left half is bright shows a cat there, a dark frame
shows nothing. :func:`detector_bundle` wraps it in a hand-written bundle with
``"task": "detect"`` and a letterbox input (320x240 frames map onto 64x64 with 8 px bars).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.bundle import BundleWriter
from edgekit.imaging.image import InputSpec

LABELS = ["cat", "dog"]
SIZE = 64  # input side
SPEC = InputSpec(shape=(1, 3, SIZE, SIZE), layout="NCHW", colour="rgb", resize="letterbox",
                 mean=(0.0,), std=(255.0,))
# candidate boxes (cx, cy, w, h) in input pixels: left half -> cat, right half -> dog
BOXES = [(16.0, 32.0, 24.0, 32.0), (48.0, 32.0, 24.0, 32.0)]
FRAME_W, FRAME_H = 320, 240


def onnx_detector(path: Path, spare: int = 0) -> Path:
    """Write the two-box YOLOv8-layout detector to ``path`` (opset 13); ``spare`` more candidates
    that never score (so N need not equal the class count)."""
    import onnx
    from onnx import TensorProto, helper

    n_boxes = 2 + spare
    half = np.zeros((1, 1, SIZE, SIZE), np.float32)
    half[..., : SIZE // 2] = 2.0  # ReduceMean of x * mask = mean over the left half
    base = np.zeros((1, 4 + len(LABELS), n_boxes), np.float32)
    for n, box in enumerate(BOXES):
        base[0, :4, n] = box
    pick_cat = np.zeros_like(base)
    pick_cat[0, 4, 0] = 1.0
    pick_dog = np.zeros_like(base)
    pick_dog[0, 5, 1] = 1.0

    def const(name: str, a: np.ndarray):
        return helper.make_tensor(name, TensorProto.FLOAT, a.shape, a.reshape(-1).tolist())

    nodes = [
        helper.make_node("Mul", ["x", "left_mask"], ["xl"]),
        helper.make_node("Mul", ["x", "right_mask"], ["xr"]),
        helper.make_node("ReduceMean", ["xl"], ["ml"], keepdims=0),
        helper.make_node("ReduceMean", ["xr"], ["mr"], keepdims=0),
        helper.make_node("Mul", ["ml", "pick_cat"], ["sc"]),
        helper.make_node("Mul", ["mr", "pick_dog"], ["sd"]),
        helper.make_node("Add", ["base", "sc"], ["y0"]),
        helper.make_node("Add", ["y0", "sd"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "two_box_detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4 + len(LABELS), n_boxes])],
        [const("left_mask", half), const("right_mask", 2.0 - half), const("base", base),
         const("pick_cat", pick_cat), const("pick_dog", pick_dog)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what onnxruntime of every supported version loads
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def detector_bundle(dest: Path, spare: int = 0) -> Path:
    """A ``detect`` bundle around :func:`onnx_detector`, written as edgekit build would."""
    work = dest.parent / f".{dest.name}-model"
    work.mkdir(parents=True, exist_ok=True)
    model = onnx_detector(work / "model.onnx", spare)
    with BundleWriter(dest) as w:
        (w.dir / "model.onnx").write_bytes(model.read_bytes())
        (w.dir / "labels.txt").write_text("\n".join(LABELS) + "\n")
        w.commit({
            "name": "twobox", "target": "cpu", "task": "detect", "default_model": "fp32",
            "models": [{"name": "fp32", "file": "model.onnx", "format": "onnx", "precision": "fp32",
                        "input": SPEC.to_dict(), "outputs": [{"shape": [1, 6, 2 + spare], "dtype": "float32"}],
                        "task_options": {"layout": "yolo", "score_threshold": 0.3}}],
            "labels": "labels.txt",
            "runtime": {"adapter": "edgekit.runtime.onnxrt:OnnxRuntime", "options": {"providers": ["cpu"]}},
        })
    return dest


def scene(left: bool, right: bool, seed: int = 0) -> np.ndarray:
    """A 320x240 BGR frame: dark textured background, the left/right half bright when asked."""
    rng = np.random.default_rng(seed)
    frame = rng.integers(0, 25, (FRAME_H, FRAME_W, 3), dtype=np.uint8)
    if left:
        frame[:, : FRAME_W // 2] = 220
    if right:
        frame[:, FRAME_W // 2:] = 220
    return frame


def expected_box(n: int) -> tuple[float, float, float, float]:
    """Where candidate ``n`` lands on a 320x240 frame (letterbox 0.2 scale, 8 px bars top and bottom)."""
    cx, cy, w, h = BOXES[n]
    scale, pad = FRAME_W / SIZE, (SIZE - FRAME_H * SIZE / FRAME_W) / 2
    return ((cx - w / 2) * scale, (cy - h / 2 - pad) * scale, (cx + w / 2) * scale, (cy + h / 2 - pad) * scale)
