"""One grammar for every verb (edgekit/cli.py and edgekit/commands/): a model is the first
argument as BUNDLE[:VARIANT], --variant picks one and --variants several, --device is the
accelerator only, -v/-q are the verbosity flags, --json prints JSON on stdout, a wrong flag shows
the verb's usage, and every --help ends with real examples that parse."""

from __future__ import annotations

import argparse
import os
import shlex

import pytest

from edgekit.cli import EXAMPLES, EXIT_CODES, VERBS, build_parser, main


def verb_parser(verb: str) -> argparse.ArgumentParser:
    parser = build_parser(verb)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


def visible_flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def positionals(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if not a.option_strings]


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_has_the_same_verbosity_and_json_flags(verb):
    flags = visible_flags(verb_parser(verb))
    assert {"-v", "--verbose", "-q", "--quiet", "--debug", "--json"} <= flags
    assert not {f for f in flags if "log-level" in f or f == "--silent"}  # -v/-q only


@pytest.mark.parametrize("verb", ["run", "bench", "inspect", "serve"])
def test_a_model_is_the_first_argument_as_bundle_variant(verb):
    first = positionals(verb_parser(verb))[0]
    assert "BUNDLE" in (first.metavar or first.dest.upper()) or first.dest in ("model", "models")
    flags = visible_flags(verb_parser(verb))
    assert ("--variants" if verb == "bench" else "--variant") in flags
    assert not {"--model-name", "--bundle", "--device-name"} & flags  # old spellings: hidden aliases


@pytest.mark.parametrize("verb", list(VERBS))
def test_device_means_the_accelerator_wherever_it_is_taken(verb):
    p = verb_parser(verb)
    device = [a for a in p._actions if "--device" in a.option_strings]
    if device:
        assert "edge tpu" in device[0].help.lower() or "accelerator" in device[0].help.lower()
    assert "--device-name" not in visible_flags(p)


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_help_ends_with_real_examples_and_the_exit_codes(verb):
    text = verb_parser(verb).format_help()
    assert text.rstrip().endswith(EXIT_CODES)
    examples = [line.strip() for line in text.split("examples:")[1].splitlines() if line.startswith("  edgekit ")]
    assert 2 <= len(examples) <= 4 and examples == EXAMPLES[verb]


@pytest.mark.parametrize(("verb", "example"), [(v, e) for v, es in EXAMPLES.items() for e in es])
def test_every_example_parses_with_its_verb(verb, example):
    words = shlex.split(example)
    assert words[:2] == ["edgekit", verb]
    args, unknown = build_parser(verb).parse_known_args(words[1:])
    assert unknown == [] and args.verb == verb


def test_a_wrong_flag_prints_the_verbs_usage_not_the_top_level(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "dist/demo-cpu", "--camera", "synthetic", "--frobnicate"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("usage: edgekit run ") and "edgekit run: error: unrecognized arguments: --frobnicate" in err


def test_shell_completion_offers_target_names_and_deploy_kinds():
    from edgekit.options import target_completer
    from edgekit.target import available_targets

    for verb in ("build", "inspect"):
        target = next(a for a in verb_parser(verb)._actions if "--target" in a.option_strings)
        assert target.completer(prefix="") == available_targets()
    assert target_completer(prefix="cpu,ed") == ["cpu,edgetpu"]
    names = next(a for a in verb_parser("deploy")._actions if a.dest == "names")
    assert set(names.completer(prefix="")) == {"config", "systemd", "prometheus", "alerts", "all"}


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_with_json_also_writes_it_to_a_file(verb):
    assert "--json-file" in visible_flags(verb_parser(verb))


def test_json_file_writes_what_json_prints(tmp_path, capsys):
    out = tmp_path / "targets.json"
    assert main(["targets", "--json-file", str(out)]) == 0
    assert capsys.readouterr().out == "" and out.read_text().lstrip().startswith("[")
    # a folder that does not exist is a mistyped path (2, as bench's outputs); one refusing writes is 1
    assert main(["targets", "--json-file", str(tmp_path / "no" / "t.json")]) == 2
    assert "--json-file" in capsys.readouterr().err
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        assert main(["targets", "--json-file", str(tmp_path / "ro" / "t.json")]) == 1
        assert "cannot write" in capsys.readouterr().err


def test_the_exit_codes_are_documented_as_split():
    assert "1 runtime failure" in EXIT_CODES and "2 usage or input error" in EXIT_CODES
    assert "3 accuracy gate" in EXIT_CODES and "130/143" in EXIT_CODES


# ---- the robot demo's scripts: the same grammar ------------------------------------------------

ROBOT = ["signs", "thresholds", "collect", "train"]
ROBOT_WITH_BUNDLE = ["signs", "thresholds"]


def robot_parser(name: str) -> argparse.ArgumentParser:
    import importlib

    return importlib.import_module(f"robot.{name}").build_parser()


@pytest.mark.parametrize("name", ROBOT)
def test_robot_scripts_have_the_verbosity_flags_and_examples(name):
    p = robot_parser(name)
    assert {"-v", "--verbose", "-q", "--quiet"} <= visible_flags(p)
    from robot.cli import EXIT_CODES as ROBOT_EXIT_CODES

    text = p.format_help()
    assert text.rstrip().endswith(ROBOT_EXIT_CODES)
    examples = [line.strip() for line in text.split("examples:")[1].splitlines() if line.startswith("  python ")]
    assert 2 <= len(examples) <= 4


@pytest.mark.parametrize(("name", "example"), [
    (n, e) for n in ROBOT for e in __import__(f"robot.{n}", fromlist=["EXAMPLES"]).EXAMPLES])
def test_every_robot_example_parses_without_a_note(name, example, capsys):
    from robot.cli import parse

    words = shlex.split(example)
    assert words[:3] == ["python", "-m", f"robot.{name}"]
    parse(robot_parser(name), words[3:])
    assert "deprecated" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ROBOT_WITH_BUNDLE)
def test_robot_bundle_is_the_first_argument_and_bundle_is_a_noted_alias(name, capsys):
    from robot.cli import parse

    p = robot_parser(name)
    first = positionals(p)[0]
    assert first.metavar == "BUNDLE[:VARIANT]" and "--bundle" not in visible_flags(p)
    rest = ["--fake", "x"] if name == "signs" else ["--eval", "x"]
    assert parse(p, ["dist/demo-cpu:int8", *rest]).bundle == "dist/demo-cpu:int8"
    assert "deprecated" not in capsys.readouterr().err
    assert parse(robot_parser(name), ["--bundle", "dist/demo-cpu", *rest]).bundle == "dist/demo-cpu"
    assert "--bundle is deprecated; use BUNDLE[:VARIANT]" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["signs", "thresholds", "collect"])
def test_robot_json_is_stdout_and_json_file_a_file(name, capsys):
    from robot.cli import parse

    rest = {"signs": ["dist/demo-cpu", "--fake", "x"], "thresholds": ["dist/demo-cpu", "--eval", "x"],
            "collect": ["--camera", "synthetic", "--out", "d"]}[name]
    args = parse(robot_parser(name), [*rest, "--json"])
    assert args.json is True and args.json_file is None
    args = parse(robot_parser(name), [*rest, "--json-file", "r.json"])
    assert args.json is False and args.json_file == "r.json"
    assert "deprecated" not in capsys.readouterr().err
    args = parse(robot_parser(name), [*rest, "--json", "old.json"])  # the old spelling: a file, with a note
    assert args.json is False and args.json_file == "old.json"
    assert "--json FILE is deprecated; use --json-file old.json" in capsys.readouterr().err


def test_robot_json_before_the_bundle_is_the_switch():
    from robot.cli import parse

    args = parse(robot_parser("signs"), ["--json", "dist/demo-cpu", "--fake", "x"])
    assert args.json is True and args.bundle == "dist/demo-cpu"


@pytest.mark.parametrize("name", ROBOT)
def test_a_wrong_robot_flag_prints_that_scripts_usage(name, capsys):
    from robot.cli import parse

    with pytest.raises(SystemExit) as exit_:
        parse(robot_parser(name), ["--frobnicate"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"usage: python -m robot.{name} ")


def test_robot_json_is_finite(capsys):
    import argparse as ap

    from robot.cli import emit_json

    emit_json(ap.Namespace(json=True, json_file=None), {"score": float("nan"), "p50": float("inf"), "n": 3})
    assert capsys.readouterr().out.strip() == '{"score": null, "p50": null, "n": 3}'
