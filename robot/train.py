"""Train a sign (or demo) classifier and write what ``edgekit build`` takes.

    python -m robot.train --data data/signs --arch edge --epochs 20 --out signs.keras
    python -m robot.train --data kaggle_dir --arch resnet --mixed-precision --out signs.keras
    python -m robot.train --data data/signs --arch edge --distill-from teacher.keras --out student.keras
    python -m robot.train --data fashion-mnist --background 12000 --arch edge --out models/demo.keras  # the demo

``--background N`` adds N "nothing held up" images (crops of real photos that install with
packages, and clutter: :mod:`robot.background`) to the class named ``background``, appended
as the last class when the data has none (the seed's 27-class layout ends with it).

Outputs ``<out>`` (Keras), ``<stem>.labels.txt`` and ``<stem>.preprocess.json`` (the input
preprocessing, which ``edgekit build`` reads so the device feeds the model exactly what it
was trained on). Training tensors are made by :class:`edgekit.imaging.image.Preprocessor`: the same
code the device runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from edgekit.errors import EdgekitError, print_error
from edgekit.imaging.image import InputSpec, Preprocessor
from edgekit.util.finite_json import strict_dumps
from robot.cli import parse, script_parser

# The seed robot pipeline: gray, a centred 200x200 window of Vector's 640x360 frame.
SEED_CROP = (200, 200)


def demo_spec(size: int, channels: int = 1) -> InputSpec:
    """The seed preprocessing at ``size x size`` model input, pixels scaled to [0, 1]."""
    return InputSpec(shape=(1, size, size, channels), colour="gray" if channels == 1 else "rgb",
                     crop=SEED_CROP, mean=(0.0,) * channels, std=(255.0,) * channels)


def to_tensors(frames, spec: InputSpec) -> np.ndarray:
    """Preprocess frames into one float32 batch with the device's code."""
    prep = Preprocessor(spec)
    return np.concatenate([prep(f) for f in frames], axis=0)


def load_data(source: str, limit: int | None, seed: int):
    """Frames, labels and class names from a dataset path or ``fashion-mnist``."""
    from robot import datasets

    if source == "fashion-mnist":
        images, labels, classes = datasets.load_fashion("train")
        frames, skipped = list(images), 0
    else:
        frames, labels, classes, skipped = datasets.load_any(source)
    if skipped:
        print(f"skipped {skipped} unreadable image(s)", file=sys.stderr)
    if limit and limit < len(frames):
        idx = np.random.default_rng(seed).permutation(len(frames))[:limit]
        frames, labels = [frames[i] for i in idx], labels[idx]
    return frames, np.asarray(labels), classes


def add_background(frames: list, labels: np.ndarray, classes: list[str], count: int, seed: int):
    """Append ``count`` generated background images to the ``background`` class (made last if new)."""
    from robot import background

    photos = background.training_photos()
    print(f"background: {count} images from {len(photos)} photos ({', '.join(sorted(photos))}) and clutter",
          file=sys.stderr)
    if "background" not in classes:
        classes = [*classes, "background"]
    extra = background.background_images(count, photos, np.random.default_rng(seed + 1))
    labels = np.concatenate([labels, np.full(len(extra), classes.index("background"), dtype=labels.dtype)])
    return [*frames, *extra], labels, classes


def soft_targets(teacher_path: str, x: np.ndarray, temperature: float) -> np.ndarray:
    """Teacher probabilities softened by ``temperature`` (knowledge distillation, Hinton et al.)."""
    import keras

    teacher = keras.models.load_model(teacher_path)
    probs = teacher.predict(x, batch_size=256, verbose=0).astype(np.float64)
    logits = np.log(np.clip(probs, 1e-8, 1.0)) / temperature
    logits -= logits.max(axis=1, keepdims=True)
    soft = np.exp(logits)
    return (soft / soft.sum(axis=1, keepdims=True)).astype(np.float32)


def train(args: argparse.Namespace) -> dict:
    """Train as the CLI describes; returns a summary dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from robot.models import build_model

    keras.utils.set_random_seed(args.seed)
    if args.mixed_precision:
        # The seed's flag: float16 compute, float32 weights; the output layer stays float32.
        keras.mixed_precision.set_global_policy("mixed_float16")
    frames, labels, classes = load_data(args.data, args.limit, args.seed)
    if args.background:
        frames, labels, classes = add_background(list(frames), labels, classes, args.background, args.seed)
    spec = demo_spec(args.input_size, args.channels)
    x = to_tensors(frames, spec)
    n_val = max(1, int(len(x) * args.val_split))
    order = np.random.default_rng(args.seed).permutation(len(x))
    val, tr = order[:n_val], order[n_val:]
    y = keras.utils.to_categorical(labels, len(classes)).astype(np.float32)
    if args.distill_from:
        soft = soft_targets(args.distill_from, x, args.temperature)
        # Blend hard labels with the teacher's softened distribution (alpha = weight of the hard labels).
        y = args.alpha * y + (1.0 - args.alpha) * soft
    model = build_model(args.arch, spec.shape[1:], len(classes))
    steps = args.epochs * int(np.ceil(len(tr) / args.batch_size))
    # Cosine decay to zero: the last epochs settle instead of bouncing (BatchNorm + Adam).
    schedule = keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=steps)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="categorical_crossentropy",
                  metrics=["accuracy"])
    keep_best = keras.callbacks.EarlyStopping(monitor="val_accuracy", patience=args.epochs,
                                              restore_best_weights=True)
    t0 = time.perf_counter()
    hist = model.fit(x[tr], y[tr], validation_data=(x[val], y[val]), epochs=args.epochs,
                     batch_size=args.batch_size, verbose=2 if args.verbose else 0, callbacks=[keep_best])
    seconds = time.perf_counter() - t0
    if args.mixed_precision:
        keras.mixed_precision.set_global_policy("float32")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.stem + ".tmp" + out.suffix)
    model.save(tmp)
    os.replace(tmp, out)  # never leave a half-written model under the real name
    stem = out.with_suffix("")
    Path(f"{stem}.labels.txt").write_text("\n".join(classes) + "\n")
    pre = {k: v for k, v in spec.to_dict().items() if k in ("colour", "crop", "resize", "interpolation", "mean", "std")}
    Path(f"{stem}.preprocess.json").write_text(json.dumps(pre, indent=2) + "\n")
    summary = {
        "out": str(out), "arch": args.arch, "params": int(model.count_params()), "train": int(len(tr)),
        "val": int(len(val)), "val_accuracy": float(max(hist.history["val_accuracy"])),
        "seconds": round(seconds, 1), "classes": len(classes),
    }
    return summary


EXAMPLES = [
    "python -m robot.train --data data/signs --out models/signs.keras",
    "python -m robot.train --data data/signs --out models/signs.keras --background 2000 --epochs 30 -v",
]
"""Real command lines, shown at the end of --help (tests/test_cli_grammar.py parses each)."""


def build_parser() -> argparse.ArgumentParser:
    p = script_parser("train", __doc__, EXAMPLES)
    p.add_argument("--data", required=True,
                   help="ImageFolder dir, Kaggle Vector dir, Sign-Language-MNIST .csv, or 'fashion-mnist'")
    p.add_argument("--arch", choices=["anki", "edge", "resnet"], default="edge")
    p.add_argument("--out", required=True, help="output .keras file")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--input-size", type=int, default=64, help="model input is SIZE x SIZE (the seed used 200)")
    p.add_argument("--channels", type=int, choices=[1, 3], default=1)
    p.add_argument("--limit", type=int, help="use at most this many training images")
    p.add_argument("--background", type=int, default=0, metavar="N",
                   help="add N background images (package photos + clutter) as the class 'background'")
    p.add_argument("--val-split", type=float, default=0.1)
    p.add_argument("--mixed-precision", action="store_true", help="mixed_float16 compute (fast on GPUs)")
    p.add_argument("--distill-from", help="teacher .keras model for knowledge distillation")
    p.add_argument("--temperature", type=float, default=4.0)
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the hard labels when distilling")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    try:
        summary = train(args)
    except EdgekitError as exc:
        return print_error("robot.train", exc)
    print(strict_dumps(summary))  # the summary line scripts read: finite JSON (a NaN loss is null)
    return 0


if __name__ == "__main__":
    sys.exit(main())
