"""``edgekit toolchain install NAME``: a pinned venv for one vendor stack, under the user's cache.

The steps, each a program run with an argument list (never a shell): check the Python the
vendor's wheels need and Java where a step runs it (before minutes of downloads), ``python -m
venv``, ``pip install`` of the spec's pins (its output kept in ``install.log``), an import of
the stack's main module in the new interpreter, then ``toolchain.json`` with the versions, the
size on disk and the time taken. The record is written last: an interrupted install leaves a
folder without one, which nothing uses and the next install replaces.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from edgekit.errors import EXIT_RUNTIME, EdgekitError, OutputError, TargetError, first_line
from edgekit.toolchain.specs import ToolchainSpec, get_spec
from edgekit.toolchain.store import Installed, read_record, toolchains_root, write_record

log = logging.getLogger("edgekit.toolchain")

JAVA_FIX = "sudo apt-get install openjdk-17-jre-headless (Debian/Ubuntu), then run the install again"


class InstallFailed(EdgekitError):
    """pip, venv or the import check failed: the machine or the registry, not the command (exit 1)."""

    exit_code = EXIT_RUNTIME


def python_version(python: str) -> str | None:
    """``major.minor`` of the interpreter ``python``, or None when it cannot be run."""
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def base_python(spec: ToolchainSpec, given: str | None = None) -> str:
    """The interpreter to make the venv from: ``given``, else edgekit's own base Python, else
    ``python3.X`` on PATH, whichever is the version the spec needs; TargetError otherwise."""
    candidates = [given] if given else [getattr(sys, "_base_executable", sys.executable), sys.executable,
                                        shutil.which(f"python{spec.python}")]
    seen = []
    for python in filter(None, candidates):
        version = python_version(python)
        if version == spec.python:
            return python
        seen.append(f"{python} is {version or 'not runnable'}")
    raise TargetError(f"the {spec.name} toolchain needs Python {spec.python} ({'; '.join(seen)})",
                      f"install python{spec.python} and pass --python /path/to/python{spec.python}")


def java_major(java: str | None = None) -> tuple[int, str]:
    """(major version, version text) of ``java`` (PATH's by default); (0, why) when it is missing."""
    java = java or shutil.which("java")
    if not java:
        return 0, "no java on PATH"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 0, f"{java} cannot be run: {first_line(exc)}"
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return 0, f"{java} -version says {first_line(out.stderr or out.stdout)!r}"
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_392" is Java 8
        major = int(match.group(2))
    return major, first_line(out.stderr or out.stdout)


def check_java(spec: ToolchainSpec, java: str | None = None) -> str:
    """The Java version text when the spec needs Java and it is there; TargetError with the fix otherwise."""
    if not spec.needs_java:
        return ""
    major, text = java_major(java)
    if major < spec.needs_java:
        found = text if major == 0 else f"Java {major} ({text})"
        raise TargetError(f"the {spec.name} toolchain needs Java {spec.needs_java} or newer: {found}", JAVA_FIX)
    return text


def _run_logged(argv: list[str], log_file: Path, what: str) -> None:
    """Run ``argv`` with its output appended to ``log_file``; InstallFailed with its last line otherwise."""
    with open(log_file, "a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              check=False).returncode
    if code != 0:
        tail = [ln for ln in log_file.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        raise InstallFailed(f"{what} failed (exit {code}): {tail[-1][:240] if tail else 'no output'}",
                            f"read {log_file}; fix what it says and run the install again")


def folder_size_mb(folder: Path) -> float:
    """Bytes on disk under ``folder`` (symlinks not followed), in MB (10^6)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_blocks * 512
        except OSError:
            continue
    return round(total / 1e6, 1)


def pip_versions(python: Path) -> dict[str, str]:
    """Every distribution in the environment of ``python`` and its version (``pip list``)."""
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                         capture_output=True, text=True, timeout=300, check=False)
    try:
        # one spelling per distribution: pip lists "model_compression_toolkit" as its metadata says
        return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(out.stdout)}
    except (ValueError, KeyError, TypeError):
        return {}


def install(name: str, root: Path | None = None, force: bool = False, python: str | None = None,
            say: Callable[[str], None] = log.warning) -> Installed:
    """Install toolchain ``name`` (see the module's docstring) and return its record.

    An installed toolchain is returned as it is unless ``force``. ``say`` gets one line per step.
    """
    spec = get_spec(name)
    root = toolchains_root() if root is None else root
    folder = root / spec.name
    existing = read_record(folder)
    if existing is not None and not force:
        say(f"{spec.name} is already installed in {folder} (--force reinstalls)")
        return existing
    java = check_java(spec)
    base = base_python(spec, python)
    if folder.exists():
        shutil.rmtree(folder)
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        raise OutputError(f"cannot create {folder}: {exc.strerror}", "make it writable, or set $EDGEKIT_TOOLCHAINS"
                          ) from exc
    return _install_into(spec, folder, base, java, say)


def _install_into(spec: ToolchainSpec, folder: Path, base: str, java: str, say: Callable[[str], None]) -> Installed:
    """The venv, pip, the import check and the record, in ``folder`` (which exists and is empty)."""
    log_file = folder / "install.log"
    started = time.monotonic()
    say(f"creating {folder / 'venv'} from {base}")
    _run_logged([base, "-m", "venv", str(folder / "venv")], log_file, "python -m venv")
    python = folder / "venv" / "bin" / "python"
    say(f"pip install {' '.join(spec.requirements)} (log: {log_file})")
    _run_logged([str(python), "-m", "pip", "install", "--no-input", "--progress-bar", "off",
                 "--disable-pip-version-check", *spec.requirements], log_file, "pip install")
    if spec.no_deps:
        _run_logged([str(python), "-m", "pip", "install", "--no-input", "--progress-bar", "off",
                     "--disable-pip-version-check", "--no-deps", *spec.no_deps], log_file, "pip install --no-deps")
    say(f"checking that the new interpreter imports {spec.probe}")
    _run_logged([str(python), "-c", f"import {spec.probe}"], log_file, f"import {spec.probe}")
    every = pip_versions(python)
    installed = Installed(
        name=spec.name, path=folder, python=spec.python,
        versions={d: every.get(d, "?") for d in spec.versions},
        size_mb=folder_size_mb(folder), install_s=round(time.monotonic() - started, 1),
        installed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), java=java,
        extra={"requirements": [*spec.requirements, *spec.no_deps], "all_versions": every},
    )
    write_record(installed)
    say(f"{spec.name} installed: {installed.size_mb / 1000:.2f} GB in {installed.install_s:.0f} s")
    return installed
