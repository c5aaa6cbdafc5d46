"""ONNX -> TensorFlow SavedModel through onnx2tf, for the TFLite targets (edgetpu, rpi, cpu).

Route (DESIGN.md section 3): onnx2tf is the ecosystem's ONNX -> TensorFlow converter
(Ultralytics' Edge TPU export uses it). It hard-pins an older stack (TF 2.19, numpy 1.26),
so it is installed ``--no-deps`` beside TF 2.21 with onnx-graphsurgeon, sng4onnx, psutil and
tf-keras (``make install`` does this), and run in a child process of this interpreter
(:mod:`edgekit.builders.onnx2tf_job`: it calls ``sys.exit`` on errors and prints hundreds
of lines). onnx2tf turns NCHW into NHWC, so the bundle's input is what a camera frame gives.
edgekit then makes fp32/fp16/int8 from the SavedModel with TensorFlow's converter and its
own calibration images, exactly as for a Keras model.

Before converting, the model is checked for what onnx2tf cannot take: an opset below 11
(onnx2tf's README: "Only for opset=11 or higher"), ops of other domains, and ops it has no
converter for (one module per op in ``onnx2tf/ops``); each is refused with the op and node.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgekit.builders.onnx2tf_job import SAMPLE_FILE
from edgekit.errors import BackendUnavailable, ModelError

if TYPE_CHECKING:
    from edgekit.builders.log import BuildLog
    from edgekit.builders.source import SourceModel

MIN_OPSET = 11
MAX_OPSET = 24  # the newest opset of onnx 1.19, the onnx onnx2tf 1.29 is pinned to
INSTALL_HINT = ("pip install --no-deps onnx2tf==1.29.24 onnx-graphsurgeon sng4onnx psutil 'tf-keras~=2.21.0' "
                "(make install does this)")
TIMEOUT_S = 1800
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def onnx2tf_ops() -> set[str]:
    """The ONNX op types onnx2tf converts (its ``ops`` package), read without importing it."""
    spec = importlib.util.find_spec("onnx2tf")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable("building ONNX for TFLite targets needs onnx2tf", INSTALL_HINT)
    ops = Path(next(iter(spec.submodule_search_locations))) / "ops"
    return {p.stem for p in ops.glob("*.py") if not p.stem.startswith("_")}


def check_convertible(source: SourceModel) -> None:
    """Refuse, with one line naming the op and node, what onnx2tf cannot convert."""
    import onnx

    model = onnx.load_from_string(source.onnx)
    opset = source.opset or 0
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ModelError(f"{source.path.name} uses ONNX opset {opset}; onnx2tf converts opsets "
                         f"{MIN_OPSET} to {MAX_OPSET}",
                         "re-export the model with another opset (torch.onnx.export(..., opset_version=17))")
    known = onnx2tf_ops()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise ModelError(f"{source.path.name}: op {node.domain}.{node.op_type} (node '{node.name}') is a "
                             "custom op onnx2tf cannot convert", "export the model with standard ONNX ops only")
        if node.op_type not in known:
            raise ModelError(f"{source.path.name}: op {node.op_type} (node '{node.name}') is not supported by "
                             "onnx2tf", "replace it with supported ops before export, or build for jetson")


def onnx_to_saved_model(source: SourceModel, samples: np.ndarray, workdir: Path, log: BuildLog) -> tuple[Path, dict]:
    """Convert the prepared ONNX model to a SavedModel keyed by the source's output keys.

    ``samples``: float NHWC tensors of edgekit's calibration images, handed to onnx2tf as its
    sample data so it never downloads its own. Returns the SavedModel directory and the
    job's result (the converted outputs, and the input shape onnx2tf made).
    """
    check_convertible(source)
    job_dir = workdir / "onnx2tf"
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "model.onnx").write_bytes(_rewritten(source, log, samples[:20]))
    np.save(job_dir / SAMPLE_FILE, np.ascontiguousarray(samples[:20], dtype=np.float32))
    log.record(f"sample data: {min(len(samples), 20)} of edgekit's calibration tensors as {SAMPLE_FILE}; "
               "network blocked in the conversion process", prefix="onnx2tf job: ")
    job = {"onnx": "model.onnx", "input": source.input_name, "layout": source.layout,
           "keys": [o.key for o in source.outputs]}
    (job_dir / "job.json").write_text(json.dumps(job))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, "-m", "edgekit.builders.onnx2tf_job", "job.json"], cwd=job_dir,
                              env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ModelError(f"onnx2tf did not finish converting {source.path.name} in {TIMEOUT_S} s") from exc
    log.record(_ANSI.sub("", proc.stdout + proc.stderr), prefix="onnx2tf| ")
    return job_dir / "saved_model", _result(job_dir, proc, source)


def _rewritten(source: SourceModel, log: BuildLog, samples: np.ndarray) -> bytes:
    """The prepared ONNX as onnx2tf gets it: erf-GELU chains fused, padded MaxPools given a finite
    explicit Pad (:mod:`edgekit.builders.onnx_rewrite`). ``samples``: NHWC calibration tensors."""
    import onnx

    from edgekit.builders.onnx_rewrite import fuse_gelu, maxpool_floors, pad_maxpools

    images = samples.transpose(0, 3, 1, 2) if source.layout == "NCHW" else samples
    floors = maxpool_floors(source.onnx or b"", source.input_name, np.ascontiguousarray(images, np.float32))
    model = onnx.load_from_string(source.onnx or b"")
    fused, padded = fuse_gelu(model), pad_maxpools(model, floors)
    if fused:
        log.record(f"{fused} Div-Erf-Add-Mul-Mul chain(s) fused into Gelu (TFLite has no Erf)", prefix="onnx2tf job: ")
    if padded:
        log.record(f"{padded} padded MaxPool(s) given an explicit finite Pad (0 after a ReLU, else twice the lowest "
                   "value on calibration images; onnx2tf pads with -3.4e38, which int8 calibration cannot take)",
                   prefix="onnx2tf job: ")
    return model.SerializeToString() if fused or padded else source.onnx or b""


def _result(job_dir: Path, proc: subprocess.CompletedProcess, source: SourceModel) -> dict:
    """The job's result.json, or ModelError with the one line that says what went wrong."""
    result_file = job_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    if "No module named onnx2tf" in proc.stderr or "No module named 'onnx2tf'" in proc.stderr:
        raise BackendUnavailable("building ONNX for TFLite targets needs onnx2tf", INSTALL_HINT)
    if not result.get("ok"):
        why = result.get("error") or f"the converter crashed (exit {proc.returncode})"
        detail = _last_error(proc.stdout + proc.stderr)
        raise ModelError(f"onnx2tf could not convert {source.path.name}: {why}" + (f": {detail}" if detail else ""),
                         "see the build log (edgekit build --debug), or build this model for jetson")
    got = [o["key"] for o in result["outputs"]]
    want = [o.key for o in source.outputs]
    if got != want:
        raise ModelError(f"onnx2tf renamed the outputs of {source.path.name}: {got} instead of {want}",
                         "give every ONNX output a unique, plain name (letters, digits, _)")
    return result


def _last_error(text: str) -> str:
    """The last ``ERROR:`` line onnx2tf printed (its own message), shortened."""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return errors[-1].removeprefix("ERROR:").strip()[:240] if errors else ""
