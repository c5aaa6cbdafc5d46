"""Fault catalogue 3, item 9: ``--max-memory SIZE`` caps a build's memory.

A build whose estimate is over the cap is refused before the model runs (one line, a fix,
exit 2, nothing left); int8 recovery attempts, each a conversion as heavy as the first, are
skipped and said once the build has peaked over the cap.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgekit.builders.host.resources import GB, parse_size
from edgekit.errors import UsageError
from tests.conftest import CALIB, DEMO_MODEL
from tests.helpers.faults import assert_nothing_left, assert_refused, edgekit, snapshot


@pytest.mark.parametrize("text,size", [("4G", 4 * GB), ("4GB", 4 * GB), ("4GiB", 4 * GB), ("1.5g", int(1.5 * GB)),
                                       ("512M", 512 << 20), ("1000000", 1000000)])
def test_sizes_are_read_in_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "4X"])
def test_a_size_that_is_not_one_is_refused(text):
    with pytest.raises(UsageError, match="--max-memory"):
        parse_size(text)


def test_bad_max_memory_flag_is_argparse_usage(capsys, tmp_path):
    result = edgekit(capsys, "build", "--model", DEMO_MODEL, "--target", "cpu", "--calib", CALIB,
                     "--out", tmp_path / "dist", "--max-memory", "lots")
    assert_refused(result, "--max-memory")


def test_a_build_over_the_cap_is_refused_before_the_model_runs(capsys, tmp_path):
    before = snapshot(tmp_path)
    result = edgekit(capsys, "build", "--model", DEMO_MODEL, "--target", "cpu", "--calib", CALIB,
                     "--calib-count", "12", "--out", tmp_path / "dist", "--quiet", "--max-memory", "100M")
    assert_refused(result, "--max-memory caps it at 0.1 GB", "needs about")
    assert "raise --max-memory" in result.err
    assert_nothing_left(before, tmp_path)


class _Log:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)


def test_recovery_attempts_over_the_cap_are_skipped_and_said(monkeypatch):
    import edgekit.builders.host.resources as resources
    from edgekit.builders.int8.recovery import _over_cap

    log = _Log()
    ctx = SimpleNamespace(request=SimpleNamespace(max_memory=1 * GB), log=log)
    target = SimpleNamespace(name="cpu")
    monkeypatch.setattr(resources, "build_peak", lambda: int(1.4 * GB))
    assert _over_cap(ctx, target, "more calibration")
    assert log.lines == ["[cpu] int8 recovery: more calibration: skipped, it needs about 1.40 GB "
                         "(the build's peak so far), over --max-memory 1.00 GB"]
    monkeypatch.setattr(resources, "build_peak", lambda: int(0.6 * GB))
    assert not _over_cap(ctx, target, "more calibration")
    ctx.request.max_memory = None  # no cap: never skipped
    monkeypatch.setattr(resources, "build_peak", lambda: 100 * GB)
    assert not _over_cap(ctx, target, "more calibration") and len(log.lines) == 1
