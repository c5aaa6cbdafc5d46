"""Preprocessing a 640x360 camera frame: edgekit's Preprocessor vs a naive PIL version.

The naive version follows the seed robot example: ``image.convert('L')``, a centred
200x200 crop, a resize to the model input, ``np.array(image) / 255`` and a reshape. It
starts from a PIL image, as the Vector SDK delivers. Rows, each against that naive pipeline
on the same input:

- ``BGR frame``: edgekit's Preprocessor on the numpy BGR frame every other camera delivers.
- ``Vector JPEG``: both start from the image as the SDK hands it over, opened lazily on the
  received JPEG; the naive one decodes the whole frame to RGB, edgekit's VectorSource
  (``prepare=``) decodes it straight to gray (``edgekit.vector.window``), then crops.
  Decoding is counted on both sides.
- ``Vector decoded PIL``: both start from an already decoded PIL image (the SDK's annotator
  decodes frames on its own thread unless switched off); edgekit crops with PIL, then converts.
- ``whole PIL->numpy``: the old Vector path (the whole frame to numpy BGR, then preprocess).

The frame is a real photo (scikit-image's ``astronaut``) scaled and cropped to 640x360, JPEG
quality 90 (``--quality``) for the Vector rows. Calls alternate, p50 of each. Goals: Vector <= 0.3, BGR <= 0.2.

    python benchmarks/preprocess.py [--count 2000] [--quality 90]
"""

from __future__ import annotations

import argparse
import io
import sys
import time

import cv2
import numpy as np
from goals import Goals
from PIL import Image

from edgekit.imaging.image import InputSpec, Preprocessor
from edgekit.vector.window import model_window


def camera_frame() -> np.ndarray:
    """A 640x360 BGR frame cut from a real photo."""
    from skimage import data

    rgb = cv2.resize(data.astronaut(), (640, 640), interpolation=cv2.INTER_AREA)[140:500]
    return np.ascontiguousarray(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))


def naive_pipeline(image: Image.Image, size: int) -> np.ndarray:
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


def lazy(jpeg: bytes) -> Image.Image:
    """What the SDK hands over: ``Image.open`` on the received bytes (only the header is read)."""
    return Image.open(io.BytesIO(jpeg))


def rows(pre: Preprocessor, spec: InputSpec, frame: np.ndarray, pil: Image.Image, jpeg: bytes) -> dict:
    """label -> (edgekit fn, naive fn, make the input for one call: fresh for lazy images)."""
    def naive(im, s=spec.height):
        return naive_pipeline(im, s)

    return {
        "BGR frame": (lambda f: pre(f), naive, lambda: frame, lambda: pil),
        "Vector JPEG": (lambda im: pre(model_window(im, spec)), naive, lambda: lazy(jpeg), lambda: lazy(jpeg)),
        "Vector decoded PIL": (lambda im: pre(model_window(im, spec)), naive, lambda: pil, lambda: pil),
        "whole PIL->numpy": (lambda im: pre(cv2.cvtColor(np.asarray(im), cv2.COLOR_RGB2BGR)), naive,
                             lambda: pil, lambda: pil),
    }


def measure(edge, naive, make_e, make_n, count: int) -> tuple[float, float]:
    """Interleaved p50s (ms) of ``edge`` and ``naive``, inputs made outside the timing."""
    e, n = [], []
    for i in range(count):
        order = ((edge, make_e(), e), (naive, make_n(), n))
        for f, a, into in order if i % 2 == 0 else order[::-1]:
            p50(f, a, into)
    return np.percentile(e, 50) / 1e6, np.percentile(n, 50) / 1e6


GOALS = {"Vector": 0.3, "BGR": 0.2}  # ratio goals by a row label's first word (the line printed below)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality of the Vector rows' frame (default 90)")
    args = ap.parse_args(argv)
    frame = camera_frame()
    goals = Goals("preprocess.py")
    jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, args.quality])[1].tobytes()
    pil = lazy(jpeg)
    pil.load()
    print(f"{'model input':<22}{'edgekit p50':>13}{'naive PIL p50':>15}{'ratio':>9}   input")
    for size, dtype in ((200, "float32"), (32, "float32"), (32, "uint8")):
        spec = InputSpec(shape=(1, size, size, 1), colour="gray", crop=(200, 200))
        if dtype == "uint8":
            spec = spec.with_quantization("uint8", 1 / 255, 0)
        pre = Preprocessor(spec)
        if size == 200:  # same pixels in, same numbers out (PIL and OpenCV share the BT.601 luma weights)
            decoded = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
            diff = np.abs(pre(decoded).astype(np.float64) - naive_pipeline(pil, size)).max()
            assert diff <= 1.5 / 255, diff
        for label, (edge, naive, make_e, make_n) in rows(pre, spec, frame, pil, jpeg).items():
            pe, pn = measure(edge, naive, make_e, make_n, args.count)
            name = f"{size}x{size}x1 {dtype}"
            bound = GOALS.get(label.split()[0])  # the rows the goals name; the others are context
            mark = "" if bound is None else goals.check(f"{name} {label}", pe / pn, "<=", bound)
            print(f"{name:<22}{pe:>10.4f} ms{pn:>12.4f} ms{pe / pn:>8.3f}x   {label} {mark}".rstrip(), flush=True)
    print("ratio = edgekit p50 / naive p50 on a 640x360 frame (goals: Vector rows <= 0.3, BGR frame <= 0.2)")
    return goals.exit_code()


if __name__ == "__main__":
    sys.exit(main())
