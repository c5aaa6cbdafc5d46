"""The build takes the task and, for an open input, the size an Ultralytics ONNX export declares
(edgekit/builders/build.py:_declared); flags win."""

from __future__ import annotations

from types import SimpleNamespace

from edgekit.builders.build import _declared
from edgekit.builders.log import BuildLog
from tests.modelinfo.test_embedded import yolo_onnx


def _request(path, task=None, input_size=None):
    return SimpleNamespace(model=path, task=task, input_size=input_size)


def test_ultralytics_task_and_imgsz_are_used_where_nothing_was_given(tmp_path):
    fixed = yolo_onnx(tmp_path / "fixed.onnx")
    assert _declared(_request(fixed), BuildLog(quiet=True)) == ("detect", None)  # a fixed input keeps its own size
    dynamic = yolo_onnx(tmp_path / "dynamic.onnx", dims=(1, 3, "height", "width"))
    assert _declared(_request(dynamic), BuildLog(quiet=True)) == ("detect", (32, 32))
    assert _declared(_request(dynamic, task="raw", input_size=(64, 64)), BuildLog(quiet=True)) == (None, (64, 64))
    segment = yolo_onnx(tmp_path / "seg.onnx", props={"author": "Ultralytics", "task": "segment", "imgsz": "[32, 32]",
                                                      "names": "{0: 'a'}", "stride": "32", "batch": "1"})
    assert _declared(_request(segment), BuildLog(quiet=True))[0] is None  # no segment head: raw, as before


def test_other_files_declare_nothing(tmp_path):
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(b"\x08\x07")  # loading reports a damaged file; the declaration step stays quiet
    assert _declared(_request(plain), BuildLog(quiet=True)) == (None, None)
    assert _declared(_request(tmp_path), BuildLog(quiet=True)) == (None, None)
