"""The ``edgekit`` entry point stays light: ``--version`` and ``--help`` import no verb module,
and importing a verb module loads no heavy library (those wait for the verb's ``main``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from edgekit.cli import VERBS

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("tensorflow", "keras", "torch", "onnx", "onnxruntime", "ai_edge_litert", "tflite_runtime", "matplotlib",
         "paho", "tensorrt", "anki_vector")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_version_and_help_import_no_verb_module():
    code = (
        "import sys\nfrom edgekit.cli import main\n"
        "for argv in (['--version'], ['--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print('loaded:', sorted(m for m in sys.modules if m.startswith('edgekit.commands')"
        " or m in ('edgekit.options', 'edgekit.bench.runner', 'edgekit.serve.daemon')))\n"
    )
    out = python(code)
    assert out.returncode == 0, out.stderr
    assert "edgekit " in out.stdout and "VERB" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "loaded: []"


def test_verb_modules_import_nothing_heavy():
    code = (
        "import importlib, sys\n"
        f"for name, _ in {list(VERBS.values())!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    out = python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_verb_takes_verbose_and_quiet():
    from edgekit.cli import build_parser

    for verb in VERBS:
        parser = build_parser(verb)
        sub = next(a for a in parser._actions if a.dest == "verb").choices[verb]
        flags = {s for a in sub._actions for s in a.option_strings}
        assert {"-v", "--verbose", "-q", "--quiet", "--debug"} <= flags, verb
        if verb not in ("serve", "deploy"):
            assert "--json" in flags, verb  # one grammar: --json is JSON on stdout


def test_deploy_lists_and_writes_the_shipped_files(tmp_path, capsys):
    from edgekit.cli import main

    assert main(["deploy"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in ("config", "systemd", "prometheus", "alerts"))
    assert main(["deploy", "all", "--out", str(tmp_path)]) == 0
    shipped = ROOT / "deploy"
    for name in ("serve.example.toml", "edgekit.service", "prometheus.yml", "alerts.yml"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes()
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644
    (tmp_path / "edgekit.service").write_text("edited\n")
    capsys.readouterr()
    assert main(["deploy", "config", "systemd", "--out", str(tmp_path)]) == 2  # nothing is overwritten...
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "edgekit.service").read_text() == "edited\n"  # ...not even the other file
    assert main(["deploy", "systemd", "--out", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "edgekit.service").read_bytes() == (shipped / "edgekit.service").read_bytes()
    assert main(["deploy", "alerts", "--out", "-"]) == 0
    assert "EdgekitDown" in capsys.readouterr().out
    assert main(["deploy", "nginx", "--out", str(tmp_path)]) == 2
    assert "choose from: config, systemd, prometheus, alerts, all" in capsys.readouterr().err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_serve_writes_the_example_config(tmp_path, capsys):
    from edgekit.cli import main

    dest = tmp_path / "serve.toml"
    assert main(["serve", "--write-example-config", str(dest)]) == 0
    assert dest.read_bytes() == (ROOT / "deploy" / "serve.example.toml").read_bytes()
    assert main(["serve", "--write-example-config", str(dest)]) == 2
    assert "exists" in capsys.readouterr().err


def test_native_stderr_goes_to_the_log(capfd, caplog):
    import logging

    from edgekit.util.quiet import native_stderr_to_log

    log = logging.getLogger("ektest.quiet")  # outside "edgekit": the CLI's handler there is not involved
    with caplog.at_level(logging.DEBUG, logger="ektest.quiet"), native_stderr_to_log(log):
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\nERROR: something real\n")
    assert capfd.readouterr().err == ""  # nothing reached the terminal
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert levels == {"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.": logging.DEBUG,
                      "ERROR: something real": logging.WARNING}


def test_shell_completion_knows_the_verbs_and_their_flags(tmp_path):
    import pytest

    pytest.importorskip("argcomplete", reason="argcomplete not installed (pip install 'edgekit-vision[completion]')")
    out = tmp_path / "completions"

    def complete(line: str) -> set[str]:
        env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_STDOUT_FILENAME": str(out), "_ARGCOMPLETE_IFS": " ",
               "COMP_LINE": line, "COMP_POINT": str(len(line))}
        done = subprocess.run([sys.executable, "-m", "edgekit.cli"], env=env, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return set(out.read_text().split())

    assert complete("edgekit de") == {"deploy"}
    assert complete("edgekit bench --js") == {"--json", "--json-file"}


def test_deploy_makes_the_folder_it_was_given(tmp_path, capsys):
    from edgekit.cli import main

    out = tmp_path / "deploy-out"
    assert main(["deploy", "systemd", "prometheus", "alerts", "--out", f"{out}/"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["alerts.yml", "edgekit.service", "prometheus.yml"]
    assert main(["deploy", "config", "--out", str(tmp_path / "etc" / "edgekit") + "/"]) == 0  # one file, a folder
    assert (tmp_path / "etc" / "edgekit" / "serve.example.toml").is_file()
    (tmp_path / "plain").write_text("x")
    assert main(["deploy", "systemd", "alerts", "--out", str(tmp_path / "plain")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
