"""``edgekit run`` end to end: real models, real sources, and every way a run can go wrong."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from edgekit import camera
from edgekit.camera import Frame
from edgekit.cli import main as cli
from edgekit.errors import CameraError
from tests.helpers import tflite_models
from tests.runtime.test_adapters import compiled_for_edgetpu, onnx_model, write_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    fp32, int8 = tflite_models.model_path("small_float"), tflite_models.model_path("small_int8")
    return write_bundle(d / "demo-cpu", {"fp32": fp32, "int8": int8})


class ScriptedSource:
    """A camera that delivers ``n`` good frames, then does ``then`` (raise or end)."""

    def __init__(self, n: int, then: BaseException | None = None, frame=None):
        self.n, self.then, self.closed = n, then, False
        self.frame = np.full((36, 64, 3), 90, np.uint8) if frame is None else frame

    def __iter__(self):
        for i in range(self.n):
            yield Frame(self.frame, 0, i)
        if self.then is not None:
            raise self.then

    def close(self):
        self.closed = True

    def stats(self):
        return {"captured": self.n}


def use_source(monkeypatch, source):
    monkeypatch.setattr(camera, "open_camera", lambda uri, runtime=None, /, **kw: source)
    return source


def test_run_on_a_bundle_prints_results_stats_and_a_summary(bundle, capsys):
    rc = cli(
        [
            "run",
            str(bundle),
            "--camera",
            "synthetic:320x180",
            "--max-frames",
            "30",
            "--every",
            "0",
            "--stats-every",
            "0.000001",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("edgekit run: demo-cpu:fp32 on synthetic:320x180: ai_edge_litert")
    assert "xnnpack (" in out and "nodes delegated" in out
    assert sum(line.startswith("frame ") for line in out.splitlines()) == 30
    assert "[stats] frames" in out
    assert "summary: 30 frames (5 warm-up)" in out and "first inference" in out
    for stage in ("capture_wait", "preprocess", "inference", "postprocess", "end_to_end"):
        assert f"  {stage}" in out


def test_run_json_lines(bundle, capsys):
    rc = cli(
        [
            "run",
            f"{bundle}:int8",
            "--camera",
            "synthetic",
            "--max-frames",
            "4",
            "--json",
            "--warmup",
            "1",
            "--top-k",
            "2",
        ]
    )
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 0 and len(lines) == 6
    assert lines[0]["model"] == "demo-cpu:int8" and lines[0]["runtime"]["input"]["dtype"] == "uint8"
    assert [x["frame"] for x in lines[1:5]] == [0, 1, 2, 3]
    assert len(lines[1]["top"]) == 2 and lines[1]["top"][0]["label"] in "abcde"
    s = lines[-1]["summary"]
    assert s["frames"] == 4 and s["measured"] == 3 and s["stages"]["inference"]["count"] == 3
    assert s["source"]["delivered"] >= 4


def test_run_bare_onnx_model_with_labels(tmp_path, capsys):
    model = onnx_model(tmp_path / "m.onnx")
    (tmp_path / "l.txt").write_text("dark\nbright\n")
    rc = cli(
        [
            "run",
            str(model),
            "--labels",
            str(tmp_path / "l.txt"),
            "--camera",
            "synthetic",
            "--max-frames",
            "3",
            "--providers",
            "cpu",
            "--threads",
            "1",
            "--every",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "providers CPUExecutionProvider" in out and "bright" in out


def test_duration_limit(bundle, capsys):
    assert cli(["run", str(bundle), "--camera", "synthetic", "--duration", "0.2"]) == 0
    assert "summary:" in capsys.readouterr().out


def _fails(argv, capsys, needle: str, code: int = 2) -> str:
    rc = cli(argv)
    err = capsys.readouterr().err
    assert rc == code, err
    assert needle in err, err
    assert "Traceback" not in err
    return err


def test_missing_bundle(tmp_path, capsys):
    _fails(["run", str(tmp_path / "nope"), "--camera", "synthetic"], capsys, "does not exist")


def test_corrupt_and_newer_manifests(bundle, tmp_path, capsys):
    import shutil

    b = shutil.copytree(bundle, tmp_path / "b")
    good = (b / "edgekit.json").read_text()
    (b / "edgekit.json").write_text(good[:40])
    _fails(["run", str(b), "--camera", "synthetic"], capsys, "is corrupt")
    (b / "edgekit.json").write_text(good.replace('"format_version": 1', '"format_version": 7'))
    _fails(["run", str(b), "--camera", "synthetic"], capsys, "upgrade edgekit")


def test_sha256_mismatch(bundle, tmp_path, capsys):
    import shutil

    b = shutil.copytree(bundle, tmp_path / "b")
    with open(b / "model_int8.tflite", "ab") as f:
        f.write(b"tampered")
    _fails(["run", str(b), "--camera", "synthetic"], capsys, "does not match its sha256")


def test_compiled_edgetpu_model_without_a_tpu(tmp_path, capsys):
    path = compiled_for_edgetpu(tflite_models.model_path("small_int8"), tmp_path / "model_edgetpu.tflite")
    _fails(["run", str(path), "--camera", "synthetic"], capsys, "compiled for the Edge TPU")
    # Asking for the TPU on a machine without libedgetpu: the delegate library is missing.
    b = write_bundle(
        tmp_path / "tpu",
        {"edgetpu": path},
        target="edgetpu",
        runtime={
            "adapter": "edgekit.runtime.litert:LiteRTRuntime",
            "options": {"delegate": "edgetpu", "device": "usb"},
        },
    )
    if not _have_libedgetpu():
        _fails(["run", str(b), "--camera", "synthetic"], capsys, "libedgetpu.so.1 is not installed",
               code=1)  # a missing delegate at run time: a runtime failure
        _fails(["run", str(b), "--camera", "synthetic", "--device", "usb:x"], capsys, "bad Edge TPU device")


def _have_libedgetpu() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libedgetpu.so.1")
        return True
    except OSError:
        return False


def test_edgetpu_delegate_on_a_plain_model_is_refused(bundle, capsys):
    # Checked before libedgetpu is even looked for: the delegate would take no op and the
    # model would run on the CPU with the TPU asked for.
    err = _fails(["run", f"{bundle}:int8", "--camera", "synthetic", "--delegate", "edgetpu"], capsys,
                 "not compiled for the Edge TPU")
    assert "edgetpu_compiler" in err and "Traceback" not in err


def test_explicit_device_on_a_cpu_model_is_refused_not_ignored(bundle, capsys):
    # pycoral's usb:0 means "on the TPU or fail": no silent XNNPACK fallback.
    err = _fails(["run", f"{bundle}:int8", "--camera", "synthetic", "--device", "usb:0", "--max-frames", "1"], capsys,
                 "--device usb:0 asks for an Edge TPU")
    assert "runs on the CPU (xnnpack)" in err and "drop --device" in err
    assert capsys.readouterr().out == ""  # refused before any frame ran


def test_camera_that_cannot_open(bundle, tmp_path, capsys):
    _fails(["run", str(bundle), "--camera", f"file:{tmp_path / 'missing.mp4'}"], capsys, "no such video file")
    _fails(["run", str(bundle), "--camera", f"folder:{tmp_path}"], capsys, "no images")
    _fails(["run", str(bundle), "--camera", "teapot:3"], capsys, "error:")


def test_camera_that_stops_mid_run(bundle, capsys, monkeypatch):
    src = use_source(monkeypatch, ScriptedSource(8, CameraError("v4l2:0: no frame for 5.0 s", "check the cable")))
    rc = cli(["run", str(bundle), "--camera", "v4l2:0", "--warmup", "0"])
    cap = capsys.readouterr()
    assert rc == 2 and src.closed
    assert "summary: 8 frames" in cap.out  # what was measured is still reported
    assert cap.err.strip().splitlines() == ["edgekit run: error: v4l2:0: no frame for 5.0 s", "  fix: check the cable"]


def test_camera_with_no_frames_at_all(bundle, capsys, monkeypatch):
    use_source(monkeypatch, ScriptedSource(0))
    _fails(["run", str(bundle), "--camera", "x"], capsys, "delivered no usable frames", code=1)  # runtime


def test_corrupt_frames(bundle, capsys, monkeypatch):
    use_source(monkeypatch, ScriptedSource(100, frame=np.zeros((0, 5, 3), np.uint8)))
    _fails(["run", str(bundle), "--camera", "x"], capsys, "unusable frames in a row", code=1)  # a broken camera


def test_ctrl_c_ends_cleanly_with_a_summary(bundle, capsys, monkeypatch):
    src = use_source(monkeypatch, ScriptedSource(12, KeyboardInterrupt()))
    rc = cli(["run", str(bundle), "--camera", "x", "--warmup", "2"])
    out = capsys.readouterr().out
    assert rc == 130 and src.closed  # the summary, then the exit-code table's "interrupted"
    assert "summary: 12 frames (2 warm-up)" in out and "interrupted" in out


def test_bad_arguments(bundle, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses it before anything opens
        cli(["run", str(bundle), "--camera", "synthetic", "--max-frames", "0"])
    assert exit_info.value.code == 2 and "--max-frames: must be at least 1" in capsys.readouterr().err
    _fails(["run", f"{bundle}:fp64", "--camera", "synthetic"], capsys, "no model 'fp64'")
    with pytest.raises(SystemExit):
        cli(["run", str(bundle)])  # --camera is required
    capsys.readouterr()


def _edgekit(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgekit.cli", *args]


def test_real_process_exits_and_sigint_is_clean(bundle):
    done = subprocess.run(
        _edgekit("run", str(bundle), "--camera", "synthetic", "--max-frames", "10"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "summary: 10 frames" in done.stdout, done.stderr
    # An endless run stopped by Ctrl-C (SIGINT) prints its summary and exits 130 (stopped, not finished).
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # As from a terminal: a test run started as a background job (`make test &` in a script)
    # inherits SIGINT ignored, and Python keeps it ignored in the child.
    with subprocess.Popen(
        _edgekit("run", str(bundle), "--camera", "synthetic", "--every", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as p:
        try:
            for line in p.stdout:
                if line.startswith("frame "):
                    break
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=30)
        finally:
            p.kill()
    assert p.returncode == 128 + signal.SIGINT, err
    assert "interrupted" in out and "Traceback" not in err


def test_camera_options_reach_open_camera(bundle, capsys, monkeypatch):
    seen = {}

    def open_camera(uri, runtime=None, /, **options):
        seen.update(uri=uri, runtime=runtime, options=options)
        return ScriptedSource(3)

    monkeypatch.setattr(camera, "open_camera", open_camera)
    argv = ["run", str(bundle), "--camera", "v4l2:0", "-O", "fps=30", "--camera-option", "fourcc=MJPG", "--json"]
    assert cli([*argv, "-O", "size=640x480", "-O", "fps=15"]) == 0
    # Strings: the source coerces them to the types it declares; the last of a repeated key wins.
    assert seen.pop("runtime") is not None  # the model's runtime: a camera that shares it (imx500) reads it
    assert seen == {"uri": "v4l2:0", "options": {"fps": "15", "fourcc": "MJPG", "size": "640x480"}}
    capsys.readouterr()
    assert cli(["run", str(bundle), "--camera", "v4l2:0"]) == 0
    assert seen["options"] == {}  # no -O: nothing passed, the source's defaults stand


def test_malformed_camera_option_is_a_usage_error(bundle, capsys):
    with pytest.raises(SystemExit) as exc:
        cli(["run", str(bundle), "--camera", "synthetic", "-O", "fps"])
    assert exc.value.code == 2 and "not KEY=VALUE" in capsys.readouterr().err


def test_litert_banner_only_with_debug_logging(bundle):
    # LiteRT prints its XNNPACK banner from C++ on fd 2: captured into the DEBUG log (edgekit.util.quiet).
    args = [sys.executable, "-m", "edgekit.cli", "run", str(bundle), "--camera", "synthetic", "--max-frames", "1"]
    quiet = subprocess.run(args, capture_output=True, text=True, timeout=60)
    loud = subprocess.run([*args, "-vv"], capture_output=True, text=True, timeout=60)
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    assert "XNNPACK delegate" not in quiet.stderr + quiet.stdout
    assert "DEBUG edgekit.runtime.litert: INFO: Created TensorFlow Lite XNNPACK delegate" in loud.stderr


def test_a_folder_run_prints_every_image_by_default_and_a_clip_is_throttled(bundle, tmp_path, capsys):
    import cv2

    for i in range(7):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), np.full((40, 60, 3), 30 * i, np.uint8))
    assert cli(["run", str(bundle), "--camera", f"folder:{tmp_path}", "--warmup", "0"]) == 0
    assert sum(line.startswith("frame ") for line in capsys.readouterr().out.splitlines()) == 7
    # a live source keeps the 0.5 s default: 40 synthetic frames in well under a second print few lines
    assert cli(["run", str(bundle), "--camera", "synthetic:64x36@1000", "--max-frames", "40"]) == 0
    assert sum(line.startswith("frame ") for line in capsys.readouterr().out.splitlines()) < 40
