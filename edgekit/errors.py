"""Exceptions edgekit raises. Library code never exits the process; the CLI turns
these into one line and a non-zero exit code."""

from __future__ import annotations

import sys
from typing import TextIO

# The exit codes every edgekit command line and the robot demo's scripts use. Each error class
# carries its own, so a script can tell "fix your command" (2) from "the world failed" (1)
# without parsing the message.
EXIT_OK = 0
EXIT_RUNTIME = 1  # camera, device, disk: the command was right, the run failed
EXIT_USAGE = 2  # arguments, model, images, bundle, URI: input the user must fix
EXIT_GATE = 3  # the converted model missed its accuracy gate


class EdgekitError(Exception):
    """Base class: a message saying what is wrong and a hint saying what to do.

    ``exit_code`` is what the command line exits with: 2 (usage/input) unless a subclass says
    otherwise.
    """

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(EdgekitError):
    """Arguments that cannot work together or do not exist."""


class UnknownOptionError(UsageError):
    """A caller passed an option the chosen plug-in does not take; ``key`` names it."""

    def __init__(self, message: str, hint: str | None = None, key: str = ""):
        super().__init__(message, hint)
        self.key = key


class ModelError(EdgekitError):
    """A model file that is missing, corrupt or of an unsupported kind."""


class CalibrationError(EdgekitError):
    """A calibration or evaluation image folder that cannot be used."""


class TargetError(EdgekitError):
    """An unknown target, or a target whose tools are not installed."""


class BundleError(EdgekitError):
    """A bundle that is missing, corrupt, tampered with or from a newer edgekit."""


class VerificationFailed(EdgekitError):
    """The converted model lost more accuracy than allowed (``results`` holds every target's outcome)."""

    exit_code = EXIT_GATE
    results: list = []

    def with_results(self, results: list) -> VerificationFailed:
        self.results = results
        return self


class BackendUnavailable(EdgekitError):
    """A runtime library, delegate or provider that is not installed or not usable."""


class DeviceError(BackendUnavailable):
    """An accelerator that is not there or fails at run time (no Edge TPU on the bus, no CUDA device,
    a provider ONNX Runtime dropped), or whose runtime is not installed (TensorRT, cuda-python,
    onnxruntime-gpu or its CUDA/TensorRT provider): the command was right, the machine was not
    (exit 1). A missing edgekit extra for the CPU (LiteRT, ONNX Runtime) stays a BackendUnavailable:
    exit 2, with the pip command that fixes it."""

    exit_code = EXIT_RUNTIME


class DelegateError(DeviceError):
    """A runtime delegate (libedgetpu) that is missing or cannot be loaded when a model runs (exit 1)."""


class CameraError(EdgekitError):
    """A camera URI or option that cannot work (exit 2); see :class:`CameraUnavailable` for a camera
    that is named right but cannot be reached."""


class CameraUnavailable(CameraError):
    """A camera or stream that cannot be opened now or was lost while running (a dead device, a
    refused RTSP connection, a stalled grabber): exit 1. ``except CameraError`` still catches it."""

    exit_code = EXIT_RUNTIME


class OutputError(EdgekitError):
    """An output that cannot be written: a full disk, an unwritable folder, stdout failing (exit 1)."""

    exit_code = EXIT_RUNTIME


class CompilerError(EdgekitError):
    """edgetpu_compiler failed, timed out or mapped nothing to the Edge TPU."""


def print_error(prog: str, exc: EdgekitError, file: TextIO | None = None) -> int:
    """Print ``exc`` the way every edgekit command line does and return its exit code.

    Two lines at most, on ``file`` (default: stderr)::

        edgekit build: error: no such model file: m.keras
          fix: give the path of a .keras, SavedModel, .onnx or .tflite model

    Used by ``edgekit`` itself and by the robot demo's scripts, so that an error reads the same
    whichever of them printed it.
    """
    out = sys.stderr if file is None else file
    print(f"{prog}: error: {exc.message}", file=out)
    if exc.hint:
        print(f"  fix: {exc.hint}", file=out)
    return exc.exit_code


def first_line(text: object, limit: int | None = 240) -> str:
    """The first non-blank line of ``text`` (an exception or a string), at most ``limit`` characters.

    For quoting another library's error inside one of ours: its message may run to many lines
    (a C++ stack, a parser's context) and edgekit's errors are one line. An exception whose
    message is empty gives its type name, so the quote never reads as nothing.
    """
    lines = str(text).strip().splitlines()
    line = lines[0].strip() if lines else ""
    if not line and isinstance(text, BaseException):
        line = type(text).__name__
    return line if limit is None else line[:limit]
