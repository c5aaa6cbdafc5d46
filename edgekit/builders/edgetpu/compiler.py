"""Run ``edgetpu_compiler`` and turn its output into a structured, honest report.

The compiler exists only for x86-64 Linux (Coral's apt repository, package
``edgetpu-compiler``). When it is absent nothing pretends: the result says
"not compiled" with the reason, and the offline prediction of
:mod:`edgekit.tflite.edgetpu_rules` stays the only report.

The compiler is run with an argument list (no shell), in its own process group so a
timeout also kills the child process it compiles in, and its exit code is checked. A
failure, a timeout or a compile that maps 0 ops raises :class:`CompilerError` carrying
the compiler's own message.

>>> result = compile_model("dist/model_int8.tflite", "dist/")     # doctest: +SKIP
>>> result.status, result.report["tpu_ops"], result.report["total_ops"]  # doctest: +SKIP
('compiled', 11, 11)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.builders.edgetpu.report import (
    MAPPED,
    parse_bytes,
    parse_compiler_output,
    parse_operation_table,
    report_warnings,
)
from edgekit.errors import CompilerError, UsageError
from edgekit.runtime.litert import is_edgetpu_compiled  # a byte search: loads no interpreter
from edgekit.tflite.edgetpu_rules import ABSENT_REASON, COMPILER  # shared with `edgekit inspect`

# The parsers live in edgetpu_report; they stay importable from here, where callers found them.
__all__ = ["ABSENT_REASON", "MAPPED", "CompileResult", "compile_for_edgetpu", "compile_model", "find_compiler",
           "parse_bytes", "parse_compiler_output", "parse_operation_table", "tpu_op_threshold", "tpu_share"]

_KILL_GRACE_S = 5


@dataclass(frozen=True)
class CompileResult:
    """What happened to one model.

    ``status`` is ``"compiled"`` (``compiled_path`` is the ``*_edgetpu.tflite``) or
    ``"not compiled"`` (``compiled_path`` is None, ``reason`` says why in one line).
    ``report`` is :func:`parse_compiler_output`'s dict (empty when not compiled).
    """

    compiled_path: Path | None
    status: str
    reason: str
    report: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "compiled_file": self.compiled_path.name if self.compiled_path else None,
            "report": dict(self.report),
        }


def find_compiler(explicit: str | None = None) -> str | None:
    """The path of ``edgetpu_compiler``: ``explicit`` if given, else the one on PATH, else None.

    Raises:
        CompilerError: ``explicit`` was given but is not an executable file (asking for
            a compiler and silently building without one would hide the mistake).
    """
    if explicit:
        if os.sep not in explicit and not Path(explicit).exists() and shutil.which(explicit):
            return str(Path(shutil.which(explicit)).resolve())  # a bare name: looked up on PATH
        path = Path(explicit).expanduser()
        if path.is_dir():
            path = path / COMPILER
        found = shutil.which(str(path)) if path.is_file() else None
        if not found:
            what = "is not executable (chmod +x it)" if path.is_file() else "does not exist"
            raise CompilerError(
                f"{explicit} is not an executable edgetpu_compiler: {what}",
                "give the path of edgetpu_compiler (x86-64 Linux, Coral's apt package edgetpu-compiler)",
            )
        return str(Path(found).resolve())
    return shutil.which(COMPILER)


def _unusable_on_path() -> str | None:
    """Why an ``edgetpu_compiler`` on PATH was passed over (not executable), or None."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory or ".") / COMPILER
        if candidate.is_file() and not os.access(candidate, os.X_OK):
            return f"the {COMPILER} found on PATH is not executable (chmod +x it); the model was not compiled"
    return None


# Above the compiler's own 180 s timer (version 16), so its "Compilation timeout" message
# is what the user reads when a compile is merely slow; ours catches a compiler that hangs.
DEFAULT_TIMEOUT_S = 210.0


def compile_model(
    tflite_path: str | Path,
    out_dir: str | Path,
    compiler: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    min_runtime_version: int | None = None,
) -> CompileResult:
    """Compile a full-integer int8 ``.tflite`` for the Edge TPU.

    The compiler writes into a fresh folder inside ``out_dir``; only a checked model (and its
    log) is moved into place: a failed compile leaves nothing, an earlier run's files never count.

    Args:
        tflite_path: the plain int8 model (kept; the compiled one is written beside it).
        out_dir: where ``<name>_edgetpu.tflite`` and ``<name>_edgetpu.log`` go.
        compiler: path of ``edgetpu_compiler``; None looks it up on PATH.
        timeout_s: wall-clock limit; the compiler and its child process are killed after it.
        min_runtime_version: the oldest Edge TPU runtime that must run the model
            (compiler ``--min_runtime_version``); None keeps the compiler's default.

    Returns a :class:`CompileResult`; status "not compiled" when no compiler is installed.

    Raises:
        CompilerError: the compiler failed, timed out, wrote no (or an empty) model, or
            mapped 0 ops.
    """
    tflite_path = Path(tflite_path)
    out_dir = Path(out_dir)
    if min_runtime_version is not None and (not str(min_runtime_version).isdigit() or int(min_runtime_version) < 1):
        raise UsageError(f"bad --min-runtime-version {min_runtime_version!r}", "give an integer such as 13 or 14")
    exe = find_compiler(compiler)
    if exe is None:
        return CompileResult(None, "not compiled", _unusable_on_path() or ABSENT_REASON, {})
    if not tflite_path.is_file():
        raise CompilerError(f"model {tflite_path} does not exist", "build the int8 model first")
    work = _work_dir(out_dir)
    try:
        # Absolute paths: a relative name starting with "-" would read as a flag.
        args = [exe, "--out_dir", str(work.resolve()), "--show_operations"]
        if min_runtime_version is not None:
            args += ["--min_runtime_version", str(int(min_runtime_version))]
        args.append(str(tflite_path.resolve()))
        _, output = _run_compiler(args, timeout_s)  # stdout + stderr: a stand-in may print to either
        written, log_path = _outputs(work, stem := tflite_path.stem, output)
        log_text = log_path.read_text(encoding="utf-8", errors="replace") if log_path else None
        report = parse_compiler_output(output, log_text)
        report.update(
            command=[Path(exe).name, "--out_dir", out_dir.name, *args[3:-1], tflite_path.name],  # no host paths
            min_runtime_version=int(min_runtime_version) if min_runtime_version is not None else None,
            log_file=f"{stem}_edgetpu.log" if log_path else None,
        )
        _check_compiled(written, f"{stem}_edgetpu.tflite", report, output)
        report["edgetpu_custom_op"] = is_edgetpu_compiled(written)  # a stand-in may copy its input
        if log_path:
            os.replace(log_path, out_dir / report["log_file"])
        os.replace(written, compiled := out_dir / f"{stem}_edgetpu.tflite")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return CompileResult(compiled, "compiled", "", report)


def _work_dir(out_dir: Path) -> Path:
    """A fresh folder inside ``out_dir`` for the compiler (same file system: the moves are renames)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".edgetpu-", dir=out_dir))
    except OSError as exc:
        raise CompilerError(f"cannot write the compiled model into {out_dir}: {exc.strerror or exc}",
                            "give a writable output folder") from exc


def _outputs(work: Path, stem: str, stdout: str) -> tuple[Path | None, Path | None]:
    """The model and operation log the compiler wrote into ``work`` (None where absent).

    The names are ``<stem>_edgetpu.tflite/.log``; failing that, the file named on the
    "Output model:" / "Operation log:" lines, or the only file of that kind in ``work``.
    """
    found = []
    for suffix, line in ((".tflite", "Output model"), (".log", "Operation log")):
        path = work / f"{stem}_edgetpu{suffix}"
        if not path.is_file():
            named = re.findall(rf"^{line}: (.+)$", stdout, re.M)
            path = work / Path(named[-1].strip()).name if named else path
        if not path.is_file():
            only = [p for p in work.iterdir() if p.suffix == suffix and p.is_file()]
            path = only[0] if len(only) == 1 else path
        found.append(path if path.is_file() else None)
    return found[0], found[1]


def _run_compiler(args: list[str], timeout_s: float) -> tuple[str, str]:
    """Run the compiler; its stdout, and stdout + stderr. Raises CompilerError on timeout or failure."""
    rc, stdout, stderr = _run(args, timeout_s)
    output = stdout + ("\n" + stderr if stderr.strip() else "")
    if rc is None:
        raise CompilerError(
            f"edgetpu_compiler timed out after {timeout_s:g} s (killed); its output: "
            f"{_compiler_message(output, banner=True) or 'none'}",
            "the compiler hung or the model is too large for it; run it by hand to see: edgetpu_compiler -s MODEL",
        )
    if rc != 0 or _FAILED.search(output):
        raise CompilerError(
            f"edgetpu_compiler failed ({_exit_status(rc)}): {_compiler_message(output) or 'no output'}",
            "make sure the model is full-integer int8 with static shapes: edgekit inspect MODEL --target edgetpu",
        )
    return stdout, output


# Lines that mean failure whatever the exit code (the threads behind tests/fixtures/edgetpu
# show "Compilation failed!" after a 0 exit; the others end a compile that wrote nothing).
_FAILED = re.compile(r"^\s*(Compilation failed|Internal compiler error|Invalid model|Model not quantized)", re.M)


def _exit_status(rc: int) -> str:
    """``exit 1``, or ``killed by SIGSEGV`` for a negative return code."""
    if rc >= 0:
        return f"exit {rc}"
    try:
        return f"killed by {signal.Signals(-rc).name}"
    except ValueError:
        return f"killed by signal {-rc}"


def _check_compiled(written: Path | None, name: str, report: dict[str, Any], output: str) -> None:
    """Refuse a compile that wrote no (or an empty) model, or one with no op on the Edge TPU."""
    if written is None:
        raise CompilerError(
            f"edgetpu_compiler exited 0 but wrote no {name}: {_compiler_message(output) or 'no output'}",
            "run the compiler by hand to see what it did",
        )
    if written.stat().st_size == 0:
        raise CompilerError(
            f"edgetpu_compiler wrote an empty {name}: {_compiler_message(output) or 'no output'}",
            "run the compiler by hand to see what it did",
        )
    if report.get("tpu_ops") == 0:
        statuses = "; ".join(f"{r['op']} x{r['count']}: {r['status']}" for r in report.get("operations", []))
        # a model with nothing on the TPU must not be shipped as compiled (it is not moved into place)
        raise CompilerError(
            f"edgetpu_compiler mapped 0 of {report.get('total_ops', '?')} operations to the Edge TPU"
            + (f" ({statuses})" if statuses else ""),
            "see which ops fail: edgekit inspect MODEL --target edgetpu",
        )


def _run(args: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """Run without a shell; on timeout kill the whole process group. rc None = timed out."""
    try:
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # the compiler forks a child: kill both on timeout
        )
    except OSError as exc:
        raise CompilerError(f"cannot start {args[0]}: {exc}", "check the compiler path and permissions") from exc
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out or "", err or ""
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # a grandchild escaped the group and holds the pipes
            out, err = "", ""
        return None, out or "", err or ""
    except BaseException:
        _kill_group(proc)  # Ctrl-C: in its own session the compiler would not get the SIGINT
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_KILL_GRACE_S)  # reaped, not left a zombie
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()


_BANNER = re.compile(
    r"^(Edge TPU Compiler version|Started a compilation timeout timer|Compilation child process completed)"
)


def _compiler_message(output: str, limit: int = 500, banner: bool = False) -> str:
    """The compiler's own words on one line (banner lines dropped unless ``banner``)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if not banner:
        lines = [ln for ln in lines if not _BANNER.match(ln)]
    text = "; ".join(lines)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tpu_share(report: Any) -> tuple[int, int]:
    """``(tpu_ops, total_ops)`` of a compiler report dict or an offline CompatReport."""
    if hasattr(report, "tpu_ops") and hasattr(report, "total_ops"):
        return int(report.tpu_ops), int(report.total_ops)
    return int(report.get("tpu_ops") or 0), int(report.get("total_ops") or 0)


def tpu_op_threshold(report: Any, min_share: float, fail: bool = False) -> str | None:
    """Compare the share of ops on the Edge TPU with ``--min-tpu-ops``.

    Args:
        report: the compiler's report dict (after compiling) or the offline
            :class:`~edgekit.tflite.edgetpu_rules.CompatReport` (no compiler).
        min_share: 0..1, e.g. 0.95.
        fail: raise instead of returning a warning (``--strict-tpu-ops``).

    Returns:
        None when the share is met, else a one-line warning.

    Raises:
        UsageError: ``min_share`` outside 0..1.
        CompilerError: below the threshold and ``fail`` is set.
    """
    if not 0.0 <= float(min_share) <= 1.0:
        raise UsageError(f"--min-tpu-ops {min_share} is not a share", "give a number from 0 to 1, e.g. 0.95")
    if isinstance(report, dict) and (report.get("tpu_ops") is None or not report.get("total_ops")):
        message = f"edgetpu_compiler's output gave no readable op counts: --min-tpu-ops {float(min_share):g} unchecked"
        if fail:
            raise CompilerError(message, "run the compiler by hand (edgetpu_compiler -s MODEL) to see its report")
        return message
    tpu, total = tpu_share(report)
    share = tpu / total if total else 0.0
    if share >= float(min_share):
        return None
    what = "are predicted to run" if hasattr(report, "cut") else "run"
    message = (
        f"only {tpu} of {total} ops ({share:.0%}) {what} on the Edge TPU, below --min-tpu-ops {float(min_share):g}"
    )
    if fail:
        raise CompilerError(message, "see which ops fall back: edgekit inspect MODEL --target edgetpu")
    return message


def compile_for_edgetpu(
    int8_model: str | Path,
    out_dir: str | Path,
    *,
    compiler: str | None = None,
    min_runtime_version: int | None = None,
    min_tpu_ops: float | None = None,
    strict_tpu_ops: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """The whole Edge TPU step of ``edgekit build``: offline check, compile, threshold.

    Returns a JSON-ready dict for the bundle manifest: ``status`` ("compiled" /
    "not compiled"), ``reason``, ``compiled_file`` (name in ``out_dir`` or None),
    ``min_runtime_version``, ``offline`` (the CompatReport dict), ``compiler`` (the
    compiler report or None) and ``warnings`` (lines for build.log / the console).

    Raises:
        CompilerError: compile failure/timeout/0 ops mapped, or the threshold with
            ``strict_tpu_ops``.
    """
    from edgekit.tflite.edgetpu_rules import check_model

    offline = check_model(int8_model, min_runtime_version)
    result = compile_model(int8_model, out_dir, compiler, timeout_s, min_runtime_version)
    warnings: list[str] = []
    if result.status != "compiled":
        # Without the compiler the prediction is all there is; with it, its report wins.
        warnings += [*offline.warnings, result.reason]
    judged = result.report if result.status == "compiled" else offline
    if min_tpu_ops is not None:
        message = tpu_op_threshold(judged, min_tpu_ops, fail=strict_tpu_ops)
        if message:
            warnings.append(message)
    if result.status == "compiled":
        warnings += report_warnings(result.report, checked=min_tpu_ops is not None)
    return {
        "status": result.status,
        "reason": result.reason,
        "compiled_file": result.compiled_path.name if result.compiled_path else None,
        "min_runtime_version": min_runtime_version,
        "offline": offline.to_dict(),
        "compiler": result.report or None,
        "warnings": warnings,
    }
