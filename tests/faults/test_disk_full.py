"""Fault catalogue, a full disk: a real 64-256 KiB tmpfs (skipped with the reason where mount is refused).

Whatever is being written (a bundle, the build's work directory, a benchmark report, the
deployment files), a full disk is one line with a fix, a non-zero exit, and nothing
half-written left on the full filesystem.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import CALIB, DEMO_MODEL
from tests.helpers.faults import assert_refused, edgekit


@pytest.fixture
def full_disk(tmp_path):
    """A tmpfs of 256 KiB (a demo bundle is 0.5 MiB): mounted, yielded, unmounted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=10)


def _left(mnt: Path) -> list[str]:
    return sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*"))


def _build(out: Path) -> list[str]:
    return ["build", "--model", str(DEMO_MODEL), "--target", "cpu", "--variants", "fp32", "--calib", str(CALIB),
            "--calib-count", "12", "--out", str(out), "--quiet"]


@pytest.mark.slow
def test_build_onto_a_full_disk(capsys, full_disk):
    assert_refused(edgekit(capsys, *_build(full_disk / "dist")), "space", code=1)  # a runtime failure
    assert _left(full_disk) in ([], ["dist"]), _left(full_disk)


@pytest.mark.slow
def test_build_with_the_temp_dir_on_a_full_disk(tmp_path, capsys, full_disk, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(full_disk))
    monkeypatch.setenv("TMPDIR", str(full_disk))
    result = edgekit(capsys, *_build(tmp_path / "dist"))
    assert_refused(result, "space", code=1)
    assert _left(full_disk) == [], _left(full_disk)
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []


def _fill(mnt: Path) -> None:
    """Leave a few bytes free: the next write of any size fails with ENOSPC."""
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_bench_report_onto_a_full_disk(capsys, full_disk, cpu_bundle):
    _fill(full_disk)
    report = full_disk / "report.json"
    result = edgekit(capsys, "bench", str(cpu_bundle), "--min-count", "5", "--repeats", "1", "--warmup", "0",
                     "--json-file", str(report), "--quiet")
    assert_refused(result, "report.json", code=1)  # a full disk: a runtime failure
    assert _left(full_disk) == ["filler"], _left(full_disk)


@pytest.mark.parametrize("argv", [
    ("deploy", "alerts", "--out", "{mnt}/deploy"),
    ("serve", "--write-example-config", "{mnt}/serve.toml"),
])
def test_deployment_files_onto_a_full_disk(capsys, full_disk, argv):
    _fill(full_disk)
    (full_disk / "deploy").mkdir(exist_ok=True) if argv[0] == "deploy" else None
    result = edgekit(capsys, *[a.format(mnt=full_disk) for a in argv])
    assert_refused(result, "", code=1)  # a full disk: a runtime failure
    assert set(_left(full_disk)) <= {"filler", "deploy"}, _left(full_disk)
