"""README examples stay true: every `edgekit ...` line parses, and the Python example runs; so does the
robot demo of docs/robot.md (moved there from README)."""

from __future__ import annotations

import re
import shlex

import pytest

from edgekit.cli import build_parser
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)
COMMANDS = [line.split("#")[0].strip() for lang, body in BLOCKS if lang in ("bash", "console")
            for line in body.splitlines() if line.strip().startswith("edgekit ")]


def test_readme_has_examples():
    assert len(COMMANDS) >= 3


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command):
    argv = shlex.split(command)[1:]
    args = build_parser().parse_args(argv)  # SystemExit on an unknown verb or flag
    assert args.verb == argv[0]


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    [code] = [body for lang, body in BLOCKS if lang == "python"]
    monkeypatch.chdir(ROOT)
    exec(compile(code.replace('"dist-api"', repr(str(tmp_path / "dist"))), "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cpu ") and float(out[0].split()[1]) >= 0.99
    assert out[1] == "bag"


ROBOT_BLOCKS = re.findall(r"```(\w+)\n(.*?)```", (ROOT / "docs" / "robot.md").read_text(), flags=re.S)
ROBOT = [line.split("#")[0].strip() for lang, body in ROBOT_BLOCKS if lang == "bash" for line in body.splitlines()
         if line.strip().startswith("python -m robot.")]


@pytest.mark.parametrize("command", ROBOT)
def test_robot_page_command_parses(command):
    import importlib

    argv = shlex.split(command)
    module = importlib.import_module(argv[2])
    module.build_parser().parse_args(argv[3:])


def test_robot_page_fake_demo_runs(demo_bundles, monkeypatch, capsys):
    from robot import signs

    # the first plain fake run (the acceptance run needs frames; the --json-file one writes into dist/)
    command = next(c for c in ROBOT if "--fake" in c and "--truth" not in c and "--json" not in c)
    argv = shlex.split(command)[3:]
    argv[0] = str(demo_bundles["cpu"].bundle)  # BUNDLE[:VARIANT] comes first
    monkeypatch.chdir(ROOT)
    assert signs.main([*argv, "--max-frames", "40", "--quiet"]) == 0
    assert "said" in capsys.readouterr().out
