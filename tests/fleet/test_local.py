"""The device's versions folder: ``current`` flipped in one rename, and the half-made links a daemon
killed mid-flip left (``.current.tmp-PID``) removed by the next flip, never a running daemon's."""

from __future__ import annotations

import os
import subprocess
import sys

from edgekit.fleet.local import VersionsDir


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_flip_points_current_and_sweeps_only_dead_daemons_links(tmp_path):
    local = VersionsDir(tmp_path)
    v1, v2 = "a" * 64, "b" * 64  # version names are content hashes
    for version in (v1, v2):
        (local.versions / version).mkdir(parents=True)
    dead = tmp_path / f".current.tmp-{_dead_pid()}"
    alive = tmp_path / f".current.tmp-{os.getppid()}"  # the test runner: running
    for link in (dead, alive):
        link.symlink_to(f"versions/{v1}")
    local.flip(v2)
    assert local.current_version() == v2
    assert not dead.is_symlink() and alive.is_symlink()
    assert sorted(p.name for p in tmp_path.glob(".current.tmp-*")) == [alive.name]
