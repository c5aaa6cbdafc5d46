"""Train the bundled demo detector (``make detector``) and export it to Keras and ONNX.

The model is a small anchor-free YOLO-style detector for the four shapes of
:mod:`scripts.detector_data`: a plain Conv-BatchNorm-ReLU backbone (BatchNorm folds into the
convolutions, ReLU keeps int8 ranges tight), a two-level neck (strides 8 and 16, 20x20 +
10x10 cells at 160x160) and one 1x1 head per level. The decode is *in the graph*, so the
model's one output is what an Ultralytics YOLOv8 export gives: ``[1, 4 + nc, N]``, channels
first, ``cx, cy, w, h`` then one sigmoid score per class, N = 500 cells. Unlike an Ultralytics
export the boxes are normalised to [0, 1] of the input, not pixels: boxes and scores then
share one range, so per-tensor int8 keeps both (pixel boxes beside [0, 1] scores in one
tensor is the ultralytics/yolov5#10164 trap: the scores get two or three int8 steps).

Per cell ``p = sigmoid(raw)``; ``cx = (gx + 4 p - 1.5) * stride / 160`` (a centre up to two
cells away), ``w = (2 p)^2 * prior / 160`` (YOLOv5's bounded size, prior = 2.5 strides), scores
= ``p``. The decode is ``p * (A + p * C) + B`` with constant per-channel A, C and a per-cell
grid B: Mul and Add only. The channels-first layout is made with Split, Reshape and
Concatenation (no Transpose, which the Edge TPU compiler's table does not list), so every op
maps to the Edge TPU.

Training: cells within one stride of a box's centre, on the level its size belongs to, are
positives (YOLOv5-style several positives per box); box loss 1 - CIoU, class loss binary
cross-entropy against IoU-valued targets (a score that says how good the box is, as YOLOv8's
task-aligned targets do, which mAP over IoU 0.5-0.95 rewards). Images are generated in
memory (never written), preprocessed by edgekit's own :class:`~edgekit.imaging.image.Preprocessor`
(letterbox, RGB, /255), so training sees exactly what the device feeds.

``python -m scripts.train_detector`` writes models/detector.{keras,onnx,labels.txt,
preprocess.json} and prints the float mAP of both files on eval/detect (pycocotools).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from scripts import detector_data as data

ROOT = Path(__file__).resolve().parents[1]
INPUT = 160
STRIDES = (8, 16)
PRIOR = 2.5  # box size prior per level, in strides: w = (2 p)^2 * PRIOR * stride, at most 4x that
LEVEL_SPLIT = (24.0, 36.0)  # boxes whose larger side (input px) is <= 36 train stride 8, >= 24 stride 16
PREPROCESS = {"colour": "rgb", "resize": "letterbox", "interpolation": "area", "mean": [0.0], "std": [255.0]}
NUM_CELLS = sum((INPUT // s) ** 2 for s in STRIDES)


def input_spec():
    """The model's preprocessing as edgekit's InputSpec (NHWC float, 160x160 RGB letterbox)."""
    from edgekit.imaging.image import InputSpec

    pre = {k: tuple(v) if isinstance(v, list) else v for k, v in PREPROCESS.items()}
    return InputSpec(shape=(1, INPUT, INPUT, 3), **pre)


def cell_table() -> np.ndarray:
    """``[N, 3]``: per output cell its centre x, y (input px) and stride, in the output's order."""
    rows = []
    for s in STRIDES:
        g = INPUT // s
        gy, gx = np.mgrid[0:g, 0:g]
        rows.append(np.stack([(gx.ravel() + 0.5) * s, (gy.ravel() + 0.5) * s, np.full(g * g, s)], 1))
    return np.concatenate(rows).astype(np.float32)


def targets(boxes: np.ndarray, classes: np.ndarray, nc: int, cells: np.ndarray) -> np.ndarray:
    """``[N, 4 + nc + 1]`` training targets for one image.

    ``boxes``: ``[M, 4]`` xyxy in input pixels. Per cell: the assigned box (cx, cy, w, h
    normalised), its class one-hot and a positive flag; a cell claimed by two boxes keeps the
    smaller one.
    """
    out = np.zeros((len(cells), 5 + nc), np.float32)
    if not len(boxes):
        return out
    wh = boxes[:, 2:] - boxes[:, :2]
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2
    side = wh.max(1)
    area = wh.prod(1)
    stride = cells[:, 2:3]
    near = np.all(np.abs(cells[:, None, :2] - centre[None]) <= stride[..., None] * 1.0, axis=2)  # [N, M]
    small = (side <= LEVEL_SPLIT[1])[None] & (stride == STRIDES[0])
    large = (side >= LEVEL_SPLIT[0])[None] & (stride == STRIDES[1])
    ok = near & (small | large)
    cost = np.where(ok, area[None], np.inf)
    best = cost.argmin(1)
    pos = np.isfinite(cost.min(1))
    b = best[pos]
    out[pos, :2] = centre[b] / INPUT
    out[pos, 2:4] = wh[b] / INPUT
    out[pos, 4 + classes[b]] = 1.0
    out[pos, -1] = 1.0
    return out


def letterbox_boxes(sc: data.Scene) -> np.ndarray:
    """A scene's COCO boxes as xyxy pixels of the letterboxed model input."""
    from edgekit.imaging.imgops import letterbox_window

    h, w = sc.image.shape[:2]
    top, left, nh, nw = letterbox_window(h, w, INPUT, INPUT)
    sx, sy = nw / w, nh / h
    b = sc.boxes
    return np.stack([b[:, 0] * sx + left, b[:, 1] * sy + top, (b[:, 0] + b[:, 2]) * sx + left,
                     (b[:, 1] + b[:, 3]) * sy + top], 1).astype(np.float32)


def make_set(seed: int, count: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` training scenes as (uint8 model inputs ``[n, 160, 160, 3]``, targets ``[n, N, 5 + nc]``)."""
    from edgekit.imaging.image import Preprocessor

    prep = Preprocessor(input_spec())  # .shaped(): the letterboxed RGB pixels, kept uint8 (4x less memory)
    cells = cell_table()
    nc = len(data.CLASSES)
    x = np.empty((count, INPUT, INPUT, 3), np.uint8)
    y = np.empty((count, NUM_CELLS, 5 + nc), np.float32)
    for i, sc in enumerate(data.scenes(seed, count, data.TRAIN_PHOTOS, start)):
        x[i] = prep.shaped(sc.image)
        y[i] = targets(letterbox_boxes(sc), sc.classes, nc, cells)
    return x, y


def _make_set_part(args: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    return make_set(*args)


def make_set_parallel(seed: int, count: int, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`make_set` split over ``workers`` processes (the same images as one process makes)."""
    if workers <= 1:
        return make_set(seed, count)
    from concurrent.futures import ProcessPoolExecutor

    bounds = np.linspace(0, count, workers + 1).astype(int)
    jobs = [(seed, int(b - a), int(a)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    with ProcessPoolExecutor(workers) as pool:
        parts = list(pool.map(_make_set_part, jobs))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def decode_constants(nc: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per level ``(A, C, B)`` of ``out = p * (A + p * C) + B`` (see the module docstring)."""
    consts = []
    for s in STRIDES:
        g = INPUT // s
        a = np.zeros((1, 1, 1, 4 + nc), np.float32)
        c = np.zeros_like(a)
        a[..., 0:2] = 4 * s / INPUT
        c[..., 2:4] = 4 * PRIOR * s / INPUT
        a[..., 4:] = 1.0
        gy, gx = np.mgrid[0:g, 0:g].astype(np.float32)
        b = np.zeros((1, g, g, 4 + nc), np.float32)
        b[0, :, :, 0] = (gx - 1.5) * s / INPUT
        b[0, :, :, 1] = (gy - 1.5) * s / INPUT
        consts.append((a, c, b))
    return consts


def build_model(nc: int = len(data.CLASSES), width: int = 32):
    """The detector: ``[1, 160, 160, 3]`` in [0, 1] -> ``[1, 4 + nc, 500]`` (YOLOv8 layout, normalised boxes)."""
    import keras
    from keras import layers, ops

    def cbr(x, filters, kernel=3, stride=1):
        x = layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x)

    w = width
    inp = keras.Input((INPUT, INPUT, 3), name="image")
    x = cbr(inp, w // 2, 3, 2)  # 80
    x = cbr(x, w, 3, 2)  # 40
    x = cbr(x, w)
    x = cbr(x, 2 * w, 3, 2)  # 20
    c3 = cbr(x, 2 * w)
    x = cbr(c3, 3 * w, 3, 2)  # 10
    x = cbr(x, 3 * w)
    c4 = cbr(x, 3 * w)
    up = layers.Resizing(INPUT // STRIDES[0], INPUT // STRIDES[0], interpolation="nearest")(cbr(c4, 2 * w, 1))
    p3 = cbr(cbr(layers.Concatenate()([c3, up]), 2 * w, 1), 2 * w)
    p4 = cbr(c4, 3 * w)
    levels = []
    for feat, (a, c, b) in zip((p3, p4), decode_constants(nc), strict=True):
        raw = layers.Conv2D(4 + nc, 1)(feat)
        p = layers.Activation("sigmoid")(raw)
        out = ops.add(ops.multiply(p, ops.add(ops.multiply(p, c), a)), b)
        g = out.shape[1]
        # channels first without a Transpose: split the channels, flatten each, stack them
        levels.append(ops.concatenate([ops.reshape(t, (-1, 1, g * g)) for t in ops.split(out, 4 + nc, axis=-1)],
                                      axis=1))
    return keras.Model(inp, layers.Concatenate(axis=2, name="output0")(levels), name="detector")


def _iou(pred, true, complete: bool):
    """IoU (``complete``: CIoU, Zheng et al. 2020) of ``[..., 4]`` cx, cy, w, h boxes."""
    import math

    import tensorflow as tf

    p1, p2 = pred[..., :2] - pred[..., 2:4] / 2, pred[..., :2] + pred[..., 2:4] / 2
    t1, t2 = true[..., :2] - true[..., 2:4] / 2, true[..., :2] + true[..., 2:4] / 2
    inter_wh = tf.maximum(tf.minimum(p2, t2) - tf.maximum(p1, t1), 0.0)
    inter = inter_wh[..., 0] * inter_wh[..., 1]
    union = pred[..., 2] * pred[..., 3] + true[..., 2] * true[..., 3] - inter + 1e-9
    iou = inter / union
    if not complete:
        return iou
    enclose = tf.maximum(p2, t2) - tf.minimum(p1, t1)
    diag = tf.reduce_sum(enclose**2, -1) + 1e-9
    dist = tf.reduce_sum((pred[..., :2] - true[..., :2]) ** 2, -1)
    angle = tf.atan(true[..., 2] / (true[..., 3] + 1e-9)) - tf.atan(pred[..., 2] / (pred[..., 3] + 1e-9))
    v = (4 / math.pi**2) * angle**2
    alpha = tf.stop_gradient(v / (1 - iou + v + 1e-9))
    return iou - dist / diag - alpha * v


def detection_loss(nc: int, box_gain: float = 5.0):
    """The training loss on the model's ``[B, 4 + nc, N]`` output against :func:`targets`."""
    import tensorflow as tf

    def loss(y_true, y_pred):
        pred = tf.transpose(y_pred, [0, 2, 1])
        box_t, onehot, pos = y_true[..., :4], y_true[..., 4 : 4 + nc], y_true[..., -1]
        box_p = pred[..., :4]
        scores = tf.clip_by_value(pred[..., 4:], 1e-6, 1 - 1e-6)
        npos = tf.maximum(tf.reduce_sum(pos), 1.0)
        box_loss = tf.reduce_sum(pos * (1 - _iou(box_p, box_t, True))) / npos
        quality = tf.stop_gradient(tf.clip_by_value(_iou(box_p, box_t, False), 0.0, 1.0))
        t = onehot * quality[..., None]
        bce = -(t * tf.math.log(scores) + (1 - t) * tf.math.log(1 - scores))
        return box_gain * box_loss + tf.reduce_sum(bce) / npos

    return loss


def train(x: np.ndarray, y: np.ndarray, epochs: int, batch: int = 32, lr: float = 3e-3, width: int = 32,
          seed: int = 0):
    """Fit :func:`build_model` on uint8 inputs ``x`` and targets ``y``; the trained Keras model."""
    import keras

    keras.utils.set_random_seed(seed)
    nc = len(data.CLASSES)

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.order = np.random.default_rng(seed).permutation(len(x))

        def __len__(self):
            return len(x) // batch

        def __getitem__(self, i):
            idx = np.sort(self.order[i * batch : (i + 1) * batch])
            return x[idx].astype(np.float32) / 255.0, y[idx]

        def on_epoch_end(self):
            self.order = np.random.default_rng(seed + len(self.order)).permutation(len(x))

    model = build_model(nc, width)
    steps = epochs * (len(x) // batch)
    schedule = keras.optimizers.schedules.CosineDecay(lr / 10, steps, alpha=0.02, warmup_target=lr,
                                                      warmup_steps=min(300, steps // 10))
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss=detection_loss(nc), jit_compile=False)
    model.fit(Batches(), epochs=epochs, verbose=2)
    return model


class KerasRuntime:
    """The float Keras model behind the runtime contract edgekit's heads read (``input_spec``,
    ``output_details``, ``output_quantization``, ``infer``): the real detect head decodes it."""

    def __init__(self, model):
        self.model = model
        self.input_spec = input_spec()
        self.output_quantization = [None]

    def output_details(self) -> list[dict]:
        return [{"name": "output0", "shape": [1, *self.model.output_shape[1:]]}]

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(self.model(tensor, training=False))]

    def close(self) -> None:
        pass


def coco_results(runtime, eval_dir: Path, labels: list[str]) -> list[dict]:
    """Detections of ``runtime`` on every image of the COCO set in ``eval_dir`` (pycocotools' result format),
    through edgekit's Preprocessor and detect head (score threshold 0.001, 100 per image, as COCO scores)."""
    from edgekit.heads.table import make_decoder
    from edgekit.imaging.image import Preprocessor, read_image

    ann = json.loads((eval_dir / "annotations.json").read_text())
    prep = Preprocessor(runtime.input_spec)
    decode = make_decoder("detect", labels, runtime, score_threshold=0.001, max_detections=100)
    found = []
    for img in ann["images"]:
        frame = read_image(eval_dir / img["file_name"])
        dets = decode(runtime.infer(prep(frame)), frame_shape=frame.shape)
        for d in dets.detections:
            x1, y1, x2, y2 = d.box
            found.append({"image_id": img["id"], "category_id": d.index + 1, "score": d.score,
                          "bbox": [x1, y1, x2 - x1, y2 - y1]})
    return found


def coco_map(runtime, eval_dir: Path, labels: list[str]) -> tuple[float, float]:
    """(mAP@[.5:.95], mAP@.5) of ``runtime`` on ``eval_dir`` with pycocotools."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    found = coco_results(runtime, eval_dir, labels)
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(eval_dir / "annotations.json"))
        if not found:
            return 0.0, 0.0
        ev = COCOeval(gt, gt.loadRes(found), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[0]), float(ev.stats[1])


def onnx_runtime(path: Path):
    """models/detector.onnx on edgekit's ONNX Runtime adapter, with the detector's preprocessing (NCHW)."""
    from edgekit.imaging.image import InputSpec
    from edgekit.runtime.onnxrt import OnnxRuntime

    spec = InputSpec.from_dict({**input_spec().to_dict(), "shape": [1, 3, INPUT, INPUT], "layout": "NCHW"})
    return OnnxRuntime(path, input_spec=spec, providers=["cpu"])


def export(model, out: Path) -> list[Path]:
    """Write ``out`` (.keras), its ONNX twin (tf2onnx, NCHW input like a PyTorch export), labels
    and preprocessing; each file through a temporary name."""
    import keras
    import tensorflow as tf
    import tf2onnx

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".part.keras")
    # the same layers in an uncompiled model: no optimizer state in the file (a third of the size);
    # clone_model would copy the compile config too, and fail on the custom loss function
    plain = keras.Model(model.inputs, model.outputs, name=model.name)
    plain.save(tmp)
    os.replace(tmp, out)
    spec = tf.TensorSpec((None, INPUT, INPUT, 3), tf.float32, name="images")

    @tf.function(input_signature=[spec])
    def serve(images):
        return {"output0": model(images, training=False)}

    proto, _ = tf2onnx.convert.from_function(serve, input_signature=[spec], opset=17, inputs_as_nchw=["images:0"])
    onnx_path = out.with_suffix(".onnx")
    files = {onnx_path: proto.SerializeToString(),
             out.with_suffix(".labels.txt"): ("\n".join(data.CLASSES) + "\n").encode(),
             out.with_suffix(".preprocess.json"): (json.dumps(PREPROCESS, indent=2) + "\n").encode()}
    for path, blob in files.items():
        part = path.with_name(path.name + ".part")
        part.write_bytes(blob)
        os.replace(part, path)
    return [out, *files]


def main(argv: list[str] | None = None) -> int:
    """``python -m scripts.train_detector [--images N] [--epochs E]``: train, export, report float mAP."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=8000, help="training scenes generated in memory (default 8000)")
    ap.add_argument("--epochs", type=int, default=15, help="passes over them (default 15)")
    ap.add_argument("--width", type=int, default=32, help="channels of the first full-resolution stage (default 32)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes generating scenes")
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "detector.keras")
    ap.add_argument("--eval", type=Path, default=ROOT / "eval" / "detect", help="COCO set for the float mAP")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    x, y = make_set_parallel(data.TRAIN_SEED, args.images, args.workers)
    t1 = time.perf_counter()
    print(f"{len(x)} training scenes in {t1 - t0:.0f} s; {y[..., -1].sum(1).mean():.1f} positive cells per image")
    model = train(x, y, args.epochs, width=args.width)
    t2 = time.perf_counter()
    print(f"trained in {t2 - t1:.0f} s ({args.epochs} epochs)")
    for path in export(model, args.out):
        print("wrote", path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    labels = list(data.CLASSES)
    keras_map = coco_map(KerasRuntime(model), args.eval, labels)
    onnx_map = coco_map(onnx_runtime(args.out.with_suffix(".onnx")), args.eval, labels)
    print(f"float mAP@[.5:.95] / mAP@.5 on {args.eval.name}: Keras {keras_map[0]:.3f} / {keras_map[1]:.3f}, "
          f"ONNX {onnx_map[0]:.3f} / {onnx_map[1]:.3f}; {time.perf_counter() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
