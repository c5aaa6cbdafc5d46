"""Fault catalogue 3 (issue 38 items 5-7): tracebacks, a hang and silent outcomes, each now one
line with a fix and the documented exit code, nothing left behind.

- a ``.tflite`` whose zipped label file has a corrupt deflate stream (``zlib.error``, run and build);
- ``inspect`` on a ``.tflite`` whose operator names a tensor the file does not have (``IndexError``);
- ``bench --csv/--plot/--json-file`` into a path that runs through a file: refused before measuring;
- ``--json-file`` naming a FIFO: refused at once (``open()`` blocked for ever);
- ``run`` stopped by SIGTERM exits 143 (was 0), summary printed;
- Ultralytics metadata ``task: classify`` on a detector-shaped output, and an ``imgsz`` the graph
  does not have: said in one note line, the classify task not applied.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ROOT
from tests.helpers.faults import assert_nothing_left, assert_refused, edgekit, snapshot


@pytest.fixture(scope="module")
def float_tflite() -> Path:
    from tests.helpers import tflite_models

    return tflite_models.model_path("small_float")


def _corrupt_labels_model(tmp_path: Path, source: Path) -> Path:
    """``source`` with TFLite metadata naming labels.txt, zipped on deflated, its stream broken."""
    from tests.modelinfo.test_embedded import _metadata, _with_metadata

    path = tmp_path / "labelled.tflite"
    path.write_bytes(_with_metadata(source.read_bytes(), _metadata()))
    labels = "".join(f"class{i}\n" for i in range(10))
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("labels.txt", labels)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("labels.txt")
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start] = 0xFF  # BFINAL 1, BTYPE 11 (reserved): zlib says "invalid block type"
    path.write_bytes(bytes(data))
    return path


def test_corrupt_deflate_in_the_label_zip_is_one_line_in_run_and_build(tmp_path, capsys, float_tflite):
    model = _corrupt_labels_model(tmp_path, float_tflite)
    before = snapshot(tmp_path)
    result = edgekit(capsys, "run", model, "--camera", "synthetic:32x32@30", "--max-frames", "1")
    assert_refused(result, "labelled.tflite", "labels.txt", "cannot be read")
    out = tmp_path / "dist"
    result = edgekit(capsys, "build", "--model", model, "--target", "cpu", "--out", out, "-q",
                     "--calib", ROOT / "calib" / "fashion", "--calib-count", "4")
    assert_refused(result, "labelled.tflite", "labels.txt")
    assert_nothing_left(before, tmp_path)


def test_inspect_of_an_operator_naming_a_missing_tensor_is_one_line(tmp_path, capsys, float_tflite):
    import flatbuffers
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(float_tflite.read_bytes(), 0))
    op = model.subgraphs[0].operators[0]
    op.inputs = np.array(op.inputs, np.int32)  # a writable copy of the read-only view
    op.inputs[0] = 999
    b = flatbuffers.Builder(1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    path = tmp_path / "dangling.tflite"
    path.write_bytes(bytes(b.Output()))
    before = snapshot(tmp_path)
    line = assert_refused(edgekit(capsys, "inspect", path), "dangling.tflite", "names tensor 999")
    assert "operator 0" in line
    assert_nothing_left(before, tmp_path)


@pytest.mark.parametrize("flag", ["--csv", "--plot", "--json-file"])
def test_bench_output_through_a_file_is_refused_before_measuring(tmp_path, capsys, flag, monkeypatch):
    import edgekit.commands.bench as bench

    ran = []  # the benchmark itself must not start: the mistake used to surface after it
    monkeypatch.setattr(bench, "_bench", lambda args: ran.append(args) or 0)
    (tmp_path / "notes.txt").write_text("x")
    name = "out.png" if flag == "--plot" else "out.csv"
    before = snapshot(tmp_path)
    result = edgekit(capsys, "bench", tmp_path / "missing-bundle", flag, tmp_path / "notes.txt" / name)
    assert_refused(result, f"{flag} ", "notes.txt is a file, not a folder")
    assert not ran
    assert_nothing_left(before, tmp_path)


def test_json_file_naming_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "edgekit.cli", "targets", "--json-file", str(fifo)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "--json-file" in done.stderr and "FIFO" in done.stderr and "fix:" in done.stderr


def test_json_file_fifo_with_a_reader_is_not_written(tmp_path, capsys):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(Path(fifo).read_bytes()), daemon=True)
    reader.start()  # a reader waiting: open() of the FIFO for writing would succeed and stream into it
    try:
        assert_refused(edgekit(capsys, "targets", "--json-file", fifo), "is a FIFO")
    finally:
        _release(fifo)
        reader.join(10)
    assert got == [b""]


def _release(fifo: Path, deadline_s: float = 30.0) -> None:
    """Open and close ``fifo`` for writing, so its reader's read ends. A non-blocking open fails with
    ENXIO until the reader thread has opened its end (on a loaded machine it may not have yet: a CI run
    failed so), so it is tried again until then."""
    import errno
    import time

    end = time.monotonic() + deadline_s
    while True:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > end:
                raise
            time.sleep(0.01)


def _yolo_shaped(path: Path, props: dict, dims=(1, 3, 20, 25), channels: int = 8) -> Path:
    """A [1, channels, H*W] output (a detector's shape) with Ultralytics-style metadata."""
    w = numpy_helper.from_array(np.full((channels, 3, 1, 1), 0.1, np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, channels, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["images", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["output0"])]
    out = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, channels, dims[2] * dims[3]])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, dims)],
                              [out], [w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"author": "Ultralytics", **props})
    path.write_bytes(model.SerializeToString())
    return path


NAMES = str({i: f"c{i}" for i in range(4)})


def test_classify_metadata_on_a_detector_output_is_not_applied(tmp_path, capsys):
    path = _yolo_shaped(tmp_path / "det.onnx", {"task": "classify", "imgsz": "[20, 25]", "names": NAMES})
    result = edgekit(capsys, "run", path, "--camera", "synthetic:64x64@30", "--max-frames", "2")
    assert result.code == 0 and "Traceback" not in result.text, result.text
    notes = [line for line in result.text.splitlines() if "task 'classify' ignored" in line]
    assert len(notes) == 1 and "[1, 8, 500]" in notes[0] and "--task detect" in notes[0]
    assert "; task raw" in result.out  # no top-k of 500 "class scores"


def test_imgsz_that_disagrees_with_the_graph_is_said(tmp_path, capsys):
    path = _yolo_shaped(tmp_path / "det.onnx", {"task": "detect", "imgsz": "[640, 640]", "names": NAMES})
    result = edgekit(capsys, "run", path, "--camera", "synthetic:64x64@30", "--max-frames", "2")
    assert result.code == 0 and "Traceback" not in result.text, result.text
    notes = [line for line in result.text.splitlines() if "imgsz 640x640 disagrees" in line]
    assert len(notes) == 1 and "input 20x25" in notes[0]
    agreed = _yolo_shaped(tmp_path / "ok.onnx", {"task": "detect", "imgsz": "[20, 25]", "names": NAMES})
    assert "disagrees" not in edgekit(capsys, "run", agreed, "--camera", "synthetic:64x64@30",
                                      "--max-frames", "2").text


def test_run_stopped_by_sigterm_exits_143_with_its_summary(tmp_path):
    model = _yolo_shaped(tmp_path / "det.onnx", {"task": "detect", "imgsz": "[20, 25]", "names": NAMES})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "edgekit.cli", "run", str(model), "--camera", "synthetic:64x64@30",
           "--duration", "30", "--every", "0"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as p:
        try:
            for line in p.stdout:  # running: a frame printed
                if line.startswith("frame "):
                    break
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
        finally:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "summary:" in out and "interrupted" in out and "Traceback" not in err
