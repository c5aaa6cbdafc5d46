"""doctor reports the vendor toolchains from their records, and Java where imx500 is installed."""

from __future__ import annotations

from edgekit.doctor import Env, run_checks
from edgekit.doctor.base import INFO, MISSING, OK
from edgekit.doctor.toolchains import check_toolchains
from edgekit.toolchain.store import Installed, write_record


def _installed(root, name):
    folder = root / name
    (folder / "venv" / "bin").mkdir(parents=True)
    (folder / "venv" / "bin" / "python").write_text("")
    write_record(Installed(name=name, path=folder, python="3.11", versions={"pkg": "1.0"}, size_mb=5890.0))


def test_missing_toolchains_are_information_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(tmp_path))
    checks = {c.name: c for c in check_toolchains(Env())}
    assert checks["rk3588 toolchain"].status == INFO
    assert checks["rk3588 toolchain"].fix == "edgekit toolchain install rk3588"
    assert "toolchain" in {c.group for c in run_checks(Env())}


def test_an_installed_toolchain_shows_its_versions_and_imx500_checks_java(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(tmp_path))
    _installed(tmp_path, "rk3588")
    _installed(tmp_path, "imx500")
    checks = {c.name: c for c in check_toolchains(Env(path=str(tmp_path / "no-bin")))}
    assert checks["rk3588 toolchain"].status == OK and "pkg 1.0 (5.9 GB)" in checks["rk3588 toolchain"].detail
    assert checks["Java"].status == MISSING and "openjdk-17" in checks["Java"].fix
