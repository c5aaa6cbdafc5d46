"""The cheap half of ``make docs-check`` (scripts/docs_check.py): every command in README.md and
docs/*.md is found, every ``edgekit`` and ``python -m robot.*`` command parses with its verb in the
current grammar (no unknown flag, no deprecated spelling), and every command docs-check does not
run says why."""

from __future__ import annotations

import importlib
import shlex

import pytest

from edgekit.cli import VERBS, build_parser
from scripts.docs_check import Command, commands

DOCUMENTED = commands()


def _first_segment(text: str) -> list[str]:
    """The words of the first command of a line (before a pipe, '&&' or ';')."""
    words = []
    for word in shlex.split(text):
        if word in ("|", "&&", ";", "||"):
            break
        words.append(word)
    return words


def test_the_docs_hold_commands_and_each_skipped_one_says_why():
    assert len(DOCUMENTED) > 60
    files = {c.file for c in DOCUMENTED}
    assert {"README.md", "docs/serve.md", "docs/detection.md"} <= files
    for c in DOCUMENTED:
        why = c.skip_reason()
        assert why is None or len(why) > 10


@pytest.mark.parametrize("command", [c for c in DOCUMENTED if _first_segment(c.text)[:1] == ["edgekit"]],
                         ids=lambda c: f"{c.file}:{c.line}")
def test_every_documented_edgekit_command_parses_in_the_current_grammar(command: Command, capsys):
    words = _first_segment(command.text)
    if words[1:2] == ["serve:"]:
        pytest.skip("an example of output")
    verb = words[1]
    assert verb in VERBS, f"{command.file}:{command.line}: unknown verb {verb}"
    args, unknown = build_parser(verb).parse_known_args(words[1:])
    assert unknown == [], f"{command.file}:{command.line}: {unknown}"
    assert "deprecated" not in capsys.readouterr().err, f"{command.file}:{command.line} uses an old spelling"


@pytest.mark.parametrize("command", [c for c in DOCUMENTED if " -m robot." in c.text],
                         ids=lambda c: f"{c.file}:{c.line}")
def test_every_documented_robot_command_parses(command: Command, capsys):
    words = _first_segment(command.text)
    from robot.cli import parse

    module = importlib.import_module(words[2])
    args = parse(module.build_parser(), words[3:])  # parse: where the old spellings print their note
    assert args is not None
    assert "deprecated" not in capsys.readouterr().err, f"{command.file}:{command.line} uses an old spelling"
