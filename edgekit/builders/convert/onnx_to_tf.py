"""ONNX -> TensorFlow SavedModel through onnx2tf, for the TFLite targets (edgetpu, rpi, cpu).

Route: onnx2tf is the ecosystem's ONNX -> TensorFlow converter
(Ultralytics' Edge TPU export uses it). It hard-pins an older stack (TF 2.19, numpy 1.26),
so it is installed ``--no-deps`` beside TF 2.21 with onnx-graphsurgeon, sng4onnx, psutil,
tf-keras and onnxsim (``make install`` does this), and run in a child process of this interpreter
(:mod:`edgekit.builders.convert.onnx2tf_job`: it calls ``sys.exit`` on errors and prints hundreds
of lines). onnx2tf turns NCHW into NHWC, so the bundle's input is what a camera frame gives.
edgekit then makes fp32/fp16/int8 from the SavedModel with TensorFlow's converter and its
own calibration images, exactly as for a Keras model.

Before converting, the model is checked for what onnx2tf cannot take: an opset below 11
(onnx2tf's README: "Only for opset=11 or higher"), ops of other domains, and ops it has no
converter for (one module per op in ``onnx2tf/ops``); each is refused with the op and node.

When onnx2tf fails, the error is matched against the options onnx2tf documents for it
(:data:`FALLBACKS`: its README's flags and the advice it prints) and the conversion is tried
again with the one that applies, before giving up; the build log says which were tried. A
conversion that still fails keeps onnx2tf's full log in a file the error names (the build's
temporary folder, and with it build.log, is gone by then).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgekit.builders.convert.onnx2tf_fallbacks import (
    FALLBACKS,
    Failure,
    GraphFacts,
    graph_facts,
    last_error,
    merged,
    next_fallback,
    read_failure,
    stopped_at,
)
from edgekit.builders.convert.onnx2tf_job import SAMPLE_FILE
from edgekit.errors import BackendUnavailable, ModelError

if TYPE_CHECKING:
    from edgekit.builders.log import BuildLog
    from edgekit.builders.sources.load import SourceModel

MIN_OPSET = 11
MAX_OPSET = 24  # the newest opset of onnx 1.19, the onnx onnx2tf 1.29 is pinned to
INSTALL_HINT = ("pip install --no-deps onnx2tf==1.29.24 onnx-graphsurgeon sng4onnx psutil 'tf-keras~=2.21.0' "
                "onnxsim==0.4.36 (make install does this)")
TIMEOUT_S = 1800  # for all attempts together
MAX_FALLBACKS = 4
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


def onnx_to_saved_model(source: SourceModel, samples: np.ndarray, workdir: Path, log: BuildLog,
                        keep_log: Path | None = None) -> tuple[Path, dict]:
    """Convert the prepared ONNX model to a SavedModel keyed by the source's output keys.

    ``samples``: float NHWC tensors of edgekit's calibration images, handed to onnx2tf as its
    sample data so it never downloads its own. ``keep_log``: where onnx2tf's full log is
    written (atomically) when the conversion fails even with its fallbacks; the error names it,
    and a stale one is removed when the conversion succeeds. Returns the SavedModel directory
    and the job's result (the converted outputs, and the input shape onnx2tf made).
    """
    check_convertible(source)
    job_dir = workdir / "onnx2tf"
    failed = job_dir / "failed.json"
    if failed.is_file():  # another TFLite target of this build: the same error, not another conversion
        raise ModelError(**json.loads(failed.read_text()))
    job_dir.mkdir(parents=True, exist_ok=True)
    prepared = _rewritten(source, log, samples[:20])
    (job_dir / "model.onnx").write_bytes(prepared)
    np.save(job_dir / SAMPLE_FILE, np.ascontiguousarray(samples[:20], dtype=np.float32))
    log.record(f"sample data: {min(len(samples), 20)} of edgekit's calibration tensors as {SAMPLE_FILE}; "
               "network blocked in the conversion process", prefix="onnx2tf job: ")
    job = {"onnx": "model.onnx", "input": source.input_name, "layout": source.layout,
           "keys": [o.key for o in source.outputs]}
    try:
        result = _with_fallbacks(source, job, job_dir, log, graph_facts(prepared, source.input_name))
    except ModelError as exc:
        kept = _keep_log(job_dir / "attempts.log", keep_log)
        exc.hint = (f"onnx2tf's full log: {kept}; " if kept else "") + "or build this model for jetson"
        failed.write_text(json.dumps({"message": exc.message, "hint": exc.hint}))
        raise
    if keep_log is not None and keep_log.is_file():
        keep_log.unlink()  # an earlier build's failure; this build converted the model
    return job_dir / "saved_model", result


def _with_fallbacks(source: SourceModel, job: dict, job_dir: Path, log: BuildLog, facts: GraphFacts) -> dict:
    """Run the job; after a failure, again with the first of :data:`FALLBACKS` that answers it and
    was not tried yet (options add up), until it converts or none is left to try."""
    flags: dict = {}
    tried: list[str] = []
    first = ""
    t0 = time.monotonic()
    for attempt in range(1, MAX_FALLBACKS + 2):
        (job_dir / "job.json").write_text(json.dumps({**job, "flags": flags}))
        # a job that dies before writing its own (a native crash) must not be read as the last one's
        (job_dir / "result.json").unlink(missing_ok=True)
        proc = _run_job(job_dir, source, TIMEOUT_S - (time.monotonic() - t0))
        text = _ANSI.sub("", proc.stdout + proc.stderr)
        log.record(text, prefix="onnx2tf| ")
        with (job_dir / "attempts.log").open("a", encoding="utf-8") as out:
            out.write(f"== onnx2tf attempt {attempt} on {source.path.name}, options: "
                      f"{', '.join(tried) or 'edgekit defaults'} ==\n{text}\n")
        try:
            result = _result(job_dir, proc, source)
        except ModelError as exc:
            failure = read_failure(job_dir, text, facts)
            first = first or exc.message
            in_time = time.monotonic() - t0 < TIMEOUT_S and attempt <= MAX_FALLBACKS
            step = next_fallback(failure, facts, tried) if in_time and not failure.converted else None
            if step is None:
                raise _gave_up(exc, first, tried, failure) from None
            label, when, extra = step
            log.info(f"onnx2tf failed ({failure.error[:120]}); trying again with its {label} option ({when})")
            flags, tried = merged(flags, extra), [*tried, label]
            continue
        if tried:
            log.info(f"onnx2tf converted {source.path.name} with its {', '.join(tried)} option(s)")
        return result
    raise AssertionError("unreachable")  # the loop returns or raises


def _run_job(job_dir: Path, source: SourceModel, timeout: float) -> subprocess.CompletedProcess:
    """One onnx2tf child process (:mod:`edgekit.builders.convert.onnx2tf_job`) on ``job.json``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1", PYTHONUNBUFFERED="1")
    try:
        return subprocess.run([sys.executable, "-m", "edgekit.builders.convert.onnx2tf_job", "job.json"], cwd=job_dir,
                              env=env, capture_output=True, text=True, timeout=max(timeout, 1), check=False)
    except subprocess.TimeoutExpired as exc:
        raise ModelError(f"onnx2tf did not finish converting {source.path.name} in {TIMEOUT_S} s") from exc


def _gave_up(exc: ModelError, first: str, tried: list[str], failure: Failure) -> ModelError:
    """The last attempt's error, the first one's when it differs, and which fallbacks were tried."""
    message = exc.message
    if failure.op_type and f"(at node '{failure.node}')" in message:
        message = message.replace(f"(at node '{failure.node}')", f"(at node '{failure.node}', {failure.op_type})")
    if tried:
        message += f"; tried onnx2tf's fallbacks {', '.join(tried)}"
        if first != exc.message:
            message += f" (the first attempt: {first.split(': ', 1)[-1][:160]})"
    elif not failure.converted:
        message += f"; none of onnx2tf's fallbacks answers this error ({', '.join(f.flag for f in FALLBACKS)})"
    return ModelError(message, exc.hint)


def _keep_log(log_file: Path, dest: Path | None) -> Path | None:
    """Copy the attempts' log to ``dest`` atomically (a temporary file renamed into place);
    None when there is nowhere to keep it or it cannot be written."""
    if dest is None or not log_file.is_file():
        return None
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(log_file.read_text(encoding="utf-8"), encoding="utf-8")
        os.replace(tmp, dest)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    return dest


def _rewritten(source: SourceModel, log: BuildLog, samples: np.ndarray) -> bytes:
    """The prepared ONNX as onnx2tf gets it: erf-GELU chains fused, padded MaxPools given a finite
    explicit Pad, one-element constant operands made scalars (:mod:`edgekit.builders.convert.onnx_rewrite`).
    ``samples``: NHWC calibration tensors."""
    import onnx

    from edgekit.builders.convert.onnx_rewrite import (
        fuse_gelu,
        maxpool_floors,
        pad_maxpools,
        same_maxpools,
        scalar_operands,
    )

    images = samples.transpose(0, 3, 1, 2) if source.layout == "NCHW" else samples
    floors = maxpool_floors(source.onnx or b"", source.input_name, np.ascontiguousarray(images, np.float32))
    model = onnx.load_from_string(source.onnx or b"")
    fused, padded, scalars = fuse_gelu(model), pad_maxpools(model, floors), scalar_operands(model)
    if scalars:
        log.record(f"{scalars} one-element constant operand(s) of Add/Sub/Mul/Div given as scalars (onnx2tf runs the "
                   "ops after an Add of a [1] constant in NCHW, between TRANSPOSEs the Edge TPU does not map)",
                   prefix="onnx2tf job: ")
    if fused:
        log.record(f"{fused} Div-Erf-Add-Mul-Mul chain(s) fused into Gelu (TFLite has no Erf)", prefix="onnx2tf job: ")
    same = same_maxpools(model)
    if same:
        log.record(f"{same} padded MaxPool(s) whose pads are TF's SAME left to onnx2tf as MAX_POOL_2D padding=SAME "
                   "(no PAD/PADV2: the Edge TPU maps it, int8 sees no pad value)", prefix="onnx2tf job: ")
    if padded:
        log.record(f"{padded} padded MaxPool(s) given an explicit finite Pad (0 after a ReLU, else twice the lowest "
                   "value on calibration images; onnx2tf pads with -3.4e38, which int8 calibration cannot take)",
                   prefix="onnx2tf job: ")
    return model.SerializeToString() if fused or padded or scalars else source.onnx or b""


def _result(job_dir: Path, proc: subprocess.CompletedProcess, source: SourceModel) -> dict:
    """The job's result.json, or ModelError with the one line that says what went wrong."""
    result_file = job_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    if "No module named onnx2tf" in proc.stderr or "No module named 'onnx2tf'" in proc.stderr:
        raise BackendUnavailable("building ONNX for TFLite targets needs onnx2tf", INSTALL_HINT)
    if not result.get("ok"):
        why = result.get("error") or f"the converter crashed (exit {proc.returncode})"
        if result.get("stage") == "export" and result.get("error"):  # onnx2tf made a model TF cannot trace
            why = f"its model fails when traced for the SavedModel: {why}"
        text = proc.stdout + proc.stderr
        detail = last_error(text)
        node, op = result.get("node") or stopped_at(text), result.get("op")  # the job reads them off the traceback
        raise ModelError(f"onnx2tf could not convert {source.path.name}: {why}" + (f": {detail}" if detail else "")
                         + (f" (at node '{node}'" + (f", {op}" if op else "") + ")" if node else ""),
                         "build this model for jetson")
    got = [o["key"] for o in result["outputs"]]
    want = [o.key for o in source.outputs]
    if got != want:
        raise ModelError(f"onnx2tf renamed the outputs of {source.path.name}: {got} instead of {want}",
                         "give every ONNX output a unique, plain name (letters, digits, _)")
    return result
