"""``rknn.api.RKNN``, faked: the calls a build and the simulator make, checked and recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def _fails(name: str) -> bool:
    return os.environ.get("FAKE_RKNN_FAIL") == name


_RULE = "D RKNN: [02:29:34.525] " + "-" * 60
LAYER_TABLE = "\n".join([
    _RULE, "D RKNN: [02:29:34.525]            Network Layer Information Table", _RULE,
    "D RKNN: [02:29:34.525] ID   OpType     DataType Target InputShape    OutputShape  Cycles(DDR/NPU/Total) RW(KB) "
    "FullName", _RULE,
    "D RKNN: [02:29:34.525] 0    InputOperator INT8  CPU    \\            (1,1,8,8)    0/0/0    0   InputOperator:x",
    "D RKNN: [02:29:34.525] 1    ConvRelu   INT8     NPU    (1,1,8,8)     (1,4,8,8)    10/20/20 1   Conv:conv_1",
    "D RKNN: [02:29:34.525] 2    TopK       INT8     CPU    (1,4,8,8)     (1,2)        0/0/0    1   TopK:topk_1",
    "D RKNN: [02:29:34.525] 3    Reshape    INT8     CPU    (1,2)         (1,2)        0/0/0    1   Reshape:scores-rs",
    "D RKNN: [02:29:34.525] 4    OutputOperator INT8 CPU    (1,2)    \\    0/0/0    0   OutputOperator:scores",
    _RULE])
"""What a verbose build of the real toolkit prints (trimmed): one op the NPU cannot run (TopK), one data move."""


class RKNN:
    """Records calls in ``calls.json`` (the job folder); the 'model' answers (mean, 1 - mean)."""

    def __init__(self, verbose=False):
        if _fails("crash"):  # what a native crash looks like from outside: gone, no result
            print("Segmentation fault (core dumped)", flush=True)
            os._exit(139)
        self.calls: list = []
        self.state = "new"
        self.verbose = verbose

    def _record(self, *call) -> None:
        self.calls.append(list(call))
        Path("calls.json").write_text(json.dumps(self.calls))
        print(f"FAKE RKNN CALL {json.dumps(list(call))}", flush=True)  # the log a build keeps shows the sequence

    def config(self, mean_values=None, std_values=None, target_platform=None, quantized_algorithm="normal",
               disable_rules=None, **_):
        assert self.state == "new" and target_platform, "config first, with a platform"
        self._record("config", target_platform, mean_values, std_values, disable_rules)
        self.state = "configured"
        return -1 if _fails("config") else 0

    def load_onnx(self, model, **_):
        assert self.state == "configured" and Path(model).is_file(), model
        self._record("load_onnx", Path(model).name)
        self.state = "loaded"
        return -1 if _fails("load_onnx") else 0

    def build(self, do_quantization=False, dataset=None, **_):
        assert self.state == "loaded" and do_quantization
        files = Path(dataset).read_text().split()
        shapes = {np.load(f).shape for f in files}
        assert len(shapes) == 1 and next(iter(shapes))[0] == 1, shapes  # one NHWC tensor per file
        self._record("build", len(files), list(next(iter(shapes))))
        self.state = "built"
        if self.verbose:  # the real toolkit's verbose build prints where each op runs
            print(LAYER_TABLE, flush=True)
        return -1 if _fails("build") else 0

    def export_rknn(self, path):
        assert self.state == "built"
        Path(path).write_bytes(b"RKNN fake model")
        self._record("export_rknn", path)
        return -1 if _fails("export_rknn") else 0

    def init_runtime(self, target=None, **_):
        assert self.state == "built" and target is None, "the simulator runs a model just built"
        self._record("init_runtime", target)
        self.state = "running"
        return -1 if _fails("init_runtime") else 0

    def inference(self, inputs, data_format=None, **_):
        assert self.state == "running" and data_format == "nhwc"
        x = inputs[0]
        assert x.ndim == 4 and x.shape[0] == 1 and x.dtype == np.float32
        if _fails("inference"):
            return None
        m = float(x.mean())
        if os.environ.get("FAKE_RKNN_SWAP"):  # a quantisation that broke the model: the classes swap
            return [np.array([[1.0 - m, m]], dtype=np.float32)]
        return [np.array([[m, 1.0 - m]], dtype=np.float32)]

    def accuracy_analysis(self, inputs, output_dir, target=None, **_):
        assert self.state == "running" and all(Path(p).is_file() for p in inputs)
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        out.joinpath("error_analysis.txt").write_text(
            "# simulator_error: calculate the output error of each layer of the simulator\n"
            "layer_name                 simulator_error\n"
            "                           entire            single\n"
            "                           cos      euc      cos      euc\n"
            "[Input] x                  1.00000 | 0.0     1.00000 | 0.0\n"
            "[Conv] conv_1              0.99812 | 1.2     0.99812 | 1.2\n"
            "[Conv] conv_2              0.91234 | 9.8     0.95000 | 4.1\n"
            "[Gemm] fc                  0.97000 | 3.3     0.99900 | 0.2\n")
        self._record("accuracy_analysis", len(inputs))
        return 0

    def release(self):
        self._record("release")
