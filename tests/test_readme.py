"""README examples stay true: every `edgekit ...` line parses, and the Python example runs."""

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
