"""Where toolchains live, what their record says, the checks made before a long install, and the verb."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from edgekit.cli import main
from edgekit.errors import TargetError, UsageError
from edgekit.toolchain import install as install_mod
from edgekit.toolchain.specs import IMX500, RK3588, TOOLCHAINS, get_spec
from edgekit.toolchain.store import find_toolchain, has_toolchain, installed_toolchains, read_record, toolchains_root


def test_the_root_is_under_the_users_cache_and_follows_xdg_and_the_override(tmp_path):
    assert toolchains_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "edgekit" / "toolchains"
    assert toolchains_root({"HOME": "/x", "EDGEKIT_TOOLCHAINS": str(tmp_path)}) == tmp_path
    assert toolchains_root({}).parts[-2:] == ("edgekit", "toolchains")


def test_the_pins_are_the_ones_checked_together():
    assert "rknn-toolkit2==2.5.0" in RK3588.requirements and "torch==2.4.0" in RK3588.requirements
    assert "numpy==1.26.4" in RK3588.requirements
    assert "model-compression-toolkit==2.5.1" in IMX500.requirements and IMX500.needs_java == 17
    assert any(r.startswith("imx500-converter[pt]==3.19") for r in IMX500.requirements)
    assert "onnx2torch==1.5.15" in IMX500.no_deps and "torch==2.13.0" in IMX500.requirements
    assert set(TOOLCHAINS) == {"rk3588", "imx500"}
    with pytest.raises(UsageError, match="choose one of: rk3588, imx500"):
        get_spec("hailo")


def test_an_unfinished_install_is_no_toolchain(tmp_path, fake_toolchain):
    (tmp_path / "rk3588" / "venv").mkdir(parents=True)  # venv made, record never written
    assert read_record(tmp_path / "rk3588") is None and installed_toolchains(tmp_path) == []
    with pytest.raises(TargetError, match="not installed") as info:
        find_toolchain("rk3588", tmp_path)
    assert info.value.hint == "edgekit toolchain install rk3588"
    assert has_toolchain("rk3588", fake_toolchain.path.parent)[0]
    assert [t.name for t in installed_toolchains(fake_toolchain.path.parent)] == ["rk3588"]


def _fake_java(tmp_path, says: str):
    java = tmp_path / "java"
    java.write_text(f"#!/bin/sh\necho '{says}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return str(java)


@pytest.mark.parametrize(("says", "major"), [('openjdk version "17.0.15" 2025-04-15', 17),
                                              ('java version "1.8.0_392"', 8), ('openjdk version "21" 2023', 21)])
def test_java_versions_are_read_as_their_major(tmp_path, says, major):
    assert install_mod.java_major(_fake_java(tmp_path, says))[0] == major


def test_a_missing_or_old_java_is_refused_before_the_install_with_the_one_line_fix(tmp_path):
    with pytest.raises(TargetError, match="needs Java 17 or newer: Java 8") as info:
        install_mod.check_java(IMX500, _fake_java(tmp_path, 'java version "1.8.0_392"'))
    assert "apt-get install openjdk-17-jre-headless" in info.value.hint
    assert install_mod.check_java(RK3588, "/nonexistent/java") == ""  # rk3588 runs no Java
    assert install_mod.java_major("/nonexistent/java")[0] == 0


def test_a_python_of_another_version_is_refused_with_the_fix(tmp_path):
    spec = get_spec("rk3588")
    assert install_mod.base_python(spec, sys.executable) == sys.executable  # this suite runs on 3.11
    with pytest.raises(TargetError, match="needs Python 3.11"):
        install_mod.base_python(spec, str(tmp_path / "no-python"))


def test_install_returns_an_installed_toolchain_without_touching_it(fake_toolchain):
    said = []
    got = install_mod.install("rk3588", root=fake_toolchain.path.parent, say=said.append)
    assert got.path == fake_toolchain.path and "already installed" in said[0]


def test_the_verb_lists_installed_and_missing_toolchains(fake_toolchain, monkeypatch, capsys):
    monkeypatch.setenv("EDGEKIT_TOOLCHAINS", str(fake_toolchain.path.parent))
    assert main(["toolchain", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["toolchains"]}
    assert rows["rk3588"]["installed"] and rows["rk3588"]["versions"] == {"rknn-toolkit2": "2.5.0-fake"}
    assert not rows["imx500"]["installed"] and rows["imx500"]["install"] == "edgekit toolchain install imx500"
    assert main(["toolchain", "list"]) == 0
    assert "imx500   not installed: edgekit toolchain install imx500" in capsys.readouterr().out
    assert main(["toolchain", "install"]) == 2 and "which toolchain?" in capsys.readouterr().err
    assert main(["toolchain", "install", "hailo"]) == 2
