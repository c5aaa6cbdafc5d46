"""A vendor child that stays up: requests and answers over its stdin/stdout pipes.

Used where a vendor step runs many times on one loaded model (the RKNN simulator as a runtime:
``edgekit run --backend rknn-sim``). The child is started like a one-shot job
(:func:`edgekit.toolchain.child.child_argv`, the job folder as its working directory) with
``--session``; it answers ``{"op": "ready"}`` once its model is loaded, then one answer per
request (:mod:`edgekit.toolchain.jobs.jobwire`: a JSON header and ``.npy`` arrays). Its stderr,
where it points the vendor's stdout too, goes to ``job.log``.

Not thread-safe: one request at a time, as the pipeline calls ``infer``.
"""

from __future__ import annotations

import json
import select
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError, ModelError
from edgekit.toolchain.child import LOG, ToolchainJobError, child_argv, child_env, last_line
from edgekit.toolchain.jobs import jobwire
from edgekit.toolchain.store import Installed


class ChildSession:
    """One started child; :meth:`request` sends arrays and returns the answer's arrays.

    Args:
        toolchain: the installed toolchain whose interpreter runs ``script``.
        script: the job script's name in ``edgekit/toolchain/jobs/``.
        job: what the child needs to load its model (``job.json``).
        workdir: the job folder (created; ``job.log`` is kept there).
        start_timeout: seconds the child may take to answer ``ready`` (loading a model can mean
            building it: the RKNN simulator builds from the ONNX).
    """

    def __init__(self, toolchain: Installed, script: str, job: dict[str, Any], workdir: Path,
                 start_timeout: float = 900.0):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / jobwire.JOB).write_text(json.dumps(job, indent=1), encoding="utf-8")
        self.log_file = workdir / LOG
        self.name = f"{toolchain.name} {script}"
        self._log = open(self.log_file, "ab")  # noqa: SIM115 - held for the child's life, closed in close()
        try:
            self._proc = subprocess.Popen(child_argv(toolchain, script, jobwire.JOB, "--session"), cwd=workdir,
                                          env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._log)
        except OSError as exc:
            self._log.close()
            raise ToolchainJobError(f"cannot start {toolchain.interpreter}: {exc.strerror}",
                                    f"edgekit toolchain install {toolchain.name} --force") from None
        self.ready = self._answer(start_timeout)[0]

    def request(self, header: dict[str, Any], arrays: list[np.ndarray] = ()) -> tuple[dict[str, Any], list]:
        """Send one request; its answer (header, arrays). ModelError when the child reports a failure,
        ToolchainJobError when it died."""
        if self._proc.poll() is not None:
            raise self._died()
        try:
            jobwire.send(self._proc.stdin, header, list(arrays))
        except (BrokenPipeError, OSError):
            raise self._died() from None
        return self._answer(None)

    def _answer(self, timeout: float | None) -> tuple[dict[str, Any], list]:
        """The next answer; with ``timeout`` (the start), a child silent that long is ended."""
        if timeout is not None and not select.select([self._proc.stdout], [], [], timeout)[0]:
            self._proc.kill()
            self._proc.wait()
            raise ToolchainJobError(f"{self.name} did not start within {timeout:.0f} s: {last_line(self.log_file)}",
                                    f"see {self.log_file}")
        try:
            header, arrays = jobwire.receive(self._proc.stdout)
        except jobwire.WireError:
            raise self._died() from None
        if not header.get("ok", False):
            raise ModelError(f"{self.name}: {header.get('error', 'failed')}"[:400], f"see {self.log_file}")
        return header, arrays

    def _died(self) -> ToolchainJobError:
        code = self._proc.wait(timeout=30)
        self._log.flush()
        return ToolchainJobError(f"{self.name} ended (exit {code}): {last_line(self.log_file)}",
                                 f"see {self.log_file}")

    def close(self) -> None:
        """Ask the child to end, then end it if it does not within 10 s; the log is closed."""
        if self._proc.poll() is None:
            try:
                jobwire.send(self._proc.stdin, {"op": "close"})
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream and not stream.closed:
                stream.close()
        self._log.close()

    def __enter__(self) -> ChildSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(toolchain: Any, script: str, job: dict, workdir: Path, timeout: float,
                 keep_log_at: Path, whose: str = "the toolchain's") -> ChildSession:
    """A :class:`ChildSession` of ``script``; when it fails to start, its log is copied to
    ``keep_log_at`` (the work dir goes with the build) and the error's fix line says where."""
    import shutil

    try:
        return ChildSession(toolchain, script, job, workdir, timeout)
    except EdgekitError as exc:
        try:
            keep_log_at.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(workdir / "job.log", keep_log_at)
            exc.hint = f"{whose} log is kept in {keep_log_at}"
        except OSError:
            pass
        raise
