"""Exceptions edgekit raises. Library code never exits the process; the CLI turns
these into one line and a non-zero exit code."""

from __future__ import annotations


class EdgekitError(Exception):
    """Base class: a message saying what is wrong and a hint saying what to do."""

    exit_code = 2

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

    exit_code = 3
    results: list = []

    def with_results(self, results: list) -> VerificationFailed:
        self.results = results
        return self


class BackendUnavailable(EdgekitError):
    """A runtime library, delegate or provider that is not installed or not usable."""


class CameraError(EdgekitError):
    """A camera that cannot be opened or stopped delivering frames."""


class CompilerError(EdgekitError):
    """edgetpu_compiler failed, timed out or mapped nothing to the Edge TPU."""
