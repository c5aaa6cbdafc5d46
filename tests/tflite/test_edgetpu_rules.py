"""Offline Edge TPU check on real converted models (tf.lite.TFLiteConverter) and the graph reader."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from edgekit.errors import ModelError
from edgekit.tflite.edgetpu_rules import (
    CACHE_BYTES,
    IMPLEMENTED_RULES,
    NOT_IMPLEMENTED_RULES,
    SUPPORTED_OPS,
    check_graph,
    check_model,
)
from edgekit.tflite.graph import OperatorInfo, read_graph
from tests.helpers import tflite_models


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tflite")
    return lambda name: tflite_models.model_path(name, directory)


# --- the four models the issue names -------------------------------------------------------


def test_full_int8_cnn_is_predicted_100_percent_on_the_tpu(model):
    report = check_model(model("small_int8"))
    assert report.total_ops == 8 and report.tpu_ops == 8
    assert report.op_share == 1.0 and report.parameter_share == 1.0
    assert report.cut is None and report.warnings == ()
    assert [o.opcode for o in report.ops] == [
        "QUANTIZE", "CONV_2D", "MAX_POOL_2D", "CONV_2D", "MEAN", "FULLY_CONNECTED", "SOFTMAX", "QUANTIZE",
    ]  # fmt: skip
    assert report.ops[0].dtypes == "uint8->int8" and report.ops[-1].dtypes == "int8->uint8"
    assert all(o.on_tpu and o.reason == "mapped" for o in report.ops)
    assert report.cache_status == "fits"
    # aggregated like the compiler's table: the two CONV_2D share one row
    conv = [r for r in report.rows if r.opcode == "CONV_2D"]
    assert len(conv) == 1 and conv[0].count == 2


def test_float_model_is_0_percent_not_quantised(model):
    report = check_model(model("small_float"))
    assert report.tpu_ops == 0 and report.op_share == 0.0 and report.parameter_share == 0.0
    assert all(not o.on_tpu and o.reason == "not int8/uint8 quantised (float32)" for o in report.ops)
    assert report.cut is not None and report.cut.index == 0
    assert report.cache_status == "none"
    assert report.warnings == (
        "no op is predicted to run on the Edge TPU (op 0 CONV_2D: not int8/uint8 quantised (float32))",
    )
    assert [(r.opcode, r.count) for r in report.rows][0] == ("CONV_2D", 2)


def test_unsupported_op_early_cuts_the_graph_there(model):
    path = model("gather_int8")
    report = check_model(path)
    graph = read_graph(path)
    gather = next(op.index for op in graph.operators if op.opcode == "GATHER")
    assert gather == 2
    assert report.cut is not None and (report.cut.index, report.cut.opcode) == (2, "GATHER")
    assert "not in the Edge TPU's supported-operations table" in report.cut.reason
    assert [o.on_tpu for o in report.ops] == [True, True] + [False] * 6
    # supported ops after the cut still run on the CPU, and say why
    later_conv = report.ops[3]
    assert later_conv.opcode == "CONV_2D" and later_conv.problems == ()
    assert later_conv.reason == "after the cut at op 2 (GATHER): runs on the CPU"
    assert report.op_share == pytest.approx(2 / 8)
    # parameters: only the first conv's weights+bias are on the TPU
    first_conv = graph.operators[1]
    assert report.tpu_parameter_bytes == graph.op_parameter_bytes(first_conv)
    assert 0 < report.parameter_share < 0.5
    assert any(w.startswith("graph cut at op 2 (GATHER") for w in report.warnings)


def test_seed_anki_cnn_overflows_the_parameter_cache(model):
    path = model("anki_int8")
    graph = read_graph(path)
    # the Flatten->Dense(128) kernel: 128 x 135424 int8 weights, 17.3 MB by itself
    dense = [t for t in graph.tensors if t.shape == (128, 135424)]
    assert len(dense) == 1 and dense[0].dtype == "int8" and dense[0].constant_bytes == 128 * 135424
    report = check_model(path)
    assert report.op_share == 1.0  # every op maps...
    assert report.tpu_parameter_bytes > 2 * CACHE_BYTES
    assert report.cache_status == "streams"  # ...but the weights stream from the host every inference
    assert "exceed the ~8 MiB on-chip cache" in report.cache_message
    assert report.cache_message in report.warnings


# --- individual rules on real converted models ----------------------------------------------


def test_dynamic_batch_is_reported(model):
    report = check_model(model("dynamic_int8"))
    assert report.tpu_ops == 0
    assert report.ops[0].reason.startswith("dynamic shape (shape_signature [-1, 32, 32, 1])")


def test_batch_2_breaks_the_rank_rule(model):
    report = check_model(model("batch2_int8"))
    assert report.tpu_ops == 0
    assert report.ops[0].reason.startswith("tensor rank rule: [2, 32, 32, 1]")


def test_unequal_dilation_is_not_supported(model):
    report = check_model(model("dilated_int8"))
    assert report.cut.opcode == "CONV_2D" and report.cut.index == 1
    assert report.cut.reason == "CONV_2D dilation differs in y and x (2 vs 1)"


def test_fully_connected_with_4d_output_is_not_supported(model):
    report = check_model(model("dense4d_int8"))
    assert report.cut.opcode == "FULLY_CONNECTED"
    assert report.cut.reason == "FULLY_CONNECTED output [1, 8, 8, 6] is not one-dimensional (keep_num_dims)"
    assert report.tpu_ops == 2


def test_min_runtime_version_12_rejects_quantize(model):
    report = check_model(model("small_int8"), runtime_version=12)
    assert report.runtime_version == 12
    assert report.cut.index == 0
    assert report.cut.reason == "QUANTIZE needs Edge TPU runtime 13+ (minimum runtime 12 requested)"


# --- rules Keras does not emit directly: one option changed on a real graph ------------------


def _with_op(graph, index, **changes):
    ops = list(graph.operators)
    ops[index] = dataclasses.replace(ops[index], **changes)
    return dataclasses.replace(graph, operators=tuple(ops))


def test_pooling_with_fused_activation_is_not_supported(model):
    graph = read_graph(model("small_int8"))
    pool = graph.operators[2]
    assert pool.opcode == "MAX_POOL_2D" and pool.options["fused_activation_function"] == "NONE"
    changed = _with_op(graph, 2, options={**pool.options, "fused_activation_function": "RELU"})
    report = check_graph(changed)
    assert report.cut.index == 2
    assert report.cut.reason == "MAX_POOL_2D with a fused activation (RELU) is not supported"


def test_custom_op_is_not_supported(model):
    graph = read_graph(model("small_int8"))
    changed = _with_op(graph, 5, opcode="MyCustomOp", custom=True)
    report = check_graph(changed)
    assert report.cut.index == 5 and report.cut.reason == "custom op 'MyCustomOp' is not supported by the Edge TPU"


def test_compiled_model_counts_the_custom_op_as_tpu(model):
    graph = read_graph(model("small_int8"))
    first, last = graph.operators[0], graph.operators[-1]
    tpu_op = OperatorInfo(0, "edgetpu-custom-op", True, 1, first.inputs, graph.operators[-2].outputs, {})
    cpu_op = dataclasses.replace(last, index=1)
    report = check_graph(dataclasses.replace(graph, operators=(tpu_op, cpu_op)))
    assert report.compiled and report.cut is None
    assert [(o.opcode, o.on_tpu) for o in report.ops] == [("edgetpu-custom-op", True), ("QUANTIZE", False)]


# --- report plumbing and the graph reader ----------------------------------------------------


def test_report_to_dict_is_json(model):
    d = check_model(model("gather_int8")).to_dict()
    again = json.loads(json.dumps(d))
    assert again["cut"]["opcode"] == "GATHER" and again["op_share"] == 0.25
    assert again["rows"][2] == {
        "opcode": "GATHER", "count": 1, "dtypes": "int8", "on_tpu": False,
        "reason": "GATHER is not in the Edge TPU's supported-operations table",
    }  # fmt: skip


def test_rule_lists_are_published():
    assert len(IMPLEMENTED_RULES) >= 10 and len(NOT_IMPLEMENTED_RULES) >= 5
    assert SUPPORTED_OPS["QUANTIZE"][0] == 13 and "GATHER" not in SUPPORTED_OPS


def test_graph_reader_reads_options_and_shapes(model):
    graph = read_graph(model("dense4d_int8"))
    fc = next(op for op in graph.operators if op.opcode == "FULLY_CONNECTED")
    assert fc.options["keep_num_dims"] is True and fc.options["weights_format"] == "DEFAULT"
    conv = read_graph(model("dilated_int8")).operators[1]
    assert (conv.options["dilation_h_factor"], conv.options["dilation_w_factor"]) == (2, 1)
    assert conv.options["fused_activation_function"] == "RELU"
    dyn = read_graph(model("dynamic_int8"))
    assert dyn.tensors[dyn.inputs[0]].shape_signature == (-1, 32, 32, 1)
    small = read_graph(model("small_int8"))
    assert small.subgraph_count == 1
    inp = small.tensors[small.inputs[0]]
    assert (inp.dtype, inp.shape, inp.quantised) == ("uint8", (1, 32, 32, 1), True)
    mean = small.operators[4]
    assert small.constant(mean.inputs[1]).tolist() == [1, 2]  # reduce over y and x


def test_not_a_tflite_file_is_a_model_error(tmp_path):
    bad = tmp_path / "notes.tflite"
    bad.write_text("this is not a model")
    with pytest.raises(ModelError, match="not a TFLite model"):
        read_graph(bad)
    with pytest.raises(ModelError, match="does not exist"):
        check_model(tmp_path / "missing.tflite")


def test_truncated_tflite_is_a_model_error(model, tmp_path):
    data = model("small_int8").read_bytes()
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(data[:64])
    with pytest.raises(ModelError, match="corrupt or truncated"):
        read_graph(cut)


def test_reading_and_checking_never_import_tensorflow(model):
    code = (
        "import sys\n"
        "from edgekit.tflite.edgetpu_rules import check_model\n"
        "import edgekit.commands.inspect, edgekit.builders.edgetpu.compiler\n"
        f"r = check_model({str(model('gather_int8'))!r})\n"
        "assert r.cut.opcode == 'GATHER'\n"
        "bad = [m for m in ('tensorflow', 'keras', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
