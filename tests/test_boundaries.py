"""The device side never imports TensorFlow, Keras or torch (checked in a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys

DEVICE_MODULES = [
    "edgekit",
    "edgekit.runtime",
    "edgekit.runtime.litert",
    "edgekit.runtime.onnxrt",
    "edgekit.runtime.fake",
    "edgekit.image",
    "edgekit.bundle",
    "edgekit.camera",
    "edgekit.metrics",
    "edgekit.results",
    "edgekit.pipeline",
    "edgekit.commands.run",
    "edgekit.bench",
    "edgekit.vector",
    "edgekit.vector.camera",
    "edgekit.vector.face",
    "edgekit.vector.speech",
    "edgekit.vector.connection",
    "robot.signs",
    "edgekit.serve.daemon",
    "edgekit.serve.publish",
    "edgekit.serve.http",
    "edgekit.serve.config",
    "edgekit.runtime.tensorrt",
    "edgekit.runtime.trt_engine",
    "edgekit.runtime.onnxrt_gpu",
    "edgekit.commands.doctor",
    "edgekit.commands.inspect",
]

PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
# Opening a runtime imports its backend: that must not drag TensorFlow in either.
import ai_edge_litert.interpreter, onnxruntime  # noqa: F401
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "torch")
                        or m.startswith("edgekit.builders"))))
"""


def test_device_side_imports_no_tensorflow_keras_or_torch():
    done = subprocess.run([sys.executable, "-c", PROBE, *DEVICE_MODULES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_run_and_bench_verbs_stay_light():
    # Building the CLI parser imports every verb's module: run and bench must stay device-side.
    probe = (
        "import sys, json; from edgekit.cli import build_parser; build_parser(); import edgekit.commands.run, "
        "edgekit.bench; print(json.dumps([m for m in ('tensorflow', 'keras', 'torch') if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
