"""onnx2tf's documented fallbacks and the log a failed conversion leaves (builders/convert/onnx2tf_fallbacks.py,
builders/convert/onnx_to_tf.py).

onnx2tf ends every error with advice ("try the -onwdt option", "-kt or -kat") an edgekit user
cannot follow. edgekit tries the option that answers the error before failing, says which it
tried, and keeps onnx2tf's full log in a file the error names. The real PP-OCRv4 text detector
failed in onnx2tf's strict mode; :func:`hardswish_block` is its first HardSwish block in small
and fails the same way.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.builders.convert.onnx2tf_fallbacks import (
    FOLD_SHAPES,
    Failure,
    GraphFacts,
    last_error,
    merged,
    next_fallback,
    read_failure,
    stopped_at,
)
from edgekit.builders.log import BuildLog
from edgekit.errors import ModelError
from tests.conftest import real_model_file

ADVICE = """ERROR: The trace log is below.
Traceback (most recent call last):
  File "onnx2tf/utils/common_functions.py", line 6242, in acquisition_of_validation_data
ValueError: Output tensors of a Functional model must be the output of a TensorFlow `Layer`. Found: 3.0
ERROR: input_onnx_file_path: model.onnx
ERROR: onnx_op_name: add_three
ERROR: Read this and deal with it. https://github.com/PINTO0309/onnx2tf#parameter-replacement
ERROR: Alternatively, if the input OP has a dynamic dimension, use the -b or -ois option to rewrite it.
ERROR: If the input OP of ONNX before conversion is NHWC or an irregular channel arrangement, use -kt or -kat.
ERROR: Also, for models that include NonMaxSuppression in the post-processing, try the -onwdt option.
"""
FACTS = GraphFacts("x", {"add_three": "Add", "hs": "HardSwish", "g": "Conv", "mm": "MatMul", "nms": "NonMaxSuppression",
                         "rnn": "LSTM"}, frozenset({"g"}))


def _failure(error="RuntimeError: boom", node="", log="", stage="convert", facts=FACTS) -> Failure:
    return Failure(error, node, facts.op_of.get(node, ""), stage, log)


def test_each_error_class_gets_the_option_onnx2tf_documents_for_it():
    plain = GraphFacts("x", {"add_three": "Add", "hs": "HardSwish", "g": "Conv", "mm": "MatMul", "rnn": "LSTM"},
                       frozenset({"g"}))
    cases = [
        (_failure(log=ADVICE, node="add_three", facts=plain), "-dsm", {"disable_strict_mode": True}),
        (_failure(node="hs", facts=plain), "-rtpo hardswish", {"replace_to_pseudo_operators": ["hardswish"]}),
        (_failure(node="g", facts=plain), "-dgc", {"disable_group_convolution": True}),
        (_failure(stage="export", facts=plain), "-dgc", {"disable_group_convolution": True}),
        (_failure(node="mm", facts=plain), "-ebu", {"enable_batchmatmul_unfold": True}),
        (_failure(node="rnn", facts=plain), "-eru", {"enable_rnn_unroll": True}),
        (_failure("ValueError: Dimensions must be equal, but are 3 and 224", facts=plain), "-kat x",
         {"keep_shape_absolutely_input_names": ["x"]}),
    ]
    for failure, label, options in cases:
        got_label, why, got_options = next_fallback(failure, plain, [])
        assert (got_label, got_options) == (label, options) and why
    # a shape error in a graph that computes shapes at run time: fold them first, then onnx2tf's -kat
    shaped = GraphFacts("x", {**plain.op_of, "shape": "Shape"}, plain.grouped)
    mismatch = _failure("ValueError: Dimensions must be equal, but are 4800 and 120", facts=shaped)
    assert next_fallback(mismatch, shaped, [])[::2] == ("onnxsim", {FOLD_SHAPES: True})
    assert next_fallback(mismatch, shaped, ["onnxsim"])[0] == "-kat x"
    assert next_fallback(_failure("RuntimeError: boom", facts=shaped), shaped, []) is None
    # onnx2tf's -onwdt advice is printed after every error; it is followed only for a model with NMS
    assert next_fallback(_failure(), FACTS, [])[0] == "-onwdt"
    assert next_fallback(_failure(), plain, []) is None
    assert next_fallback(_failure(stage="export", facts=plain), GraphFacts("x", {}, frozenset()), []) is None


def test_a_fallback_is_tried_once_and_options_add_up():
    failure = _failure(log=ADVICE, node="hs")
    assert next_fallback(failure, FACTS, [])[0] == "-dsm"
    assert next_fallback(failure, FACTS, ["-dsm"])[0] == "-onwdt"
    assert next_fallback(failure, FACTS, ["-dsm", "-onwdt"])[0] == "-rtpo hardswish"
    assert next_fallback(failure, FACTS, ["-dsm", "-onwdt", "-rtpo hardswish"]) is None
    # another pseudo-op at the next failure is a new try, and the list grows
    assert next_fallback(_failure(node="x_abs", facts=GraphFacts("x", {"x_abs": "Abs"}, frozenset())),
                         GraphFacts("x", {"x_abs": "Abs"}, frozenset()), ["-rtpo hardswish"])[0] == "-rtpo abs"
    flags = merged(merged({}, {"replace_to_pseudo_operators": ["hardswish"]}), {"replace_to_pseudo_operators": ["abs"]})
    assert merged(flags, {"disable_strict_mode": True}) == {"replace_to_pseudo_operators": ["abs", "hardswish"],
                                                           "disable_strict_mode": True}


def test_the_log_is_read_past_onnx2tfs_generic_advice(tmp_path):
    assert last_error(ADVICE) == ""  # every ERROR: line there is the advice printed after any error
    col2im = "Col2Im does not support complex types"
    assert last_error(ADVICE + f"ERROR: {col2im}\n") == col2im
    assert stopped_at("\x1b[31mERROR:\x1b[0m onnx_op_name: /model.0/Add_1\n") == "/model.0/Add_1"
    (tmp_path / "result.json").write_text(json.dumps({"ok": False, "error": "onnx2tf stopped (exit 1)"}))
    failure = read_failure(tmp_path, ADVICE, FACTS)
    assert failure.error.startswith("ValueError: Output tensors of a Functional model")
    assert (failure.node, failure.op_type, failure.stage, failure.converted) == ("add_three", "Add", "convert", False)


def hardswish_block(path: Path) -> Path:
    """PP-OCRv4 det's first block as PaddlePaddle exports it: Conv, depthwise Conv, a scale and a
    shift as Constant nodes, then HardSwish written out (+ 3.0, Clip 0..6, Mul, / 6)."""
    rng = np.random.default_rng(0)

    def const(name, value):
        return helper.make_node("Constant", [], [name], name=f"{name}_c",
                                value=numpy_helper.from_array(np.asarray(value, np.float32)))

    inits = [numpy_helper.from_array(rng.normal(0, .3, (16, 3, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.normal(0, .3, (16, 1, 3, 3)).astype(np.float32), "wd"),
             numpy_helper.from_array(rng.normal(0, .1, (16,)).astype(np.float32), "bd")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["c0", "wd", "bd"], ["dw"], name="dw", pads=[1, 1, 1, 1], group=16),
             const("k", [0.94]), helper.make_node("Mul", ["k", "dw"], ["m"], name="mul_k"),
             const("b", [0.5]), helper.make_node("Add", ["m", "b"], ["a"], name="add_b"),
             const("three", 3.0), helper.make_node("Add", ["a", "three"], ["a3"], name="add_three"),
             const("zero", 0.0), const("six", 6.0),
             helper.make_node("Clip", ["a3", "zero", "six"], ["cl"], name="clip"),
             helper.make_node("Mul", ["a", "cl"], ["hm"], name="hs_mul"),
             helper.make_node("Div", ["hm", "six"], ["y"], name="hs_div")]
    graph = helper.make_graph(nodes, "ppocr_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    onnx.save(onnx.shape_inference.infer_shapes(model), str(path))
    return path


def flatten_layernorm_block(path: Path, channels: int = 12, width: int = 40) -> Path:
    """PP-OCRv4 rec's neck in small: a Conv to [1, C, 1, W], flattened by a Reshape whose target is
    computed at run time (Shape, Slice, Concat with -1), transposed to [1, W, C] and layer-normalised
    with ops written out. onnx2tf reads the flatten as [1, 1, C*W] and fails at the LayerNorm's scale."""
    rng = np.random.default_rng(0)

    def init(name, value, dtype=np.float32):
        return numpy_helper.from_array(np.asarray(value, dtype), name)

    inits = [init("w0", rng.normal(0, .3, (channels, 3, 8, 1))), init("g", rng.normal(1, .1, (channels,))),
             init("beta", rng.normal(0, .1, (channels,))), init("s0", [0], np.int64), init("s2", [2], np.int64),
             init("minus1", [-1], np.int64), init("two", 2.0), init("eps", 1e-5)]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w0"], ["f"], name="conv"), node("Shape", ["f"], ["shape"], name="shape"),
             node("Slice", ["shape", "s0", "s2"], ["nc"], name="slice"),
             node("Concat", ["nc", "minus1"], ["target"], name="concat", axis=0),
             node("Reshape", ["f", "target"], ["flat"], name="flatten"),
             node("Transpose", ["flat"], ["t"], name="transpose", perm=[0, 2, 1]),
             node("ReduceMean", ["t"], ["mean"], name="mean", axes=[-1]), node("Sub", ["t", "mean"], ["d"], name="sub"),
             node("Pow", ["d", "two"], ["d2"], name="pow"), node("ReduceMean", ["d2"], ["var"], name="var", axes=[-1]),
             node("Add", ["var", "eps"], ["ve"], name="add_eps"), node("Sqrt", ["ve"], ["sd"], name="sqrt"),
             node("Div", ["d", "sd"], ["norm"], name="div"), node("Mul", ["norm", "g"], ["scaled"], name="ln_scale"),
             node("Add", ["scaled", "beta"], ["y"], name="ln_shift")]
    graph = helper.make_graph(nodes, "flatten_layernorm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width, channels])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.save(model, str(path))
    return path


def _samples(n=4, size=32):
    return np.random.default_rng(1).random((n, size, size, 3), dtype=np.float32)


def test_a_conversion_that_fails_every_fallback_keeps_its_log_and_says_what_was_tried(tmp_path, monkeypatch):
    """The child is replaced by one that fails as onnx2tf did on PP-OCRv4 det (strict mode), then
    at a HardSwish: -dsm, then -rtpo hardswish are tried, then the error names the kept log."""
    from edgekit.builders.convert import onnx_to_tf
    from edgekit.builders.sources.onnx import load_onnx

    calls = []

    def fake_job(job_dir, source, timeout):
        calls.append(json.loads((job_dir / "job.json").read_text())["flags"])
        error, log = ("ValueError: Output tensors of a Functional model must be the output of a TensorFlow `Layer`. "
                      "Found: 3.0", ADVICE) if len(calls) == 1 else \
            ("ValueError: HardSwish is not what it seems", "ERROR: onnx_op_name: hs_div\n")
        (job_dir / "result.json").write_text(json.dumps({"ok": False, "error": error}))
        return subprocess.CompletedProcess([], 3, stdout=f"attempt {len(calls)}\n{log}", stderr="")

    monkeypatch.setattr(onnx_to_tf, "_run_job", fake_job)
    monkeypatch.setattr(onnx_to_tf, "graph_facts", lambda b, name: GraphFacts(name, {"add_three": "Add",
                                                                                     "hs_div": "HardSwish"},
                                                                              frozenset()))
    source = load_onnx(hardswish_block(tmp_path / "block.onnx"))
    kept = tmp_path / "out" / "block-onnx2tf.failed.log"
    log = BuildLog(quiet=True)
    with pytest.raises(ModelError) as info:
        onnx_to_tf.onnx_to_saved_model(source, _samples(), tmp_path / "work", log, kept)
    assert calls == [{}, {"disable_strict_mode": True},
                     {"disable_strict_mode": True, "replace_to_pseudo_operators": ["hardswish"]}]
    message = info.value.message
    assert message.startswith("onnx2tf could not convert block.onnx: ")
    assert "(at node 'hs_div', HardSwish)" in message
    assert "; tried onnx2tf's fallbacks -dsm, -rtpo hardswish (the first attempt: " in message
    assert info.value.hint == f"onnx2tf's full log: {kept}; or build this model for jetson"
    text = kept.read_text()
    assert [line for line in text.splitlines() if line.startswith("== onnx2tf attempt")] == [
        "== onnx2tf attempt 1 on block.onnx, options: edgekit defaults ==",
        "== onnx2tf attempt 2 on block.onnx, options: -dsm ==",
        "== onnx2tf attempt 3 on block.onnx, options: -dsm, -rtpo hardswish =="]
    assert not list(kept.parent.glob(".*.tmp"))
    assert any("trying again with its -dsm option" in line for line in log.lines)
    # the next TFLite target of the same build gets the same error at once, without converting again
    with pytest.raises(ModelError) as again:
        onnx_to_tf.onnx_to_saved_model(source, _samples(), tmp_path / "work", log, kept)
    assert (again.value.message, again.value.hint, len(calls)) == (message, info.value.hint, 3)


def test_an_error_no_fallback_answers_says_so(tmp_path, monkeypatch):
    from edgekit.builders.convert import onnx_to_tf
    from edgekit.builders.sources.onnx import load_onnx

    def fake_job(job_dir, source, timeout):
        (job_dir / "result.json").write_text(json.dumps({"ok": False, "error": "KeyError: 'thing'"}))
        return subprocess.CompletedProcess([], 3, stdout="ERROR: onnx_op_name: conv0\n", stderr="")

    monkeypatch.setattr(onnx_to_tf, "_run_job", fake_job)
    source = load_onnx(hardswish_block(tmp_path / "block.onnx"))
    with pytest.raises(ModelError) as info:
        onnx_to_tf.onnx_to_saved_model(source, _samples(), tmp_path / "work", BuildLog(quiet=True), None)
    assert info.value.message == ("onnx2tf could not convert block.onnx: KeyError: 'thing' (at node 'conv0', Conv); "
                                  "none of onnx2tf's fallbacks answers this error (-dsm, -onwdt, -rtpo, onnxsim, -dgc, "
                                  "-ebu, -eru, -kat)")
    assert info.value.hint == "or build this model for jetson"


@pytest.mark.slow
def test_ppocr_hardswish_block_converts_with_dsm_and_matches_onnx_runtime(tmp_path):
    """Real onnx2tf: the block fails in strict mode ("Output tensors of a Functional model must be
    the output of a TensorFlow `Layer` ... Found: 3.0"), converts with -dsm, and the SavedModel
    computes what ONNX Runtime does; a stale failure log from an earlier build is removed."""
    import onnxruntime as ort
    import tensorflow as tf

    from edgekit.builders.convert.onnx_to_tf import onnx_to_saved_model
    from edgekit.builders.sources.onnx import load_onnx

    path = hardswish_block(tmp_path / "block.onnx")
    source = load_onnx(path)
    stale = tmp_path / "out" / "block-onnx2tf.failed.log"
    stale.parent.mkdir()
    stale.write_text("from an earlier build")
    log = BuildLog(quiet=True)
    saved, result = onnx_to_saved_model(source, _samples(), tmp_path / "work", log, stale)
    assert result["ok"] and result["input_shape"] == [1, 32, 32, 3]
    lines = "\n".join(log.lines)
    assert "onnx2tf failed (ValueError: Output tensors of a Functional model must be the output" in lines
    assert "; trying again with its -dsm option (the error came from its strict-mode accuracy correction" in lines
    assert "onnx2tf converted block.onnx with its -dsm option(s)" in lines
    assert not stale.exists()
    x = _samples(1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x.transpose(0, 3, 1, 2)})[0]
    got = next(iter(tf.saved_model.load(str(saved)).signatures["serving_default"](image=tf.constant(x)).values()))
    np.testing.assert_allclose(got.numpy(), want.transpose(0, 2, 3, 1), atol=1e-5)


def test_a_job_that_dies_without_a_result_is_a_crash_not_the_last_attempts_error(tmp_path, monkeypatch):
    """onnxsim's native simplifier killed the job (SIGSEGV) before it wrote result.json; the previous
    attempt's file was read instead and its error shown twice, as if the fallback had run."""
    from edgekit.builders.convert import onnx_to_tf
    from edgekit.builders.sources.onnx import load_onnx

    def fake_job(job_dir, source, timeout):
        if not json.loads((job_dir / "job.json").read_text())["flags"]:
            (job_dir / "result.json").write_text(json.dumps(
                {"ok": False, "error": "ValueError: Dimensions must be equal, but are 480 and 12"}))
            return subprocess.CompletedProcess([], 3, stdout="", stderr="")
        return subprocess.CompletedProcess([], -11, stdout="", stderr="")

    monkeypatch.setattr(onnx_to_tf, "_run_job", fake_job)
    source = load_onnx(flatten_layernorm_block(tmp_path / "neck.onnx"))
    with pytest.raises(ModelError) as info:
        onnx_to_tf.onnx_to_saved_model(source, _samples(size=8)[:, :, :1].repeat(40, 2), tmp_path / "work",
                                       BuildLog(quiet=True), None)
    assert "the converter crashed (exit -11)" in info.value.message
    assert "tried onnx2tf's fallbacks onnxsim" in info.value.message


@pytest.mark.slow
def test_a_run_time_flatten_converts_once_onnxsim_folds_it_and_matches_onnx_runtime(tmp_path):
    """Real onnx2tf and onnxsim: the block fails on its LayerNorm's scale ("Dimensions must be equal,
    but are 480 and 12"), converts once onnxsim has folded the Shape-Slice-Concat target into a
    constant, and the SavedModel computes what ONNX Runtime does on the original graph."""
    import onnxruntime as ort
    import tensorflow as tf

    from edgekit.builders.convert.onnx_to_tf import onnx_to_saved_model
    from edgekit.builders.sources.onnx import load_onnx

    path = flatten_layernorm_block(tmp_path / "neck.onnx")
    samples = np.random.default_rng(1).random((4, 8, 40, 3), dtype=np.float32)
    log = BuildLog(quiet=True)
    saved, result = onnx_to_saved_model(load_onnx(path), samples, tmp_path / "work", log, None)
    lines = "\n".join(log.lines)
    assert "Dimensions must be equal" in lines and "trying again with its onnxsim option" in lines
    assert "onnx2tf converted neck.onnx with its onnxsim option(s)" in lines
    assert result["input_shape"] == [1, 8, 40, 3]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": samples[:1].transpose(0, 3, 1, 2)})[0]
    got = next(iter(tf.saved_model.load(str(saved)).signatures["serving_default"](image=tf.constant(samples[:1]))
                    .values()))
    np.testing.assert_allclose(got.numpy(), want, atol=1e-4)


REAL_PPOCR_DET_WHY = "the real PP-OCRv4 det is not under $EDGEKIT_REAL_MODELS (unpack rapidocr-onnxruntime 1.4.4 there)"
REAL_PPOCR_DET = real_model_file("ch_PP-OCRv4_det_infer.onnx")  # set EDGEKIT_REAL_MODELS (tests/conftest.py)


@pytest.mark.slow
@pytest.mark.skipif(REAL_PPOCR_DET is None, reason=REAL_PPOCR_DET_WHY)
def test_real_ppocr_v4_det_converts_through_the_dsm_fallback(tmp_path):
    from edgekit.builders.convert.onnx_to_tf import onnx_to_saved_model
    from edgekit.builders.sources.onnx import load_onnx

    log = BuildLog(quiet=True)
    _, result = onnx_to_saved_model(load_onnx(REAL_PPOCR_DET, (640, 640)), _samples(2, 640), tmp_path, log, None)
    assert result["input_shape"] == [1, 640, 640, 3]
    assert any("converted ch_PP-OCRv4_det_infer.onnx with its -dsm option(s)" in line for line in log.lines)


REAL_PPOCR_REC = real_model_file("ch_PP-OCRv4_rec_infer.onnx")


@pytest.mark.slow
@pytest.mark.skipif(REAL_PPOCR_REC is None, reason=REAL_PPOCR_DET_WHY.replace(" det ", " rec "))
def test_real_ppocr_v4_rec_converts_through_the_onnxsim_fallback(tmp_path):
    from edgekit.builders.convert.onnx_to_tf import onnx_to_saved_model
    from edgekit.builders.sources.onnx import load_onnx

    log = BuildLog(quiet=True)
    samples = np.random.default_rng(1).random((2, 48, 320, 3), dtype=np.float32)
    _, result = onnx_to_saved_model(load_onnx(REAL_PPOCR_REC, (48, 320)), samples, tmp_path, log, None)
    assert result["input_shape"] == [1, 48, 320, 3]
    assert any("converted ch_PP-OCRv4_rec_infer.onnx with its onnxsim option(s)" in line for line in log.lines)
