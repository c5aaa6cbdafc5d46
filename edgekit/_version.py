"""The one place the version is written (read by the CLI, the build provenance and doctor)."""

__version__ = "0.1.0"
