"""Fault catalogue, files left behind: profiling traces and the benchmark scripts' work directories.

`bench --profile` and the ONNX Runtime adapter keep a trace in a temporary directory; the
figure scripts under benchmarks/ convert models into one. Whatever way they end (normally,
an error, SIGTERM), nothing of theirs may stay in the temp dir.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.faults import edgekit


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> Path:
    """A real (tiny) ONNX image model: a 1x1 convolution and a global average, 3 classes."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((3, 1, 1, 1), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], initializer=[w])
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _left(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name != ".ses")


def test_profiling_runtime_closed_without_collecting_leaves_nothing(onnx_model, private_tmp):
    from edgekit.runtime.onnxrt import OnnxRuntime

    with OnnxRuntime(onnx_model, providers="cpu", profile=True) as rt:
        rt.infer(__import__("numpy").zeros((1, 1, 16, 16), "float32"))
        assert _left(private_tmp), "the profile should have a directory while the runtime is open"
    assert _left(private_tmp) == []


def test_corrupt_onnx_with_profiling_leaves_nothing(tmp_path, private_tmp):
    from edgekit.errors import ModelError
    from edgekit.runtime.onnxrt import OnnxRuntime

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    with pytest.raises(ModelError) as info:
        OnnxRuntime(bad, providers="cpu", profile=True)
    assert info.value.hint and _left(private_tmp) == []


def test_bench_profile_leaves_nothing(capsys, onnx_model, private_tmp):
    result = edgekit(capsys, "bench", str(onnx_model), "--profile", "--min-count", "5", "--repeats", "1",
                     "--warmup", "0")
    assert result.code == 0, result.text
    assert "Traceback" not in result.text
    assert _left(private_tmp) == []


def _script(body: str, tmp: Path) -> subprocess.Popen:
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); from precision import work_dir\n{body}"
    return subprocess.Popen([sys.executable, "-c", code], env={"TMPDIR": str(tmp), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("ending", ["normal", "error", "sigterm"])
def test_benchmark_work_dir_is_removed(tmp_path, ending):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    body = {"normal": "p = work_dir(None, 'edgekit-x-'); (p / 'm.tflite').write_bytes(b'x' * 1000)",
            "error": "p = work_dir(None, 'edgekit-x-'); (p / 'm.tflite').write_bytes(b'x'); raise SystemExit('boom')",
            "sigterm": "import time; p = work_dir(None, 'edgekit-x-'); print(p, flush=True); time.sleep(30)"}[ending]
    proc = _script(body, tmp)
    if ending == "sigterm":
        assert proc.stdout is not None and proc.stdout.readline()
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert list(tmp.iterdir()) == [], list(tmp.iterdir())


def test_benchmark_work_dir_given_is_kept(tmp_path):
    keep = tmp_path / "keep"
    proc = _script(f"work_dir(__import__('pathlib').Path({str(keep)!r}), 'edgekit-x-')", Path(tempfile.gettempdir()))
    proc.communicate(timeout=30)
    assert keep.is_dir()
