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
        " or m in ('edgekit.options', 'edgekit.bench', 'edgekit.serve.daemon')))\n"
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
