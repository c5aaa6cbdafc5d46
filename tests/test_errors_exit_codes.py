"""Exit codes by kind of failure (issue 27): 1 the world failed (camera, device, disk), 2 the user
must fix the command or its input, 3 the accuracy gate. A script retries on 1 and stops on 2."""

from __future__ import annotations

import shutil

import pytest

from edgekit.errors import (
    EXIT_GATE,
    EXIT_RUNTIME,
    EXIT_USAGE,
    BackendUnavailable,
    CameraError,
    CameraUnavailable,
    DelegateError,
    DeviceError,
    OutputError,
    VerificationFailed,
    print_error,
)
from tests.helpers.faults import assert_refused, edgekit


def _run(capsys, model, camera: str, *extra: str):
    return edgekit(capsys, "run", str(model), "--camera", camera, "--max-frames", "2", "--quiet", *extra)


def test_a_camera_that_is_not_there_exits_1(capsys, cpu_bundle):
    """A well-formed URI naming a device that does not exist: the command was right, the camera was not."""
    assert_refused(_run(capsys, cpu_bundle, "v4l2:37", "-O", "open_timeout_s=2"), "v4l2:37", code=EXIT_RUNTIME)


def test_a_refused_rtsp_stream_exits_1(capsys, cpu_bundle):
    assert_refused(_run(capsys, cpu_bundle, "rtsp://127.0.0.1:9/none", "-O", "open_timeout_s=2"), "",
                   code=EXIT_RUNTIME)


@pytest.mark.parametrize("uri", ["nope:1", "v4l2:abc", "synthetic:axb", "folder:/nonexistent/dir"])
def test_a_bad_camera_uri_exits_2(capsys, cpu_bundle, uri):
    assert_refused(_run(capsys, cpu_bundle, uri), "", code=EXIT_USAGE)


def test_a_missing_edgetpu_delegate_exits_1(capsys, cpu_bundle, tmp_path, monkeypatch):
    """An Edge TPU model asked to run with --delegate edgetpu where libedgetpu cannot load."""
    import edgekit.runtime.litert as litert

    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    model = tmp_path / "m_edgetpu.tflite"
    shutil.copy(next(cpu_bundle.glob("*.tflite")), model)
    with open(model, "ab") as f:  # the marker is_edgetpu_compiled looks for; the model still loads
        f.write(litert.EDGETPU_CUSTOM_OP)
    monkeypatch.setattr(litert.ctypes, "CDLL", no_library)  # the same on a machine that has libedgetpu
    assert_refused(_run(capsys, model, "synthetic", "--delegate", "edgetpu"), "libedgetpu", code=EXIT_RUNTIME)


def test_an_edgetpu_model_without_the_delegate_flag_stays_a_usage_error(capsys, cpu_bundle, tmp_path):
    """Running a compiled model on the CPU is a command to fix (add --delegate edgetpu): exit 2."""
    import edgekit.runtime.litert as litert

    model = tmp_path / "m_edgetpu.tflite"
    shutil.copy(next(cpu_bundle.glob("*.tflite")), model)
    with open(model, "ab") as f:
        f.write(litert.EDGETPU_CUSTOM_OP)
    assert_refused(_run(capsys, model, "synthetic"), "Edge TPU", code=EXIT_USAGE)


@pytest.mark.parametrize("exc,code", [
    (CameraError("bad camera URI x"), 2),
    (CameraUnavailable("v4l2:0: cannot open"), 1),
    (BackendUnavailable("onnxruntime is not installed"), 2),
    (DeviceError("no Edge TPU found"), 1),
    (DelegateError("libedgetpu.so.1 is not installed"), 1),
    (OutputError("cannot write out.json: No space left on device"), 1),
    (VerificationFailed("int8 top-1 ratio 0.90 < 0.98"), EXIT_GATE),
])
def test_each_class_carries_its_code(exc, code, capsys):
    assert exc.exit_code == code and print_error("edgekit run", exc) == code
    assert capsys.readouterr().err.startswith("edgekit run: error: ")


def test_subclasses_keep_old_except_clauses_working():
    """``except CameraError`` / ``except BackendUnavailable`` callers still catch the runtime kinds."""
    assert issubclass(CameraUnavailable, CameraError) and issubclass(DelegateError, BackendUnavailable)
    from edgekit.outputs.outstream import OutputError as StdoutError
    from edgekit.outputs.recording import SaveError, SaveTargetError
    from edgekit.vector.diagnosis import VectorError

    assert StdoutError is OutputError and issubclass(SaveError, OutputError)
    assert SaveError("x").exit_code == 1 and SaveTargetError("x").exit_code == 2
    assert VectorError("not_found", "no robot").exit_code == 1 and VectorError("config", "x").exit_code == 2


# --- One table: every error class, every backend's missing runtime (issue 39 item 4) ---------------

DOCUMENTED = {  # class name -> exit code, as `edgekit --help` and README's "Exit codes" say
    "EdgekitError": EXIT_USAGE, "UsageError": EXIT_USAGE, "UnknownOptionError": EXIT_USAGE,
    "ModelError": EXIT_USAGE, "CalibrationError": EXIT_USAGE, "TargetError": EXIT_USAGE,
    "BundleError": EXIT_USAGE, "CameraError": EXIT_USAGE, "CompilerError": EXIT_USAGE,
    "BackendUnavailable": EXIT_USAGE,  # a missing edgekit extra for the CPU: the pip command fixes it
    "DeviceError": EXIT_RUNTIME, "DelegateError": EXIT_RUNTIME,  # an accelerator or its runtime missing
    "CameraUnavailable": EXIT_RUNTIME, "OutputError": EXIT_RUNTIME, "VerificationFailed": EXIT_GATE,
}


def test_every_error_class_exits_with_its_documented_code(capsys):
    import inspect

    import edgekit.errors as errors
    from edgekit.cli import EXIT_CODES

    classes = {name: cls for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, errors.EdgekitError) and cls.__module__ == errors.__name__}
    assert sorted(classes) == sorted(DOCUMENTED)  # a new class is added to this table, with its code
    for name, cls in classes.items():
        exc = cls("x") if name != "UnknownOptionError" else cls("x", key="k")
        assert (name, exc.exit_code, print_error("edgekit", exc)) == (name, DOCUMENTED[name], DOCUMENTED[name])
    assert "1 runtime failure" in EXIT_CODES and "a missing accelerator or its runtime" in EXIT_CODES
    capsys.readouterr()


def _onnx(tmp_path):
    from tests.helpers.rescale_models import rescale_onnx

    return rescale_onnx(tmp_path / "m.onnx")


def _fake_tensorrt(monkeypatch):
    """TensorRT importable (as on a Jetson) while cuda-python is not."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    for name in ("cuda", "cuda.bindings", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)


# backend, modules made unimportable, expected code, words of the error line
MISSING_RUNTIMES = [
    ("litert", ("ai_edge_litert", "tflite_runtime"), EXIT_USAGE, "no TFLite runtime installed"),
    ("onnxruntime", ("onnxruntime",), EXIT_USAGE, "onnxruntime is not installed"),
    ("onnxruntime-cuda", ("onnxruntime",), EXIT_RUNTIME, "onnxruntime-gpu is not installed"),
    ("onnxruntime-trt", ("onnxruntime",), EXIT_RUNTIME, "onnxruntime-gpu is not installed"),
    ("onnxruntime-cuda", (), EXIT_RUNTIME, "not available in this onnxruntime"),
    ("tensorrt", ("tensorrt",), EXIT_RUNTIME, "TensorRT's Python bindings (tensorrt) are not installed"),
    ("tensorrt", "fake", EXIT_RUNTIME, "cuda-python is not installed"),
    ("onnxruntime --providers cuda", (), EXIT_RUNTIME, "none of the requested ONNX Runtime providers"),
]


@pytest.mark.parametrize("backend, blocked, code, words", MISSING_RUNTIMES)
def test_every_backends_missing_runtime_exits_as_documented(backend, blocked, code, words, capsys, tmp_path,
                                                           monkeypatch, cpu_bundle):
    """A missing edgekit extra for the CPU (LiteRT, ONNX Runtime) is a command to fix (2); a
    missing accelerator runtime (TensorRT, cuda-python, onnxruntime-gpu, a CUDA provider) is the
    machine's (1), as a missing Edge TPU delegate is (test above)."""
    import sys

    from edgekit.runtime import BACKENDS

    name, *extra = backend.split()
    assert name in BACKENDS
    if blocked == () and "CUDAExecutionProvider" in __import__("onnxruntime").get_available_providers():
        pytest.skip("this onnxruntime has CUDA: nothing is missing")
    if blocked == "fake":
        _fake_tensorrt(monkeypatch)
    else:
        for module in blocked:
            monkeypatch.setitem(sys.modules, module, None)
    model = next(cpu_bundle.glob("*.tflite")) if name == "litert" else _onnx(tmp_path)
    assert_refused(_run(capsys, model, "synthetic", "--backend", name, *extra), words, code=code)


def test_skip_unavailable_leaves_out_an_edgetpu_bundle_that_would_run_on_the_cpu(capsys, cpu_bundle, tmp_path):
    """An Edge TPU bundle built without edgetpu_compiler holds its plain int8 model run with XNNPACK:
    it opens anywhere, so --skip-unavailable benched it on the CPU. Now it is skipped, with the
    reason; with nothing left to run the bench exits 1. Without the flag it runs, with the caveat."""
    import json

    tpu = tmp_path / "demo-edgetpu"
    shutil.copytree(cpu_bundle, tpu)
    manifest = json.loads((tpu / "edgekit.json").read_text())
    manifest.update(target="edgetpu", runtime={**manifest["runtime"], "options": {"delegate": "edgetpu"}})
    manifest["models"][0]["runtime_options"] = {"delegate": "xnnpack"}  # what the build writes without the compiler
    (tpu / "edgekit.json").write_text(json.dumps(manifest))
    flags = ["--min-duration", "0", "--min-count", "3", "--repeats", "1", "--frames", "2"]
    argv = ["bench", str(tpu), *flags]
    result = edgekit(capsys, *argv, "--skip-unavailable")
    assert_refused(result, "none of the models can run on this machine: skipped demo-edgetpu: built for edgetpu, "
                   "it would run on litert xnnpack", "not on the Edge TPU", code=EXIT_RUNTIME)
    both = edgekit(capsys, "bench", str(tpu), str(cpu_bundle), *flags, "--skip-unavailable")
    assert both.code == 0 and "warning: skipped demo-edgetpu: built for edgetpu" in both.err
    assert "demo-edgetpu" not in both.out and cpu_bundle.name in both.out
    measured = edgekit(capsys, *argv)  # without the flag: measured, with the caveat
    assert measured.code == 0 and "built for an accelerator, ran without it" in measured.err
    chosen = edgekit(capsys, *argv, "--skip-unavailable", "--delegate", "xnnpack")  # the CPU asked for: kept
    assert chosen.code == 0 and "demo-edgetpu" in chosen.out
