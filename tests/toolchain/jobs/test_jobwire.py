"""jobwire, the one wire format both sides speak: messages over a pipe, job folders, one-line errors."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from edgekit.toolchain.jobs import jobwire


def test_a_message_carries_its_header_and_arrays_exactly():
    arrays = [np.arange(12, dtype=np.float32).reshape(1, 3, 4), np.array([[1, -2]], dtype=np.int8)]
    buf = io.BytesIO()
    jobwire.send(buf, {"op": "infer", "n": np.int64(3)}, arrays)
    jobwire.send(buf, {"op": "close"})
    buf.seek(0)
    header, got = jobwire.receive(buf)
    assert header == {"op": "infer", "n": 3, "arrays": 2}
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(arrays, got, strict=True))
    assert jobwire.receive(buf) == ({"op": "close", "arrays": 0}, [])
    with pytest.raises(jobwire.WireError, match="closed the pipe"):
        jobwire.receive(buf)


def test_a_stray_print_on_the_pipe_is_a_wire_error_not_a_hang():
    with pytest.raises(jobwire.WireError, match="something else"):
        jobwire.receive(io.BytesIO(b"I rknn-toolkit2 version: 2.5.0\n"))


def test_pickled_arrays_are_refused(tmp_path):
    np.save(tmp_path / "bad.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        jobwire.load_arrays(tmp_path, {"x": "bad.npy"})
    buf = io.BytesIO()
    with pytest.raises(ValueError):
        jobwire.send(buf, {}, [np.array([{"a": 1}], dtype=object)])


def test_a_job_folder_round_trips(tmp_path):
    names = jobwire.write_arrays(tmp_path / "in", {"calib": np.ones((2, 3), np.float32)})
    (tmp_path / jobwire.JOB).write_text(json.dumps({"platform": "rk3588", "arrays": names}))
    job, arrays = jobwire.read_job(tmp_path)
    assert job["platform"] == "rk3588" and arrays["calib"].shape == (2, 3)
    jobwire.write_result(tmp_path, {"ok": True, "score": np.float32(0.5)}, {"out_0": np.zeros(2)})
    assert (tmp_path / "out" / "out_0.npy").is_file() and (tmp_path / jobwire.RESULT).is_file()


def test_the_toolkits_traceback_in_a_message_becomes_its_last_reason():
    exc = ValueError("Traceback (most recent call last):\n  File \"rknn/api/rknn_log.py\", line 344\n"
                     "ValueError: The value of disable_rules only support <class 'list'> !")
    assert jobwire.one_line(exc) == "ValueError: The value of disable_rules only support <class 'list'> !"
    assert jobwire.one_line(KeyError("onnx")) == "KeyError: 'onnx'"
