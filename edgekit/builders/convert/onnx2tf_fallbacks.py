"""onnx2tf's documented fallbacks, and which failure each answers (used by :mod:`edgekit.builders.convert.onnx_to_tf`).

onnx2tf prints the same advice after every error ("use the -b or -ois option", "-kt or -kat",
"try the -onwdt option"), options an edgekit user cannot pass. Here each option its README
documents for a class of failure is a row: the failure it answers (read from the exception,
the node onnx2tf stopped at and that node's op type) and the keyword it sets on
``onnx2tf.convert``. The parent tries them in table order, each once, keeping earlier ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class GraphFacts:
    """What the fallbacks need to know of the prepared ONNX graph."""

    input: str
    op_of: dict[str, str]  # node name -> op type
    grouped: frozenset[str]  # Conv/ConvTranspose nodes with group > 1 that are not depthwise


@dataclass(frozen=True)
class Failure:
    """What one failed onnx2tf attempt said."""

    error: str  # one line: "ValueError: Output tensors of a Functional model must be ..."
    node: str  # the node onnx2tf stopped at ('' when it named none)
    op_type: str  # that node's op type
    stage: str  # "convert" (onnx2tf) or "export" (the SavedModel written from its Keras model)
    log: str  # the attempt's whole output
    converted: bool = False  # onnx2tf succeeded; what failed was edgekit's check of its outputs


@dataclass(frozen=True)
class Fallback:
    """One documented onnx2tf option (its README's flag) and the failures it answers."""

    flag: str
    when: str
    applies: Callable[[Failure, GraphFacts], bool]
    options: Callable[[Failure, GraphFacts], dict]


#: ONNX op -> onnx2tf's name for its pseudo-op replacement (-rtpo; README: "Currently supported operators")
PSEUDO_OPS = {"Abs": "abs", "Acos": "acos", "Asin": "asin", "Atan": "atan", "Erf": "erf", "GatherND": "gathernd",
              "Gelu": "gelu", "HardSwish": "hardswish", "LeakyRelu": "leakyrelu", "Neg": "neg", "Pow": "power",
              "PRelu": "prelu", "MatMulInteger": "matmulinteger"}
# strict mode: onnx2tf runs ONNX Runtime on the sample data and rebuilds Keras models around
# elementwise ops to correct transposition errors; a constant operand (a PaddlePaddle export's
# Constant nodes: PP-OCRv4 det's HardSwish "+ 3.0") ends it with "Output tensors of a Functional
# model must be the output of a TensorFlow `Layer`"
_STRICT = ("correction_process_for_accuracy_errors", "acquisition_of_validation_data",
           "must be the output of a TensorFlow `Layer`")
_SHAPES = ("Dimensions must be equal", "Incompatible shapes", "are incompatible", "annot reshape",
           "could not broadcast", "Shape must be rank")

#: not an onnx2tf keyword: the job simplifies the graph with onnxsim before onnx2tf reads it. onnx2tf
#: runs the onnxsim command itself unless -nuo, but through PATH, on the input file in place, and
#: goes on unsimplified when it fails; edgekit passes -nuo and folds only when a conversion failed
#: on a run-time shape (PP-OCRv4's recogniser: a Shape-Slice-Concat-Reshape flatten before each
#: LayerNorm, read by onnx2tf as [1, 1, 4800] against the [120] scale)
FOLD_SHAPES = "fold_shapes_with_onnxsim"

#: tried in this order, each at most once, the options of earlier tries kept. Not here: -b/-ois
#: (edgekit already gives the input a static shape), -nuo (always on: see FOLD_SHAPES)
FALLBACKS = (
    Fallback("-dsm", "the error came from its strict-mode accuracy correction, which -dsm skips",
             lambda f, g: any(k in f.log for k in _STRICT), lambda f, g: {"disable_strict_mode": True}),
    Fallback("-onwdt", "the model has NonMaxSuppression; onnx2tf's own advice",
             lambda f, g: "NonMaxSuppression" in g.op_of.values(),
             lambda f, g: {"output_nms_with_dynamic_tensor": True}),
    Fallback("-rtpo", "it stopped at an op it can replace by a pseudo-op",
             lambda f, g: f.op_type in PSEUDO_OPS,
             lambda f, g: {"replace_to_pseudo_operators": [PSEUDO_OPS[f.op_type]]}),
    Fallback("onnxsim", "the graph computes shapes at run time (Shape ops); onnxsim folds them into constants, "
             "as onnx2tf does by default",
             lambda f, g: "Shape" in g.op_of.values() and any(k in f.error for k in _SHAPES),
             lambda f, g: {FOLD_SHAPES: True}),
    Fallback("-dgc", "a grouped convolution; -dgc writes it as separable convolutions for a SavedModel",
             lambda f, g: f.node in g.grouped or (f.stage == "export" and bool(g.grouped)),
             lambda f, g: {"disable_group_convolution": True}),
    Fallback("-ebu", "it stopped at a MatMul; -ebu unfolds BatchMatMul into plain MatMuls",
             lambda f, g: f.op_type in ("MatMul", "Gemm", "Einsum") or "BatchMatMul" in f.error,
             lambda f, g: {"enable_batchmatmul_unfold": True}),
    Fallback("-eru", "it stopped at a recurrent op; -eru unrolls it",
             lambda f, g: f.op_type in ("LSTM", "GRU", "RNN"), lambda f, g: {"enable_rnn_unroll": True}),
    Fallback("-kat", "a shape mismatch; onnx2tf's own advice for an input that is not plain NCHW",
             lambda f, g: any(k in f.error for k in _SHAPES),
             lambda f, g: {"keep_shape_absolutely_input_names": [g.input]}),
)


def graph_facts(onnx_bytes: bytes, input_name: str) -> GraphFacts:
    """Op types by node name, and the grouped (not depthwise) convolutions, of the prepared graph."""
    import onnx

    model = onnx.load_from_string(onnx_bytes)
    channels = {i.name: i.dims[1] for i in model.graph.initializer if len(i.dims) == 4}
    grouped = set()
    for node in model.graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        # depthwise (one input channel per group) converts as DepthwiseConv2D; the rest is GroupConv
        if node.op_type in ("Conv", "ConvTranspose") and group > 1 and channels.get(node.input[1], 0) != 1:
            grouped.add(node.name)
    return GraphFacts(input_name, {n.name: n.op_type for n in model.graph.node}, frozenset(grouped))


def read_failure(job_dir: Path, text: str, facts: GraphFacts) -> Failure:
    """Read one failed attempt: its exception line (the job's, else the last in the log), its node."""
    result_file = job_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    error = result.get("error") or ""
    if not error or error.startswith("onnx2tf stopped"):
        raised = re.findall(r"^(?:\w+\.)*\w*(?:Error|Exception): .*$", text, flags=re.M)
        error = raised[-1].strip() if raised else (last_error(text) or error)
    node = stopped_at(text)
    return Failure(error[:300], node, facts.op_of.get(node, ""), result.get("stage", "convert"), text,
                   converted=bool(result.get("ok")))


def next_fallback(failure: Failure, facts: GraphFacts, tried: list[str]) -> tuple[str, str, dict] | None:
    """The first fallback that answers ``failure`` and was not tried: (label, why, options)."""
    for fallback in FALLBACKS:
        if not fallback.applies(failure, facts):
            continue
        options = fallback.options(failure, facts)
        values = [v for v in options.values() if isinstance(v, list)]
        label = " ".join([fallback.flag, *(str(x) for v in values for x in v)])
        if label not in tried:
            return label, fallback.when, options
    return None


def merged(flags: dict, extra: dict) -> dict:
    """``flags`` with ``extra`` laid over; list options (-rtpo ops, -kat inputs) add up."""
    out = dict(flags)
    for key, value in extra.items():
        out[key] = sorted(set(out.get(key, [])) | set(value)) if isinstance(value, list) else value
    return out


#: onnx2tf's own advice, printed after every error whatever the error (utils/common_functions.py
#: print_wrapper_func): FALLBACKS act on it instead; an edgekit user cannot pass those options
_ADVICE = ("The trace log is below", "input_onnx_file_path:", "onnx_op_name:", "Read this and deal with it",
           "Alternatively, if the input OP", "If the input OP of ONNX", "Also, for models that include")


def last_error(text: str) -> str:
    """The last ``ERROR:`` line onnx2tf printed that is not its generic advice, shortened."""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    errors = [e for e in errors if e and not e.startswith(_ADVICE)]
    return errors[-1][:240] if errors else ""


def stopped_at(text: str) -> str:
    """The ONNX node onnx2tf was converting when it failed (its ``onnx_op_name:`` line), or ''."""
    found = re.findall(r"ERROR:\s*onnx_op_name:\s*(\S+)", _ANSI.sub("", text))
    return found[-1] if found else ""
