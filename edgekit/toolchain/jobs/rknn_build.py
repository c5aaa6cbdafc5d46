"""RKNN-Toolkit2 in the rk3588 toolchain's interpreter: ONNX -> quantised ``.rknn``, then the simulator.

Run as ``python -s rknn_build.py job.json`` in a job folder (see :mod:`jobwire`). The job says:

* ``onnx``: the NCHW ONNX model; ``platform``: ``rk3588`` (or another chip the toolkit names);
* ``calib`` (array, N x the model's input): edgekit's calibration tensors, already preprocessed;
  written here as one ``.npy`` per image and listed in ``dataset.txt``, the form the toolkit's
  quantiser reads;
* ``eval`` (array, optional): tensors run through the simulator after the build; their outputs
  come back as ``out_0``, ``out_1``... for the parent to compare with the original model;
* ``analyse`` (int): non-zero runs ``accuracy_analysis`` on the first eval tensor, layer by
  layer against the float model (the toolkit takes one sample per model input: further ones
  would be ignored); the worst layers by cosine come back in the result;
* ``disable_rules``, ``quantized_algorithm``: passed to ``config``.

The tensors are edgekit's preprocessed inputs, so ``config`` gets mean 0 and std 1: the device
feeds the same float tensors and the runtime quantises them (one preprocessing copy, edgekit's).
Imports only the toolkit, numpy and :mod:`jobwire`.
"""

from __future__ import annotations

import re
import sys
import time
import traceback
from pathlib import Path

import jobwire
import numpy as np


class StepFailed(RuntimeError):
    """A toolkit call returned non-zero (the toolkit logs why; the parent reads the log's line)."""


def check(ret: int, what: str) -> None:
    """RKNN-Toolkit2 answers 0 for success and logs its reason otherwise."""
    if ret != 0:
        raise StepFailed(f"{what} returned {ret}")


def write_dataset(folder: Path, calib: np.ndarray) -> Path:
    """One ``.npy`` per calibration tensor and ``dataset.txt`` naming them (the toolkit's format).

    Each file is a batch of one in the ONNX model's own layout: for an NCHW model the toolkit
    refuses an NHWC entry ("expect 'nchw' like (1, 3, 160, 160)").
    """
    folder.mkdir(exist_ok=True)
    lines = []
    for i, x in enumerate(calib):
        path = folder / f"calib_{i:04d}.npy"
        np.save(path, x[None].astype(np.float32))
        lines.append(str(path.resolve()))
    listing = folder / "dataset.txt"
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return listing


def to_nhwc(x: np.ndarray) -> np.ndarray:
    """An NCHW batch as NHWC (what ``inference`` and the dataset take for a 4-D input)."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if x.ndim == 4 else x


def make_rknn(job: dict, calib: np.ndarray, workdir: Path, progress: dict | None = None):
    """A built RKNN object: ``config``, ``load_onnx`` (the input's static shape when the job gives
    ``input``/``input_shape``: the toolkit refuses a symbolic batch), quantised ``build``.
    ``progress["stage"]`` names the step under way; ``progress["build_s"]`` is the build's time."""
    from rknn.api import RKNN

    progress = {} if progress is None else progress
    progress["stage"] = "config"
    rknn = RKNN(verbose=bool(job.get("verbose", False)))
    channels = int(job["channels"])
    check(rknn.config(mean_values=[[0.0] * channels], std_values=[[1.0] * channels],
                      target_platform=job.get("platform", "rk3588"),
                      quantized_algorithm=job.get("quantized_algorithm", "normal"),
                      disable_rules=list(job.get("disable_rules", []))), "config")
    progress["stage"] = "load_onnx"
    shape = {"inputs": [job["input"]], "input_size_list": [list(job["input_shape"])]} if job.get("input") else {}
    check(rknn.load_onnx(model=job["onnx"], **shape), "load_onnx")
    progress["stage"] = "build"
    t0 = time.monotonic()
    check(rknn.build(do_quantization=True, dataset=str(write_dataset(workdir / "dataset", calib))), "build")
    progress["build_s"] = round(time.monotonic() - t0, 2)
    return rknn


def simulate(rknn, inputs: np.ndarray) -> list[np.ndarray]:
    """Every input through the simulator, one at a time; the outputs stacked per output index."""
    per_output: list[list[np.ndarray]] = []
    for x in inputs:
        outs = rknn.inference(inputs=[to_nhwc(x[None]).astype(np.float32)], data_format="nhwc")
        if outs is None:
            raise StepFailed("inference returned nothing")
        for i, o in enumerate(outs):
            if len(per_output) <= i:
                per_output.append([])
            per_output[i].append(np.asarray(o, dtype=np.float32))
    return [np.concatenate(o) if o[0].ndim and o[0].shape[0] == 1 else np.stack(o) for o in per_output]


_LAYER = re.compile(r"^\[(?P<op>[^\]]+)\]\s+(?P<name>\S+)\s+(?P<cols>.*)$")


def worst_layers(report: Path, count: int = 5) -> list[dict]:
    """The layers ``accuracy_analysis``'s ``error_analysis.txt`` scores lowest by entire cosine.

    Its rows read ``[Op] name  entire_cos entire_euc  single_cos single_euc`` (values may be ``-``).
    """
    rows = []
    for line in report.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _LAYER.match(line.strip())
        if not match:
            continue
        numbers = [float(v) for v in re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?", match.group("cols"))]
        if numbers:
            rows.append({"op": match.group("op"), "layer": match.group("name"), "cosine": numbers[0],
                         "single_cosine": numbers[2] if len(numbers) > 2 else None})
    return sorted(rows, key=lambda r: r["cosine"])[:count]


def analyse(rknn, samples: np.ndarray, workdir: Path) -> list[dict]:
    """``accuracy_analysis`` on the simulator for ``samples`` (one tensor per model input, in the
    model's layout); the worst layers of its report."""
    paths = []
    for i, x in enumerate(samples):
        path = workdir / f"analyse_{i}.npy"
        np.save(path, x[None].astype(np.float32))  # the model's layout, as the dataset
        paths.append(str(path))
    out = workdir / "snapshot"
    check(rknn.accuracy_analysis(inputs=paths, output_dir=str(out), target=None), "accuracy_analysis")
    report = out / "error_analysis.txt"
    return worst_layers(report) if report.is_file() else []


def run(workdir: Path) -> None:
    """The whole job; ``result.json`` says ok, or the step that failed and why in one line."""
    job, arrays = jobwire.read_job(workdir)
    progress = {"stage": "start"}
    rknn = None
    try:
        rknn = make_rknn(job, arrays["calib"], workdir, progress)
        progress["stage"] = "export_rknn"
        check(rknn.export_rknn(job.get("out", "model.rknn")), "export_rknn")
        progress["stage"] = "init_runtime"
        check(rknn.init_runtime(target=None), "init_runtime (simulator)")
        progress["stage"] = "inference"
        outs = simulate(rknn, arrays["eval"]) if "eval" in arrays else []
        worst = []
        if int(job.get("analyse", 0)) and "eval" in arrays:
            progress["stage"] = "accuracy_analysis"
            worst = analyse(rknn, arrays["eval"][:1], workdir)
        jobwire.write_result(workdir, {"ok": True, "rknn": job.get("out", "model.rknn"),
                                       "toolkit": toolkit_version(),
                                       "worst_layers": worst, "build_s": progress.get("build_s")},
                             {f"out_{i}": o for i, o in enumerate(outs)})
    except Exception as exc:  # every failure becomes one line for the parent; the traceback stays in the log
        traceback.print_exc()
        stage = progress["stage"]
        jobwire.write_result(workdir, {"ok": False, "stage": stage, "error": f"{stage}: {jobwire.one_line(exc)}"})
    finally:
        if rknn is not None:
            rknn.release()


def toolkit_version() -> str:
    """The installed RKNN-Toolkit2's version (its distribution's, else the module's)."""
    return _dist_version("rknn-toolkit2") or _module_version()


def _module_version() -> str:
    import rknn

    return str(getattr(rknn, "__version__", ""))


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return ""


if __name__ == "__main__":
    run(Path(sys.argv[1]).resolve().parent if len(sys.argv) > 1 else Path.cwd())
