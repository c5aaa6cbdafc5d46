"""The device half of ``make pi-check``: run bundles on prepared frames and write what came out.

Run as a file (``python -S -P scripts/pi_probe.py FRAMES.npz OUT BUNDLE:VARIANT ...``) by the
emulated aarch64 Python and by the host's Python, each with ``PYTHONPATH`` at an install of
the same wheel, so that both sides run the same code and differ only in the architecture.
It imports only what a Pi install has (edgekit, numpy, the runtime): the frames come as one
``.npz`` of uint8 arrays decoded on the host, so a JPEG decoder cannot make a difference.

Writes ``OUT/outputs.npz`` (every raw output tensor, ``b{bundle}_f{frame}_o{output}``) and
``OUT/results.json`` (the decoded result of each frame, or the one-line error of a bundle).
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

# what `import edgekit` must not load on a device (cv2: 150 MB; tensorflow: 500 MB of RSS)
HEAVY = ("cv2", "tensorflow", "keras", "torch")


def import_check() -> dict:
    """What ``import edgekit`` loaded of the heavy modules (should be nothing)."""
    import edgekit

    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
    return {"edgekit": edgekit.__version__, "heavy_loaded": loaded, "machine": platform.machine(),
            "python": platform.python_version()}


def run_bundle(spec: str, frames: list, index: int, outputs: dict) -> dict:
    """Preprocess, infer and decode every frame with one bundle variant (the pipeline's own steps)."""
    from edgekit.errors import EdgekitError
    from edgekit.model import open_model
    from edgekit.pipeline import Pipeline

    try:
        model = open_model(spec)
    except EdgekitError as exc:
        return {"error": f"open: {exc}"}
    with model:
        pipe = Pipeline(model.runtime, model.labels, top_k=3, task=model.task, task_options=model.task_options)
        results, error = [], None
        for f, frame in enumerate(frames):
            raw = model.runtime.infer(pipe.preprocess(frame))
            for o, tensor in enumerate(raw):
                outputs[f"b{index}_f{f}_o{o}"] = tensor
            if error is None:  # raw outputs are still compared when decoding cannot run here
                try:
                    results.append(pipe.decode_outputs(raw, frame.shape).to_dict())
                except EdgekitError as exc:
                    error = f"decode: {exc}"
        info = model.runtime.describe()
    return {"task": model.task, "results": results, "error": error,
            "runtime": {k: str(v) for k, v in info.items()} if isinstance(info, dict) else str(info)}


def main(argv: list[str]) -> int:
    """``FRAMES.npz OUT SPEC...``: run every spec on every frame; exit 0 even when a bundle fails."""
    import numpy as np

    frames_path, out, specs = Path(argv[0]), Path(argv[1]), argv[2:]
    report = {"import": import_check(), "bundles": {}}
    with np.load(frames_path, allow_pickle=False) as data:
        frames = [data[k] for k in sorted(data.files)]
    outputs: dict = {}
    for index, spec in enumerate(specs):
        report["bundles"][spec] = run_bundle(spec, frames, index, outputs)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "outputs.npz", **outputs)
    (out / "results.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
