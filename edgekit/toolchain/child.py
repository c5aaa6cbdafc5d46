"""Running a vendor step in its toolchain's interpreter: a one-shot job, or a session over pipes.

The child is ``TOOLCHAIN/venv/bin/python -s edgekit/toolchain/jobs/SCRIPT.py job.json``, an
argument list (never a shell), with the job folder as its working directory. It imports its
vendor package and numpy, never edgekit (which is not installed there): the job is
``job.json`` plus ``.npy`` arrays, the answer ``result.json`` plus arrays
(:mod:`edgekit.toolchain.jobs.jobwire`). The vendor's chatter (RKNN-Toolkit2 and TensorFlow
print hundreds of lines) goes to ``job.log`` in the folder, which the build keeps. Why a child:
the vendor stacks pin numpy 1.26, torch 2.4, TensorFlow 2.15, none of which can share
edgekit's process, and a native crash there must not take the build with it.

A failure is one line: ``result.json``'s ``"error"`` when the job caught it, else the last
line of ``job.log`` and the exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EXIT_RUNTIME, EdgekitError, ModelError
from edgekit.toolchain.jobs import jobwire
from edgekit.toolchain.store import Installed

JOBS_DIR = Path(__file__).parent / "jobs"
LOG = "job.log"
# what edgekit's own environment may set and a vendor interpreter must not inherit
_DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")


class ToolchainJobError(EdgekitError):
    """A vendor child that crashed, timed out or could not start (exit 1: the machine, not the model)."""

    exit_code = EXIT_RUNTIME


@dataclass
class JobResult:
    """What a job answered: its ``result.json`` and the arrays it wrote, and where its log is."""

    result: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    log: Path | None = None
    seconds: float = 0.0


def child_argv(toolchain: Installed, script: str, *args: str) -> list[str]:
    """The child's command line: the toolchain's Python, no user site, the job script by path."""
    path = JOBS_DIR / f"{script}.py"
    if not path.is_file():
        raise ValueError(f"no job script {script!r} in {JOBS_DIR}")
    return [str(toolchain.interpreter), "-s", str(path), *args]


def child_env() -> dict[str, str]:
    """edgekit's environment without what would point the child at edgekit's packages."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"  # the log shows how far a crashed child got
    return env


def run_job(toolchain: Installed, script: str, job: dict[str, Any], workdir: Path,
            arrays: dict[str, np.ndarray] | None = None, timeout: float = 3600.0) -> JobResult:
    """Run ``jobs/SCRIPT.py`` on ``job`` in ``workdir`` (created) with the toolchain's interpreter.

    Returns the result when the child wrote ``"ok": true``; a job that reported a failure raises
    ModelError with its message (the model did not convert), a child that crashed or ran past
    ``timeout`` seconds ToolchainJobError (the last line of its log).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / jobwire.RESULT).unlink(missing_ok=True)
    names = jobwire.write_arrays(workdir / "in", arrays) if arrays else {}
    (workdir / jobwire.JOB).write_text(json.dumps({**job, "arrays": names}, indent=1), encoding="utf-8")
    log_file = workdir / LOG
    started = time.monotonic()
    with open(log_file, "ab") as out:
        try:
            proc = subprocess.run(child_argv(toolchain, script, jobwire.JOB), cwd=workdir, env=child_env(),
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ToolchainJobError(f"{toolchain.name} step {script} ran past {timeout:.0f} s",
                                    f"see {log_file}") from None
        except OSError as exc:
            raise ToolchainJobError(f"cannot start {toolchain.interpreter}: {exc.strerror}",
                                    f"edgekit toolchain install {toolchain.name} --force") from None
    seconds = time.monotonic() - started
    result = _read_result(workdir)
    if result is None:
        raise ToolchainJobError(f"{toolchain.name} step {script} exited {proc.returncode} without a result: "
                                f"{last_line(log_file)}", f"see {log_file}")
    if not result.get("ok"):
        raise ModelError(f"{toolchain.name}: {result.get('error', 'failed')}"[:400],
                         result.get("fix") or f"see {log_file}")
    return JobResult(result, jobwire.load_arrays(workdir, result.get("arrays", {})), log_file, seconds)


def _read_result(workdir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((workdir / jobwire.RESULT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def last_line(log_file: Path, limit: int = 240) -> str:
    """The last non-blank line of a child's log (where a traceback ends), or 'no output'."""
    try:
        lines = [ln.strip() for ln in log_file.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [ln for ln in lines if ln]
    return lines[-1][:limit] if lines else "no output"
