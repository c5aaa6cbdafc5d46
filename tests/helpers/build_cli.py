"""``edgekit build`` run in this process for tests that read its one error line: the exit code, stdout
and stderr (never a traceback), and a build refused before its model is loaded."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from tests.conftest import CALIB


def build_cli(*argv) -> tuple[int, str, str]:
    """``edgekit build ARGV...``: (exit code, stdout, stderr); no traceback may reach stderr."""
    from edgekit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["build", *map(str, argv)])
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


def refused_before_loading(monkeypatch, tmp_path: Path, task: str, *extra) -> tuple[int, list[str], str]:
    """A ``--task`` build with ``extra`` flags whose model must never be loaded (a loader that fails
    the test stands in): (exit code, its ``edgekit build: error:`` lines, stderr)."""
    import edgekit.builders.build as build_module

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(build_module, "load_source_model", loaded)
    code, _, err = build_cli("--model", tmp_path / "m.tflite", "--target", "cpu", "--calib", CALIB,
                             "--out", tmp_path / "o", "--task", task, *extra)
    return code, [ln for ln in err.splitlines() if ln.startswith("edgekit build: error:")], err
