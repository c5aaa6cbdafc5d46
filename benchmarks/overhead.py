"""Runtime overhead: ``LiteRTRuntime.infer`` p50 / bare ``set_tensor + invoke + get_tensor`` p50.

Both run the same ``.tflite`` file with the same thread count, alternating call by call
(edgekit, bare, bare, edgekit, ...) so that machine drift hits both alike. Goal: <= 1.03.

    python benchmarks/overhead.py [--models demo,mobilenetv2] [--variants int8,fp32] [--count 3000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from goals import Goals
from precision import Bare, build_variants, random_input, work_dir


def overhead(path: Path, threads: int, count: int) -> tuple[float, float]:
    """(edgekit p50 ms, bare p50 ms) over ``count`` interleaved calls each."""
    from edgekit.runtime.litert import LiteRTRuntime

    rt = LiteRTRuntime(path, num_threads=threads)
    bare = Bare(path, threads)
    x = random_input(bare.interp.get_input_details()[0])
    for _ in range(20):
        rt.infer(x)
        bare.infer(x)
    clock = time.perf_counter_ns
    e, b = [], []
    pairs = ((rt.infer, e), (bare.infer, b))
    for i in range(count):
        for fn, into in pairs if i % 2 == 0 else pairs[::-1]:
            t0 = clock()
            fn(x)
            into.append(clock() - t0)
    rt.close()
    return float(np.percentile(e, 50)) / 1e6, float(np.percentile(b, 50)) / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,mobilenetv2")
    ap.add_argument("--variants", default="int8,fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--count", type=int, default=3000, help="calls per implementation (default 3000)")
    ap.add_argument("--workdir", type=Path, help="keep converted models here (shared with benchmarks/precision.py)")
    args = ap.parse_args(argv)
    workdir = work_dir(args.workdir, "edgekit-overhead-")
    goals = Goals("overhead.py")
    print(f"{'model':<12}{'variant':>8}{'threads':>8}{'n':>7}{'Runtime.infer p50':>19}{'bare p50':>11}{'ratio':>9}")
    for name in args.models.split(","):
        paths = build_variants(name, workdir)
        for v in args.variants.split(","):
            count = args.count if name == "demo" else max(200, args.count // 10)  # big models: fewer calls
            e, b = overhead(paths[v], args.threads, count)
            mark = goals.check(f"{name} {v} ratio", e / b, "<=", 1.03)
            print(f"{name:<12}{v:>8}{args.threads:>8}{count:>7}{e:>16.4f} ms{b:>8.4f} ms{e / b:>8.3f}x {mark}",
                  flush=True)
    print("ratio = Runtime.infer p50 / bare p50 on the same model file (goal <= 1.03)")
    return goals.exit_code()


if __name__ == "__main__":
    sys.exit(main())
