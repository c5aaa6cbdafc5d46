"""RKNN-Toolkit2's simulator as a session: ``python -s rknn_sim.py job.json --session``.

The toolkit's simulator runs a model it has just built, not one loaded from a ``.rknn``
(``init_runtime(target=None)`` after ``load_rknn`` is refused), so the session rebuilds the
model the way the build did: the same ONNX, the same calibration tensors and ``config``, which
the bundle keeps beside its ``.rknn`` (``*.rknn.sim.json``; the tensors in a ``.npy``, or under
``calib`` in a compressed ``.npz``). The quantiser is deterministic on
the same inputs, so this is the model the ``.rknn`` holds.

The build itself (``edgekit build --target rk3588``, edgekit/builders/rknn.py) runs the same
session with ``"export": PATH`` in the job: the model is written with ``export_rknn`` right after
the quantised build, then simulated, so the gate judges the very model the bundle ships.

Then ``{"op": "ready"}`` (with ``build_s`` and the ``toolkit`` version), and one answer per
request until ``{"op": "close"}`` or the pipe closes:

* ``{"op": "infer"}`` with one NHWC float32 array: the outputs back;
* ``{"op": "analyse"}`` with one tensor in the model's layout (NCHW): ``accuracy_analysis``
  against the float model, its worst layers in the answer's ``worst_layers`` (the toolkit
  compares one sample per model input: a second tensor would be ignored).

See :mod:`jobwire` for the framing.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import jobwire
import numpy as np
import rknn_build


def serve(workdir: Path) -> int:
    """Build (and export, when asked), start the simulator, answer requests; the exit code."""
    requests, answers = jobwire.claim_stdout()  # vendor prints go to the log, never the pipe
    job, _ = jobwire.read_job(workdir)
    rknn = None
    try:
        loaded = np.load(job["calib"], allow_pickle=False)
        calib = loaded["calib"] if hasattr(loaded, "files") else loaded  # .npz (compressed, a build's) or .npy
        t0 = time.monotonic()
        progress: dict = {}
        rknn = rknn_build.make_rknn(job, calib, workdir, progress)
        build_s = progress.get("build_s", round(time.monotonic() - t0, 2))  # the quantised build itself
        if job.get("export"):
            rknn_build.check(rknn.export_rknn(job["export"]), "export_rknn")
        rknn_build.check(rknn.init_runtime(target=None), "init_runtime (simulator)")
        jobwire.send(answers, {"ok": True, "op": "ready", "build_s": build_s,
                               "toolkit": rknn_build.toolkit_version()})
    except Exception as exc:
        traceback.print_exc()
        jobwire.send(answers, {"ok": False, "error": f"{jobwire.one_line(exc)}"})
        return 1
    try:
        return _loop(rknn, requests, answers, workdir)
    finally:
        rknn.release()


def _loop(rknn, requests, answers, workdir: Path) -> int:
    """Answer until told to close or the parent goes away."""
    while True:
        try:
            header, arrays = jobwire.receive(requests)
        except jobwire.WireError:
            return 0  # the parent closed the pipe
        if header.get("op") == "close":
            return 0
        try:
            if header.get("op") == "analyse":
                worst = rknn_build.analyse(rknn, arrays[0][:1], workdir)
                jobwire.send(answers, {"ok": True, "worst_layers": worst})
                continue
            outs = rknn.inference(inputs=[arrays[0].astype(np.float32)], data_format="nhwc")
            if outs is None:
                raise rknn_build.StepFailed("inference returned nothing")
            jobwire.send(answers, {"ok": True}, [np.asarray(o, dtype=np.float32) for o in outs])
        except Exception as exc:  # one bad request is one error answer, not a dead session
            traceback.print_exc()
            jobwire.send(answers, {"ok": False, "error": f"{jobwire.one_line(exc)}"})


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]).resolve().parent))
