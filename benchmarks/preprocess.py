"""Preprocessing a 640x360 camera frame: edgekit's Preprocessor vs a naive PIL version.

The naive version follows the seed robot example: ``image.convert('L')``, a centred
200x200 crop, a resize to the model input, ``np.array(image) / 255`` and a reshape. It
starts from a PIL image, as the Vector SDK delivers; edgekit starts from the numpy BGR
frame every other camera source delivers (a row with the PIL -> numpy conversion
included is printed too). The frame is a real photo (scikit-image's ``astronaut``),
scaled and cropped to 640x360. Calls alternate, p50 of each. Goal: ratio <= 0.3.

    python benchmarks/preprocess.py [--count 2000]
"""

from __future__ import annotations

import argparse
import sys
import time

import cv2
import numpy as np
from PIL import Image

from edgekit.image import InputSpec, Preprocessor


def camera_frame() -> np.ndarray:
    """A 640x360 BGR frame cut from a real photo."""
    from skimage import data

    rgb = cv2.resize(data.astronaut(), (640, 640), interpolation=cv2.INTER_AREA)[140:500]
    return np.ascontiguousarray(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))


def naive(image: Image.Image, size: int) -> np.ndarray:
    """The seed example's preprocessing (PIL + numpy, float64)."""
    gray = image.convert("L")
    w, h = gray.size
    crop = gray.crop(((w - 200) // 2, (h - 200) // 2, (w + 200) // 2, (h + 200) // 2))
    if size != 200:
        crop = crop.resize((size, size))
    return (np.array(crop) / 255).reshape(1, size, size, 1)


def p50(fn, arg, samples: list[int]) -> None:
    t0 = time.perf_counter_ns()
    fn(arg)
    samples.append(time.perf_counter_ns() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000)
    args = ap.parse_args(argv)
    frame = camera_frame()
    pil = Image.fromarray(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    print(f"{'model input':<22}{'edgekit p50':>13}{'naive PIL p50':>15}{'ratio':>9}   edgekit path")
    for size, dtype in ((200, "float32"), (32, "float32"), (32, "uint8")):
        spec = InputSpec(shape=(1, size, size, 1), colour="gray", crop=(200, 200))
        if dtype == "uint8":
            spec = spec.with_quantization("uint8", 1 / 255, 0)
        pre = Preprocessor(spec)
        if size == 200:  # same pixels in, same numbers out (PIL and OpenCV share the BT.601 luma weights)
            diff = np.abs(pre(frame).astype(np.float64) - naive(pil, size)).max()
            assert diff <= 1.5 / 255, diff
        rows = {
            "from BGR frame": lambda f, p=pre: p(f),
            "incl. PIL->numpy": lambda im, p=pre: p(cv2.cvtColor(np.asarray(im), cv2.COLOR_RGB2BGR)),
        }
        for label, fn in rows.items():
            e, n = [], []
            arg = frame if label == "from BGR frame" else pil
            for i in range(args.count):
                order = ((fn, arg, e), (lambda im, s=size: naive(im, s), pil, n))
                for f, a, into in order if i % 2 == 0 else order[::-1]:
                    p50(f, a, into)
            pe, pn = np.percentile(e, 50) / 1e6, np.percentile(n, 50) / 1e6
            name = f"{size}x{size}x1 {dtype}"
            print(f"{name:<22}{pe:>10.4f} ms{pn:>12.4f} ms{pe / pn:>8.3f}x   {label}", flush=True)
    print("ratio = edgekit p50 / naive p50 on a 640x360 frame (goal <= 0.3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
