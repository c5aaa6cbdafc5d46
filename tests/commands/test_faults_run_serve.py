"""Fault catalogue, second pass on the run/serve/bundle side: what the first catalogue did not try.

Non-finite numbers (in flags, camera options, serve settings and in what the outputs carry),
hostile labels files, a model whose tensor names are not UTF-8, a recording on a full disk,
a metrics port already taken, a --backend that cannot run the model. Each case is a clean
refusal (one ``error:`` line, a ``fix:`` line, no traceback) and nothing left behind, or
output every strict JSON parser reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.faults.test_disk_full import _fill, _left, full_disk  # noqa: F401 - the tmpfs fixture
from tests.helpers.faults import assert_nothing_left, assert_refused, edgekit, snapshot

DETECTOR_ONNX = ROOT / "models" / "detector.onnx"


def _strict(line: str):
    """json.loads that refuses NaN/Infinity, as JSON.parse, Go and jq do."""
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def _copy(cpu_bundle: Path, tmp_path: Path) -> tuple[Path, dict]:
    b = tmp_path / "bundle" / "demo-cpu"
    shutil.copytree(cpu_bundle, b)
    return b, json.loads((b / "edgekit.json").read_text())


def _save(b: Path, m: dict) -> None:
    """Rehash every listed file (a careful editor) and write the manifest."""
    for name in m["files"]:
        m["files"][name] = hashlib.sha256((b / name).read_bytes()).hexdigest()
    (b / "edgekit.json").write_text(json.dumps(m))


def _run(capsys, bundle, *extra: str, camera: str = "synthetic:64x64"):
    return edgekit(capsys, "run", str(bundle), "--camera", camera, "--max-frames", "3", "--quiet", *extra)


# ---- outputs: NaN is not JSON -----------------------------------------------------------------------------

def test_run_json_has_no_nan_when_no_frame_was_measured(capsys, cpu_bundle):
    """3 frames, 5 warm-up: every stage summary is empty (was NaN, which JSON.parse refuses)."""
    result = _run(capsys, cpu_bundle, "--json")
    assert result.code == 0, result.err
    lines = [_strict(line) for line in result.out.splitlines()]
    assert lines[-1]["summary"]["stages"]["inference"]["p50_ms"] is None
    text = _run(capsys, cpu_bundle)
    assert "nan" not in text.out, text.out  # the text table shows "-" where nothing was measured


def nan_model(path: Path) -> Path:
    """A bare ONNX classifier whose 3 scores are NaN: sqrt of (mean pixel - 1e6)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Flatten", ["x"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w"], ["mm"]),
             helper.make_node("Sub", ["mm", "big"], ["neg"]),
             helper.make_node("Sqrt", ["neg"], ["scores"])]
    graph = helper.make_graph(
        nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(np.full((192, 3), 1 / 192, np.float32), "w"),
         numpy_helper.from_array(np.array(1e6, np.float32), "big")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_run_json_of_a_model_emitting_nan_scores(tmp_path, capsys):
    """Every score NaN: null in JSON (json.loads with NaN refused), never the bare word NaN."""
    result = _run(capsys, nan_model(tmp_path / "nan.onnx"), "--json", "--every", "0", "--warmup", "0")
    assert result.code == 0, result.err
    frames = [_strict(line) for line in result.out.splitlines()[1:-1]]
    assert frames and all(t["score"] is None for f in frames for t in f["top"])


def test_a_bundle_whose_std_would_make_every_input_inf_is_refused(tmp_path, capsys, cpu_bundle):
    """A std of 1e-300 is finite, but every input pixel becomes inf and every score NaN."""
    b, m = _copy(cpu_bundle, tmp_path)
    m["models"][0]["input"]["std"] = [1e-300]
    _save(b, m)
    result = _run(capsys, b, "--json")
    assert result.code == 2 and "std [1e-300] must be within" in result.err and "Traceback" not in result.err


def test_serve_and_mqtt_payloads_have_no_nan():
    from edgekit.util.finite_json import to_json

    line = to_json({"score": float("nan"), "x": [np.float32("inf"), 1.5], "ok": np.float64(2.0)})
    assert _strict(line) == {"score": None, "x": [None, 1.5], "ok": 2.0}


def test_bench_json_of_invalid_runs_has_no_nan(tmp_path, capsys, cpu_bundle):
    report = tmp_path / "report.json"
    result = edgekit(capsys, "bench", str(cpu_bundle), "--min-count", "5", "--repeats", "1", "--warmup", "0",
                     "--min-duration", "0.05", "--max-duration", "0.000001", "--json", "--json-file", str(report),
                     "--quiet")
    _strict(result.out)
    _strict(report.read_text())


# ---- flags: nan and inf -------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,needle", [
    (("--duration", "nan"), "--duration"),
    (("--duration", "inf"), "--duration"),
    (("--duration", "0"), "--duration"),  # ran forever
    (("--every", "nan"), "--every"),
    (("--every", "-1"), "--every"),
    (("--stats-every", "inf"), "--stats-every"),
])
def test_run_refuses_non_finite_flags(capsys, cpu_bundle, flags, needle):
    assert_refused(_run(capsys, cpu_bundle, *flags), needle)


@pytest.mark.parametrize("flags,needle", [
    (("--min-duration", "nan"), "--min-duration"),
    (("--min-duration", "inf"), "--min-duration"),
    (("--max-duration", "nan"), "--max-duration"),
    (("--max-duration", "-1"), "--max-duration"),
    (("--max-cv", "nan"), "--max-cv"),
])
def test_bench_refuses_non_finite_flags(capsys, cpu_bundle, flags, needle):
    assert_refused(edgekit(capsys, "bench", str(cpu_bundle), "--min-count", "5", *flags), needle)


@pytest.mark.parametrize("flags,needle", [
    (("--duration", "nan"), "--duration"),  # ran forever
    (("--max-frames", "0"), "--max-frames"),
    (("--max-frames", "-1"), "--max-frames"),
])
def test_serve_refuses_bad_limits(capsys, cpu_bundle, flags, needle):
    result = edgekit(capsys, "serve", str(cpu_bundle), "--camera", "synthetic:64x64", "--http", "off",
                     "--output", "", *flags)
    assert_refused(result, needle)


# ---- inspect --threads ------------------------------------------------------------------------------------

def test_inspect_threads_over_the_cap_is_refused_not_a_segfault(tmp_path, cpu_bundle):
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "inspect", str(cpu_bundle), "--threads", "100000"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # -11 was the segfault
    assert "--threads" in proc.stderr and "Traceback" not in proc.stderr


def test_inspect_threads_zero_is_refused(capsys, cpu_bundle):
    assert_refused(edgekit(capsys, "inspect", str(cpu_bundle), "--threads", "0"), "--threads")


def test_litert_runtime_refuses_a_huge_thread_count(cpu_bundle):
    from edgekit.errors import ModelError
    from edgekit.runtime.litert import LiteRTRuntime

    model = next(cpu_bundle.glob("*.tflite"))
    with pytest.raises(ModelError, match="num_threads"):
        LiteRTRuntime(model, num_threads=100000)


# ---- a model whose tensor names are not UTF-8 -------------------------------------------------------------

def _non_utf8_tensor_name(b: Path, m: dict) -> None:
    """Break one intermediate tensor's name (the graph still loads; describing it raised UnicodeDecodeError)."""
    model = b / m["models"][0]["file"]
    data = model.read_bytes()
    at = data.find(b"/Relu6")
    assert at > 0, "the demo model has no Relu6 tensor name"
    model.write_bytes(data[:at] + b"\xff" + data[at + 1:])
    _save(b, m)


@pytest.mark.parametrize("verb", ["run", "inspect", "bench"])
def test_tensor_name_not_utf8(tmp_path, capsys, cpu_bundle, verb):
    b, m = _copy(cpu_bundle, tmp_path)
    _non_utf8_tensor_name(b, m)
    argv = {"run": ("run", b, "--camera", "synthetic:64x64", "--max-frames", "2"), "inspect": ("inspect", b),
            "bench": ("bench", b, "--min-count", "3", "--repeats", "1")}[verb]
    assert_refused(edgekit(capsys, *argv), "graph")


# ---- labels ---------------------------------------------------------------------------------------------

def _labels(b: Path, m: dict, data: bytes) -> None:
    (b / m["labels"]).write_bytes(data)
    _save(b, m)


@pytest.mark.parametrize("data,needle", [
    (b"x" * (16 << 20) + b"\n", "larger than 16 MiB"),  # read whole, then counted: 660 MB RSS for 300 MB
    (b"\n".join([b"a"] * 8 + [b"y" * 5000] + [b"b"] * 2), "5000 characters"),  # published with every result
    (b"\n".join(b"\x1b[2J\x1b[31mred%d" % i for i in range(11)), "control characters"),  # rewrote the terminal
    ("\n".join(f"a\u009bb{i}" for i in range(11)).encode(), "control characters"),  # C1 CSI, in UTF-8
])
def test_hostile_labels_file_is_refused(tmp_path, capsys, cpu_bundle, data, needle):
    b, m = _copy(cpu_bundle, tmp_path)
    _labels(b, m, data)
    result = _run(capsys, b, "--json")
    assert "\x1b" not in result.text
    assert_refused(result, needle)


def test_labels_with_a_byte_order_mark_and_tabs(tmp_path):
    from edgekit.bundle import read_labels

    path = tmp_path / "labels.txt"
    path.write_bytes("\ufeffcat\r\ndog\tbrown\n\n  bird \n".encode())
    assert read_labels(path) == ["cat", "dog\tbrown", "bird"]  # the BOM was glued to "cat"


# ---- --save ---------------------------------------------------------------------------------------------

def test_save_video_onto_a_full_disk(capsys, cpu_bundle, full_disk):  # noqa: F811
    """The mp4 writer reports nothing: a file cut off before its index was 'saved' with exit 0."""
    _fill(full_disk)
    os.remove(full_disk / "filler")
    # room for the temporary file but not for 200 VGA frames
    (full_disk / "filler").write_bytes(b"\0" * (128 << 10))
    result = edgekit(capsys, "run", str(cpu_bundle), "--camera", "synthetic:640x480", "--max-frames", "200",
                     "--quiet", "--save", str(full_disk / "out.mp4"))
    assert_refused(result, "out.mp4", code=1)  # a full disk: a runtime failure
    assert _left(full_disk) == ["filler"], _left(full_disk)


def test_saved_recordings_follow_the_umask(tmp_path, capsys, cpu_bundle):
    """mkstemp/mkdtemp made the finished recording private (0600/0700)."""
    old = os.umask(0o022)
    try:
        for name in ("frames", "clip.mp4"):
            result = edgekit(capsys, "run", str(cpu_bundle), "--camera", "synthetic:64x64", "--max-frames", "12",
                             "--quiet", "--save", str(tmp_path / name))
            assert result.code == 0, result.err
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "frames").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "clip.mp4").stat().st_mode) == 0o644


# ---- serve ------------------------------------------------------------------------------------------------

def test_serve_port_in_use_leaves_no_results_file(tmp_path, capsys, cpu_bundle):
    out = tmp_path / "results.jsonl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = snapshot(tmp_path)
        result = edgekit(capsys, "serve", str(cpu_bundle), "--camera", "synthetic:64x64",
                         "--http", f"127.0.0.1:{port}", "--output", str(out), "--max-frames", "2", "--quiet")
    assert_refused(result, "listen")
    assert_nothing_left(before, tmp_path)


@pytest.mark.parametrize("table,text,needle", [
    ("model", "watch = true\nwatch_interval_s = 1e300", "watch_interval_s"),  # killed the swap thread
    ("camera", "reconnect_max_s = 1e300", "reconnect_max_s"),
    ("mqtt", "host = \"127.0.0.1\"\nkeepalive_s = 100000", "keepalive_s"),  # killed paho's thread
])
def test_serve_settings_beyond_what_a_timer_takes(tmp_path, capsys, cpu_bundle, table, text, needle):
    config = tmp_path / "serve.toml"
    sections = {"model": f'path = "{cpu_bundle}"', "camera": 'uri = "synthetic"'}
    sections[table] = (sections.get(table, "") + "\n" + text).strip()
    config.write_text("".join(f"[{k}]\n{v}\n" for k, v in sections.items()))
    assert_refused(edgekit(capsys, "serve", "--config", str(config), "--print-config"), needle)


# ---- cameras ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("camera,option", [
    ("synthetic:64x64", "fps=1e-300"),  # OverflowError in the frame clock
    ("folder:{frames}", "fps=1e-300"),
    ("file:{clip}", "fps=1e-300"),
    ("synthetic:64x64", "fps=1e300"),  # hung
    ("synthetic:64x64@0.00001", None),  # the URI's rate skipped the option's range
    ("rtsp://127.0.0.1:9/x", "open_timeout_s=1e300"),  # a multi-line OpenCV overload report
    ("rtsp://127.0.0.1:9/x", "params=1,99999999999999999999"),
])
def test_camera_numbers_out_of_range(tmp_path, capsys, cpu_bundle, camera, option):
    import cv2

    frames = tmp_path / "frames"
    frames.mkdir()
    cv2.imwrite(str(frames / "a.png"), np.zeros((8, 8, 3), np.uint8))
    clip = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 10, (16, 16))
    writer.write(np.zeros((16, 16, 3), np.uint8))
    writer.release()
    uri = camera.format(frames=frames, clip=clip)
    options = ("-O", option) if option else ()
    line = assert_refused(_run(capsys, cpu_bundle, *options, camera=uri), "")
    assert ("fps" in line or "params" in line or "open_timeout_s" in line), line


def test_dev_video_path_is_a_v4l2_camera(capsys, cpu_bundle):
    line = assert_refused(_run(capsys, cpu_bundle, camera="/dev/video97"), "", code=1)  # no such camera: runtime
    assert "unknown camera" not in line and "/dev/video97" in line


# ---- backends ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime"])
def test_backend_that_cannot_run_the_model_is_refused(capsys, cpu_bundle, backend):
    """It was ignored without a word: `--backend tensorrt` on a .tflite ran LiteRT."""
    assert_refused(_run(capsys, cpu_bundle, "--backend", backend), f"--backend {backend}")


def test_onnx_runtime_warnings_stay_off_a_quiet_run(capfd, cpu_bundle):
    """ONNX Runtime printed its own colour-coded warnings to fd 2 even under --quiet."""
    from edgekit.cli import main

    code = main(["run", str(DETECTOR_ONNX), "--camera", "synthetic:64x64", "--max-frames", "2", "--quiet"])
    err = capfd.readouterr().err
    assert code == 0 and "onnxruntime" not in err, err


# ---- bundle paths the OS refuses to look up -----------------------------------------------------------------

def _entry(name: str, link: str | None = None):
    def change(b: Path, m: dict) -> None:
        if link is not None:
            (b / link).symlink_to(link)  # a link to itself: a loop
        m["files"][name] = "0" * 64

    return change


@pytest.mark.parametrize("change,needle", [
    (_entry("a\0b"), "null byte"),  # ValueError from realpath
    (_entry("a" * 5000), "too long"),  # OSError ENAMETOOLONG from is_file
    (_entry(("a" * 200 + "/") * 30 + "x"), "too long"),
    (_entry("loop/x", link="loop"), "loop"),  # RuntimeError from resolve
])
def test_file_entries_the_os_cannot_look_up(tmp_path, capsys, cpu_bundle, change, needle):
    b, m = _copy(cpu_bundle, tmp_path)
    change(b, m)
    (b / "edgekit.json").write_text(json.dumps(m))
    line = assert_refused(_run(capsys, b), needle)
    assert len(line) < 400, line


# ---- a folder camera whose folder goes away -------------------------------------------------------------

def test_image_folder_removed_mid_run_is_an_error_not_the_end(tmp_path):
    """It ended like a finished folder (exit 0), every remaining image counted as a read error."""
    import cv2

    from edgekit.camera import ImageFolderSource
    from edgekit.errors import CameraError

    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(4):
        cv2.imwrite(str(frames / f"{i}.png"), np.zeros((8, 8, 3), np.uint8))
    source = ImageFolderSource(frames)
    next(source)
    shutil.rmtree(frames)
    with pytest.raises(CameraError, match="disappeared"):
        next(source)
    source.close()


# ---- bare ONNX models edgekit cannot feed or decode -------------------------------------------------------

def _onnx(path: Path, in_type: int, in_shape: list, out_type: int | None = None, out_shape: list | None = None) -> Path:
    """A one-node ONNX model (Identity, or a Constant output of ``out_type``) written with the onnx API."""
    from onnx import TensorProto, helper, save

    out_type = in_type if out_type is None else out_type
    if out_type == TensorProto.STRING:
        node = helper.make_node("Constant", [], ["y"], value=helper.make_tensor("c", out_type, [1], [b"cat"]))
    else:
        node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", in_type, in_shape)],
                              [helper.make_tensor_value_info("y", out_type, out_shape or in_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))
    return path


@pytest.mark.parametrize("name,in_type,shape,out_type,needle", [
    ("batch4", 1, [4, 3, 8, 8], None, "one image at a time"),  # InvalidArgument at the first frame
    ("flat", 1, [1, 64], None, "one image at a time"),  # IndexError
    ("int64", 7, [1, 3, 8, 8], None, "tensor(int64)"),  # InvalidArgument at the first frame
    ("labels", 1, [1, 3, 8, 8], 8, "tensor(string)"),  # ValueError in the raw head
])
def test_bare_onnx_model_edgekit_cannot_run(tmp_path, capsys, name, in_type, shape, out_type, needle):
    pytest.importorskip("onnx")
    model = _onnx(tmp_path / f"{name}.onnx", in_type, shape, out_type, [1] if out_type == 8 else None)
    assert_refused(_run(capsys, model), needle)


def test_bare_onnx_model_with_a_uint8_input_gets_pixels(tmp_path, capsys):
    """A uint8 image input (raw pixels) was refused for want of a quantisation scale."""
    pytest.importorskip("onnx")
    model = _onnx(tmp_path / "u8.onnx", 2, [1, 8, 8, 3])
    result = edgekit(capsys, "run", str(model), "--camera", "synthetic:64x64", "--max-frames", "1", "--json",
                     "--warmup", "0")
    assert result.code == 0, result.err
    out = _strict(result.out.splitlines()[1])["outputs"][0]
    assert out["dtype"] == "uint8" and out["max"] > 100  # pixels as they are, not pixels / 255


# ---- bare TFLite models with a batch or a free image size ----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("signature,needle", [
    ((4, 8, 8, 3), "one image at a time"),  # a ValueError inside set_tensor at the first frame
    ((None, None, None, 3), "not fixed"),  # allocated as 1x1: the model silently saw 1x1 images
])
def test_bare_tflite_model_with_batch_or_free_size(tmp_path, capsys, signature, needle):
    import keras

    from tests.helpers.tflite_models import convert

    inp = keras.Input((None, None, 3))
    model = keras.Model(inp, keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(inp)))
    path = tmp_path / "m.tflite"
    path.write_bytes(convert(model, (1, 8, 8, 3), int8=False, signature=signature))
    assert_refused(_run(capsys, path), needle)


# ---- results on stdout redirected to a full disk ------------------------------------------------------

@pytest.mark.parametrize("unbuffered", ["1", ""])  # PYTHONUNBUFFERED=1 (Docker, systemd) cut the file off silently
@pytest.mark.parametrize("verb", ["run", "bench"])
def test_stdout_redirected_to_a_full_disk(tmp_path, cpu_bundle, full_disk, verb, unbuffered):  # noqa: F811
    argv = {"run": ["run", str(cpu_bundle), "--camera", "synthetic:64x64", "--max-frames", "500", "--json",
                    "--every", "0", "-q"],
            "bench": ["bench", str(cpu_bundle), "--min-count", "5", "--repeats", "1", "--min-duration", "0.05",
                      "--json", "-q"]}[verb]
    _fill(full_disk)
    os.remove(full_disk / "filler")
    (full_disk / "filler").write_bytes(b"\0" * ((256 - 4) << 10))  # one page left: less than the output
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": unbuffered}
    with open(full_disk / "out.json", "wb") as out:
        proc = subprocess.run([sys.executable, "-m", "edgekit.cli", *argv], stdout=out, stderr=subprocess.PIPE,
                              text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # bench exited 0 with the report cut off; 1: I/O
    assert "No space left" in proc.stderr and "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


# ---- SIGTERM while the camera opens ------------------------------------------------------------------

@pytest.mark.parametrize("save", ["clip.mp4", "frames"])
def test_sigterm_while_the_camera_opens_leaves_no_partial_recording(tmp_path, cpu_bundle, save):
    """SIGTERM had its default action until the frame loop: the process died with --save's
    temporary file (or folder) left behind. Now it is an interrupt wherever it lands."""
    import signal

    out = tmp_path / "out"
    out.mkdir()
    with socket.socket() as camera:  # a stream that accepts the connection and never answers
        camera.bind(("127.0.0.1", 0))
        camera.listen()
        camera.settimeout(60)
        uri = f"rtsp://127.0.0.1:{camera.getsockname()[1]}/x"
        proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "run", str(cpu_bundle), "--camera", uri,
                                 "--save", str(out / save), "-q", "-O", "open_timeout_s=1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
        conn, _ = camera.accept()  # the run is inside open_camera now (FFmpeg's open returns within 1 s)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
        conn.close()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    assert "Traceback" not in err and "interrupted" in err
    assert list(out.iterdir()) == []


def test_inspect_json_redirected_to_a_full_disk(tmp_path, cpu_bundle, full_disk):  # noqa: F811
    _fill(full_disk)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    with open(full_disk / "filler", "ab") as out:
        proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "inspect", str(cpu_bundle), "--json"], stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 1 and "No space left" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_huge_manifest_is_refused_before_it_is_read(tmp_path, capsys, cpu_bundle):
    b, m = _copy(cpu_bundle, tmp_path)
    m["padding"] = "x" * (17 << 20)  # valid JSON, read whole into memory before
    (b / "edgekit.json").write_text(json.dumps(m))
    assert_refused(_run(capsys, b), "over 16 MiB")


def test_truncated_video_is_one_line_without_ffmpeg_chatter(tmp_path, capfd, cpu_bundle):
    """FFmpeg's own "moov atom not found" reached the terminal beside edgekit's error."""
    import cv2

    from edgekit.cli import main

    clip = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 10, (32, 32))
    for i in range(20):
        writer.write(np.full((32, 32, 3), i * 10, np.uint8))
    writer.release()
    clip.write_bytes(clip.read_bytes()[: clip.stat().st_size // 2])  # cut before the index
    capfd.readouterr()
    code = main(["run", str(cpu_bundle), "--camera", f"file:{clip}", "--max-frames", "2", "--quiet"])
    err = capfd.readouterr().err
    assert code == 2 and "moov" not in err and len(err.strip().splitlines()) == 2, err


def test_serve_backend_that_cannot_run_the_model_is_refused(capsys, cpu_bundle):
    result = edgekit(capsys, "serve", str(cpu_bundle), "--camera", "synthetic:64x64", "--http", "off",
                     "--output", "", "--backend", "tensorrt", "--max-frames", "2", "--quiet")
    assert_refused(result, "backend tensorrt")


# ---- bench outputs that fail only after the whole benchmark ----------------------------------------------

@pytest.mark.parametrize("flags,needle", [
    (("--csv", "{dir}"), "is a directory"),  # IsADirectoryError traceback after measuring
    (("--json-file", "{dir}"), "is a directory"),  # its fix said "free some space"
    (("--plot", "{dir}/plot.txt"), ".txt"),  # matplotlib's ValueError traceback after measuring
    (("--frames", "100000000"), "--frames"),  # 1e8 frames allocated in memory
])
def test_bench_outputs_refused_before_measuring(tmp_path, capsys, cpu_bundle, flags, needle):
    argv = [f.format(dir=tmp_path) for f in flags]
    assert_refused(edgekit(capsys, "bench", str(cpu_bundle), "--min-count", "5", *argv), needle)


# ---- frames of odd shapes, straight into the frame loop --------------------------------------------------

_RNG = np.random.default_rng(7)
ODD_FRAMES = {
    "gray": _RNG.integers(0, 256, (48, 64), dtype=np.uint8),
    "gray-1ch": _RNG.integers(0, 256, (48, 64, 1), dtype=np.uint8),
    "bgra": _RNG.integers(0, 256, (48, 64, 4), dtype=np.uint8),
    "1x1": _RNG.integers(0, 256, (1, 1, 3), dtype=np.uint8),
    "10000x10": _RNG.integers(0, 256, (10, 10000, 3), dtype=np.uint8),
    "10x10000": _RNG.integers(0, 256, (10000, 10, 3), dtype=np.uint8),
    "strided": _RNG.integers(0, 256, (48, 128, 3), dtype=np.uint8)[:, ::2],
    "read-only": np.frombuffer(bytes(48 * 64 * 3), np.uint8).reshape(48, 64, 3),
}
UNUSABLE_FRAMES = {
    "uint16": _RNG.integers(0, 65536, (48, 64, 3), dtype=np.uint16),
    "float32": _RNG.random((48, 64, 3), dtype=np.float32),
    "two-channel": np.zeros((48, 64, 2), np.uint8),
    "batch": np.zeros((1, 48, 64, 3), np.uint8),
    "empty": np.zeros((0, 64, 3), np.uint8),
    "none": None,
}


@pytest.mark.parametrize("model", ["bundle", "onnx"])
def test_odd_frames_give_results_or_are_counted_unusable(cpu_bundle, model):
    """A camera's odd frames never raise out of the frame loop: a result, or a counted unusable frame."""
    from edgekit.camera import Frame
    from edgekit.model import open_model
    from edgekit.pipeline import Pipeline

    with open_model(cpu_bundle if model == "bundle" else DETECTOR_ONNX) as opened:
        pipeline = Pipeline(opened.runtime, opened.labels, task=opened.task, task_options=opened.task_options,
                            max_corrupt=None)
        for name, array in ODD_FRAMES.items():
            assert pipeline.step(Frame(array, 0, 0)) is not None, name
        for name, array in UNUSABLE_FRAMES.items():
            assert pipeline.step(Frame(array, 0, 0)) is None, name
        assert pipeline.metrics.corrupt == len(UNUSABLE_FRAMES)


def test_onnx_model_failing_inside_the_graph_is_one_line(tmp_path, capfd):
    """A Reshape that does not fit its input fails at the first frame: ONNX Runtime's multi-line
    native report and a traceback, before."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, save

    from edgekit.cli import main

    target = helper.make_tensor("s", TensorProto.INT64, [2], [1, 100])
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 100])], initializer=[target])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(tmp_path / "m.onnx"))
    capfd.readouterr()
    code = main(["run", str(tmp_path / "m.onnx"), "--camera", "synthetic:64x64", "--max-frames", "2", "--quiet"])
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert "reshaped" in err and "onnxruntime_src" not in err


@pytest.mark.parametrize("passed", ["false", 0, 1, []])
def test_verification_passed_that_is_not_a_bool(tmp_path, capsys, cpu_bundle, passed):
    """A rejected bundle whose flag was written as "false" (or 0) ran as if it had passed."""
    b, m = _copy(cpu_bundle, tmp_path)
    m.setdefault("verification", {})["passed"] = passed
    (b / "edgekit.json").write_text(json.dumps(m))
    assert_refused(_run(capsys, b), "verification.passed")


# ---- a stream's password -----------------------------------------------------------------------------------

@pytest.fixture
def mjpeg_stream():
    """An MJPEG-over-HTTP camera on loopback (what IP cameras serve), until the test ends."""
    import http.server
    import threading

    import cv2

    jpeg = cv2.imencode(".jpg", np.full((48, 64, 3), 90, np.uint8))[1].tobytes()

    class Camera(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
            self.end_headers()
            try:
                for _ in range(2000):
                    self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n%s\r\n"
                                     % (len(jpeg), jpeg))
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Camera)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://viewer:s3cret@127.0.0.1:{server.server_address[1]}/video.mjpg"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("verb", ["run-json", "run", "bench"])
def test_stream_password_is_not_printed(tmp_path, capsys, cpu_bundle, mjpeg_stream, verb):
    """run printed the URI as given (header, --json header); bench's report (stdout and --json-file) too."""
    report = tmp_path / "report.json"
    argv = {"run-json": ("run", cpu_bundle, "--camera", mjpeg_stream, "--max-frames", "3", "--json"),
            "run": ("run", cpu_bundle, "--camera", mjpeg_stream, "--max-frames", "3"),
            "bench": ("bench", cpu_bundle, "--camera", mjpeg_stream, "--min-count", "3", "--repeats", "1",
                      "--min-duration", "0.01", "--json", "--json-file", report)}[verb]
    result = edgekit(capsys, *argv)
    assert result.code in (0, 1), result.err
    assert "s3cret" not in result.text and "127.0.0.1" in result.text
    assert not report.exists() or "s3cret" not in report.read_text()


@pytest.mark.parametrize("verb", ["run", "inspect"])
def test_closed_stdout(tmp_path, cpu_bundle, verb):
    """`edgekit run ... >&-` (cron, some service managers): Python's sys.stdout is None; it was an
    AttributeError traceback at the first result."""
    argv = {"run": ["run", str(cpu_bundle), "--camera", "synthetic:64x64", "--max-frames", "3"],
            "inspect": ["inspect", str(cpu_bundle)]}[verb]
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", *argv], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1),  # noqa: PLW1509 - as `>&-` does
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_edgetpu_named_model_without_the_edgetpu_op(tmp_path, capsys, cpu_bundle):
    """What a stand-in compiler leaves: `<name>_edgetpu.tflite` that is a plain model. The error
    told the user to build with edgetpu_compiler on PATH, which they had done."""
    b, m = _copy(cpu_bundle, tmp_path)
    entry = m["models"][0]
    renamed = entry["file"].replace(".tflite", "_edgetpu.tflite")
    (b / entry["file"]).rename(b / renamed)
    m["files"][renamed] = m["files"].pop(entry["file"])
    entry["file"], entry["runtime_options"] = renamed, {"delegate": "edgetpu"}
    (b / "edgekit.json").write_text(json.dumps(m))
    line = assert_refused(_run(capsys, b), "edgetpu-custom-op")
    assert "compiled nothing" in line


def test_labels_flag_naming_an_endless_file(capsys, cpu_bundle):
    """--labels /dev/zero read until memory ran out (read_text has no bound); now refused unread."""
    assert_refused(_run(capsys, cpu_bundle, "--labels", "/dev/zero"), "is a character device, not a regular file")


def test_serve_config_naming_an_endless_file(capsys):
    """--config /dev/zero read until memory ran out; now refused unread."""
    assert_refused(edgekit(capsys, "serve", "--config", "/dev/zero", "--print-config"), "is a character device")


def test_file_uri_without_a_path(capsys, cpu_bundle):
    line = assert_refused(_run(capsys, cpu_bundle, camera="file://"), "names no file")
    assert not line.endswith(": : no such video file")


def test_serve_bad_tls_file_leaves_no_results_file(tmp_path, capsys, cpu_bundle):
    """The results file was created before MQTT's TLS settings were refused."""
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    out = tmp_path / "results.jsonl"
    config = tmp_path / "serve.toml"
    config.write_text(f'[model]\npath = "{cpu_bundle}"\n[camera]\nuri = "synthetic"\n[output]\njsonl = "{out}"\n'
                      f'[mqtt]\nhost = "127.0.0.1"\nport = 9\ntls = true\nca_file = "{bad}"\n[http]\nlisten = "off"\n')
    before = snapshot(tmp_path)
    assert_refused(edgekit(capsys, "serve", "--config", str(config), "--max-frames", "2"), "TLS")
    assert_nothing_left(before, tmp_path)


def test_reader_leaving_keeps_the_recording(tmp_path, cpu_bundle):
    """`edgekit run ... --json --save out.mp4 | head`: the reader left, the run ended with exit 0
    and the recording was thrown away."""
    clip = tmp_path / "out.mp4"
    proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "run", str(cpu_bundle), "--camera",
                             "synthetic:64x64@30", "--json", "--every", "0", "--save", str(clip)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    for _ in range(4):
        proc.stdout.readline()
    proc.stdout.close()  # as `head -4` does
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert clip.is_file() and "saved" in err


@pytest.mark.parametrize("argv", [("serve", "{bundle}", "--print-config"),
                                  ("serve", "--write-example-config", "-"), ("doctor",), ("targets",)])
def test_any_verb_printing_to_a_full_disk(tmp_path, cpu_bundle, full_disk, argv):  # noqa: F811
    """Every verb's stdout is guarded in the CLI (these were OSError tracebacks)."""
    _fill(full_disk)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    with open(full_disk / "filler", "ab") as out:
        proc = subprocess.run([sys.executable, "-m", "edgekit.cli", *[a.format(bundle=cpu_bundle) for a in argv]],
                              stdout=out, stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 1 and "No space left" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
