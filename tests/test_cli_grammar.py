"""One grammar for every verb (edgekit/cli.py and edgekit/commands/): a model is the first
argument as BUNDLE[:VARIANT], --variant picks one and --variants several, --device is the
accelerator only, -v/-q are the verbosity flags, --json prints JSON on stdout, a wrong flag shows
the verb's usage, and every --help ends with real examples that parse."""

from __future__ import annotations

import argparse
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
