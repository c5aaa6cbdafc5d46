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
