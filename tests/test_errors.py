"""edgekit.errors: the one error printer every command line uses, and the first-line quote."""

from __future__ import annotations

import io

from edgekit.errors import BundleError, UsageError, VerificationFailed, first_line, print_error


def test_print_error_prints_the_message_then_the_fix_and_returns_the_exit_code():
    out = io.StringIO()
    code = print_error("edgekit run", BundleError("no edgekit.json in dist/x", "build it with edgekit build"), out)
    assert out.getvalue() == "edgekit run: error: no edgekit.json in dist/x\n  fix: build it with edgekit build\n"
    assert code == 2


def test_print_error_without_a_hint_is_one_line_and_keeps_the_errors_own_exit_code():
    out = io.StringIO()
    assert print_error("robot.signs", VerificationFailed("accuracy dropped 4.1 points"), out) == 3
    assert out.getvalue() == "robot.signs: error: accuracy dropped 4.1 points\n"


def test_print_error_defaults_to_stderr(capsys):
    print_error("robot.train", UsageError("--epochs must be >= 1"))
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "robot.train: error: --epochs must be >= 1\n"


def test_first_line_quotes_one_line_of_a_long_message():
    exc = RuntimeError("\n  Op builtin_code out of range: 150.\nNode number 3 (CONV_2D) failed to prepare.\n")
    assert first_line(exc) == "Op builtin_code out of range: 150."
    assert first_line("x" * 500) == "x" * 240
    assert first_line("x" * 500, limit=10) == "x" * 10
    assert first_line("x" * 500, limit=None) == "x" * 500


def test_first_line_of_an_exception_without_a_message_is_its_type():
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ValueError("   ")) == "ValueError"
    assert first_line("") == ""
