"""RKNN-Toolkit2's simulator as a session: ``python -s rknn_sim.py job.json --session``.

The toolkit's simulator runs a model it has just built, not one loaded from a ``.rknn``
(``init_runtime(target=None)`` after ``load_rknn`` is refused), so the session rebuilds the
model the way the build did: the same ONNX, the same calibration tensors and ``config``, which
the bundle keeps beside its ``.rknn`` (``*.rknn.sim.json``). The quantiser is deterministic on
the same inputs, so this is the model the ``.rknn`` holds. Then ``{"op": "ready"}``, and one
answer per ``{"op": "infer"}`` (one NHWC float32 array in, the outputs back) until
``{"op": "close"}`` or the pipe closes. See :mod:`jobwire` for the framing.
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
    """Build, start the simulator, answer requests; the exit code."""
    requests, answers = jobwire.claim_stdout()  # vendor prints go to the log, never the pipe
    job, _ = jobwire.read_job(workdir)
    rknn = None
    try:
        calib = np.load(job["calib"], allow_pickle=False)
        t0 = time.monotonic()
        rknn = rknn_build.make_rknn(job, calib, workdir)
        rknn_build.check(rknn.init_runtime(target=None), "init_runtime (simulator)")
        jobwire.send(answers, {"ok": True, "op": "ready", "build_s": round(time.monotonic() - t0, 2)})
    except Exception as exc:
        traceback.print_exc()
        jobwire.send(answers, {"ok": False, "error": f"{jobwire.one_line(exc)}"})
        return 1
    try:
        return _loop(rknn, requests, answers)
    finally:
        rknn.release()


def _loop(rknn, requests, answers) -> int:
    """Answer until told to close or the parent goes away."""
    while True:
        try:
            header, arrays = jobwire.receive(requests)
        except jobwire.WireError:
            return 0  # the parent closed the pipe
        if header.get("op") == "close":
            return 0
        try:
            outs = rknn.inference(inputs=[arrays[0].astype(np.float32)], data_format="nhwc")
            if outs is None:
                raise rknn_build.StepFailed("inference returned nothing")
            jobwire.send(answers, {"ok": True}, [np.asarray(o, dtype=np.float32) for o in outs])
        except Exception as exc:  # one bad request is one error answer, not a dead session
            traceback.print_exc()
            jobwire.send(answers, {"ok": False, "error": f"{jobwire.one_line(exc)}"})


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]).resolve().parent))
