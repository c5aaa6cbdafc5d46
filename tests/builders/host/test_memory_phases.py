"""The build's memory estimate covers the phases after conversion (issue 38 item 9): onnx2tf's
process beside the build, the per-layer quantisation report and int8 recovery's per-layer probe,
from the graph's activation total; and the peak the build reports counts its child processes."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgekit.builders.host import resources
from edgekit.builders.host.memory import (
    TOTAL_WEIGHTS,
    Activations,
    activation_total,
    onnx_activation_bytes,
    tflite_activation_bytes,
    widest_step,
)
from edgekit.builders.host.resources import (
    BASE_BYTES,
    GB,
    ONNX_CHILD_BYTES,
    ONNX_CHILD_COPIES,
    ONNX_RUNTIME_BYTES,
    PHASE_BASE_BYTES,
    PROBE_COPIES,
    REFERENCE_TOTAL_BYTES_PER_PIXEL,
    REPORT_COPIES,
    WEIGHT_COPIES,
    estimate_memory,
    memory_phases,
)
from tests.conftest import CALIB, DEMO_MODEL

MB = 1 << 20
# MediaPipe's palm detection lite as the graph walk reads it (192x192, 1.9 MB file): widest step
# 3.4 MB, activation total 68.4 MB; its cpu build peaked at 1.03 GB in int8 recovery (2.30 GB while
# recovery's probe held four images whole)
PALM = dict(height=192, width=192, chunk=10, n_images=64, model_bytes=1_985_440)
PALM_GRAPH = Activations(3_538_944, 71_717_760)


def test_the_phases_are_pinned_on_known_inputs():
    phases = memory_phases(**PALM, activation_bytes=PALM_GRAPH, int8=True, probe=True)
    base = PHASE_BASE_BYTES + WEIGHT_COPIES * PALM["model_bytes"]
    assert phases["probe"] == base + PROBE_COPIES * PALM_GRAPH.total
    assert phases["report"] == base + REPORT_COPIES * PALM_GRAPH.total
    assert "onnx2tf" not in phases
    estimate = estimate_memory(**PALM, activation_bytes=PALM_GRAPH, int8=True, probe=True)
    assert estimate == phases["probe"] == max(phases.values())
    assert 1.03 * GB <= estimate <= 1.5 * 1.03 * GB  # never below the measured peak, within 1.5x


def test_without_int8_the_estimate_is_the_conversion_alone():
    """An fp32-only build (rpi, jetson) runs neither the report nor the probe: the old formula."""
    pixels = 192 * 192
    assert estimate_memory(**PALM) == int(BASE_BYTES + WEIGHT_COPIES * PALM["model_bytes"]
                                          + (480 * 10 + 400) * pixels + 1024 * 64)
    assert set(memory_phases(**PALM, activation_bytes=PALM_GRAPH)) == {"convert"}


def test_an_onnx_source_predicts_more_than_the_same_graph_as_tflite():
    same = dict(**PALM, activation_bytes=PALM_GRAPH, int8=True, probe=True)
    onnx, tflite = memory_phases(**same, onnx=True), memory_phases(**same)
    assert onnx["probe"] - tflite["probe"] == ONNX_RUNTIME_BYTES  # ONNX Runtime's session beside TensorFlow
    child = ONNX_CHILD_BYTES + WEIGHT_COPIES * PALM["model_bytes"] + ONNX_CHILD_COPIES * PALM_GRAPH.total
    assert onnx["onnx2tf"] == child
    assert estimate_memory(**same, onnx=True) > estimate_memory(**same)
    # an fp32-only ONNX build still has onnx2tf's process: never below it
    assert estimate_memory(**PALM, activation_bytes=PALM_GRAPH, onnx=True) >= onnx["onnx2tf"]


def test_the_probe_grows_with_the_activation_total_and_the_conversion_with_the_widest_step():
    small = Activations(3 * MB, 40 * MB)
    more = Activations(3 * MB, 80 * MB)
    wider = Activations(300 * MB, 40 * MB)
    small, more, wider = (memory_phases(**PALM, activation_bytes=a, int8=True, probe=True)
                          for a in (small, more, wider))
    assert more["probe"] - small["probe"] == PROBE_COPIES * 40 * MB
    assert more["convert"] == small["convert"]  # the same widest step
    assert wider["convert"] > 5 * small["convert"] > 0
    assert wider["probe"] == small["probe"]


def test_an_unknown_total_stands_in_as_mobilenetv2_per_pixel():
    for activation in (None, 3 * MB):  # unmeasured, or a plain int (the widest step alone)
        phases = memory_phases(**PALM, activation_bytes=activation, probe=True)
        total = REFERENCE_TOTAL_BYTES_PER_PIXEL * 192 * 192
        assert phases["probe"] == PHASE_BASE_BYTES + WEIGHT_COPIES * PALM["model_bytes"] + PROBE_COPIES * total


def test_the_widest_step_carries_the_weighted_total():
    steps = [([10], [20]), ([20], [30], 0), ([30], [5, 5], 4)]
    found = widest_step(steps)
    assert found == 50 and found.total == 20 + 0 + 40
    assert isinstance(found, int) and found + 1 == 51  # the loaders' precheck still gets an int
    assert pickle.loads(pickle.dumps(found)).total == 60
    assert activation_total(found) == 60 and activation_total(50) is None and activation_total(None) is None
    assert widest_step([]) is None
    assert TOTAL_WEIGHTS["Relu"] == TOTAL_WEIGHTS["BatchNormalization"] == 0 and TOTAL_WEIGHTS["PRELU"] == 4


def _onnx_model():
    """Conv (8 channels) -> BatchNormalization -> Relu -> PRelu -> Reshape to a computed shape -> MatMul
    at 1x3x16x16."""
    from onnx import TensorProto, helper, numpy_helper

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value, np.float32 if np.asarray(value).dtype.kind == "f"
                                                  else np.int64), name)

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("PRelu", ["r", "slope"], ["p"]),
             helper.make_node("Shape", ["p"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
             helper.make_node("Concat", ["batch", "minus1"], ["flat"], axis=0),
             helper.make_node("Reshape", ["p", "flat"], ["q"]),
             helper.make_node("MatMul", ["q", "fc"], ["y"])]
    inits = [const("w", np.zeros((8, 3, 3, 3))), const("s", np.ones(8)), const("b", np.zeros(8)),
             const("m", np.zeros(8)), const("v", np.ones(8)), const("slope", np.full((8, 1, 1), 0.1)),
             const("zero", [0]), const("minus1", [-1]), const("fc", np.zeros((8 * 16 * 16, 4)))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_onnx_total_fuses_batch_norm_and_relu_counts_prelu_rewritten_and_leaves_out_constants():
    plane = 8 * 16 * 16 * 4
    found = onnx_activation_bytes(_onnx_model())
    assert found is not None, "the Reshape to a computed shape is bounded by its input, not unmeasured"
    # Conv once, BatchNormalization and Relu fused (0), PRelu as four ops, Reshape once, MatMul's 4 floats;
    # Shape/Gather/Concat of the shape are constants
    assert found.total == plane + 4 * plane + plane + 4 * 4
    assert found == plane + plane + 16  # the Reshape reads a plane and its 2-element shape, writes a plane


class _Interp:
    """A LiteRT interpreter's graph as tflite_activation_bytes reads it: input 0, a float16 weight
    dequantised (op 0), a conv (op 1), a PRELU (op 2)."""

    def get_tensor_details(self):
        def t(index, shape, dtype=np.float32):
            return {"index": index, "shape": np.array(shape), "shape_signature": np.array(shape), "dtype": dtype}

        return [t(0, [1, 8, 8, 3]), t(1, [4, 3, 3, 3], np.float16), t(2, [4, 3, 3, 3]), t(3, [1, 8, 8, 4]),
                t(4, [1, 1, 4]), t(5, [1, 8, 8, 4])]

    def _get_ops_details(self):
        return [{"op_name": "DEQUANTIZE", "inputs": [1], "outputs": [2]},
                {"op_name": "CONV_2D", "inputs": [0, 2], "outputs": [3]},
                {"op_name": "PRELU", "inputs": [3, 4], "outputs": [5]}]

    def get_input_details(self):
        return [{"index": 0}]


def test_tflite_total_leaves_out_dequantised_weights_and_counts_prelu_rewritten():
    found = tflite_activation_bytes(_Interp())
    plane = 8 * 8 * 4 * 4
    assert found.total == plane + 4 * plane  # the dequantised weight is no activation
    assert found == 8 * 8 * 3 * 4 + 4 * 27 * 4 + plane  # the conv: its input, the dequantised weight, its output


def _request(**settings):
    from edgekit.builders.request import BuildRequest

    return BuildRequest(model=DEMO_MODEL, calib=[CALIB], **settings)


@pytest.mark.parametrize("targets,settings,plans", [
    (["cpu"], {}, (True, True)),  # int8 with float layers allowed: the probe may run
    (["edgetpu"], {}, (True, False)),  # compiled: full-integer only, report but no probe
    (["rpi"], {}, (False, False)),  # fp32 and fp16 only
    (["cpu"], {"recover": False}, (True, False)),
    (["cpu"], {"variants": ("fp32",)}, (False, False)),
    (["jetson", "edgetpu"], {}, (True, False)),
])
def test_which_phases_a_request_runs(targets, settings, plans):
    from edgekit.builders.host.preflight import int8_plans

    assert int8_plans(_request(targets=targets, **settings)) == plans


def _child(mb: int, seconds: float) -> subprocess.Popen:
    """A Python child holding ``mb`` MB for ``seconds``, returned once it holds them."""
    code = f"b = bytearray({mb} << 20); print('held', flush=True); import time; time.sleep({seconds})"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    time.sleep(0.3)  # a few looks of the watch
    return child


class _Log:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)


def test_the_precheck_names_the_phase_that_peaks_and_the_build_reports_its_children():
    from edgekit.builders.host.preflight import check_resources, log_peak_memory
    from edgekit.builders.host.tree import current_watch

    log = _Log()
    check_resources(_request(targets=["cpu"]), log, (192, 192, 3), PALM_GRAPH)
    [line] = log.lines
    assert "should peak near" in line and "if int8 recovery's per-layer probe runs: 68.4 MB of activations" in line
    assert current_watch() is not None  # started by the pre-check
    _child(300, 0.5).wait()
    log_peak_memory(log, time.perf_counter() - 2)
    assert current_watch() is None
    # the tree's peak is this process and its children at one instant; in a test runner whose own RSS
    # swings by more than the child's 300 MB (a clean-clone CI worker at 2 GB), that instant may have
    # no child, and the line names the largest child alone instead
    line = log.lines[-1]
    assert "this process and its children together" in line
    assert "(this process" in line or "the largest child alone 0.3" in line, line
    peak = float(line.split("peak RSS ")[1].split(" GB")[0])
    assert peak >= 0.29


def test_the_tree_watch_adds_a_childs_peak_to_this_process(monkeypatch):
    from edgekit.builders.host.tree import start_watch, stop_watch

    watch = start_watch()
    child = _child(200, 0.5)
    assert resources.build_peak() >= 190 * MB + resources.current_rss() * 0.5  # recovery's --max-memory reads this
    child.wait()
    peak = stop_watch()
    assert peak is not None and watch is not None
    # the child was seen whole; whether it is in the tree's peak instant depends on how much this
    # process's own RSS swings meanwhile (a 2 GB CI worker's swung by more than the child: children 0)
    assert peak.largest_child >= 190 * MB
    assert peak.tree == peak.own + peak.children >= max(peak.own, 190 * MB)
    assert stop_watch() is None


def test_a_watch_ends_with_the_build_it_watched():
    import gc

    from edgekit.builders.host.tree import TreeWatch

    owner = _Log()
    watch = TreeWatch(owner, interval=0.01).start()
    del owner
    gc.collect()
    watch._thread.join(timeout=2)  # noqa: SLF001 - the thread is what must not outlive its build
    assert not watch._thread.is_alive()  # noqa: SLF001


def test_benchmark_measures_a_process_tree(tmp_path):
    """benchmarks/build_memory.py's sampler: a parent and the child it waits on count together."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    try:
        from build_memory import Tree, sample
    finally:
        sys.path.pop(0)
    code = ("import subprocess, sys, time; a = bytearray(100 << 20); "
            "subprocess.run([sys.executable, '-c', 'b = bytearray(150 << 20); import time; time.sleep(1.5)'])")
    proc = subprocess.Popen([sys.executable, "-c", code])
    tree = Tree(proc.pid)
    while proc.poll() is None:
        sample(tree, 0.0)
        time.sleep(0.05)
    assert tree.peak >= 240 * MB and len(tree.peak_parts) == 2
