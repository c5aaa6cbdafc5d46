"""Offline Edge TPU compatibility check: which ops of a ``.tflite`` the Edge TPU can run.

Works without the compiler (which exists only for x86-64 Linux) and without TensorFlow:
the graph is read with :mod:`edgekit.tflite.graph` and every operator is checked against
the rules Coral publishes ("TensorFlow models on the Edge TPU", coral.ai/docs/edgetpu/
models-intro): fully int8/uint8 quantised tensors, static shapes, only the 3 innermost
dimensions > 1, an op from the supported-operations table, and that table's per-op
limits. The compiler maps one segment: it cuts the graph at the first op it cannot
map (in execution order) and everything from there on runs on the CPU.

This is a *prediction*; ``edgetpu_compiler`` has the last word (see
:mod:`edgekit.builders.edgetpu.compiler`). :data:`IMPLEMENTED_RULES` and
:data:`NOT_IMPLEMENTED_RULES` say exactly what is and is not modelled; the per-op rules
themselves are in :mod:`edgekit.tflite.edgetpu_ops`.

>>> report = check_model("model_int8.tflite")          # doctest: +SKIP
>>> report.op_share, report.cut, report.cache_status    # doctest: +SKIP
(1.0, None, 'fits')
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The per-op rules and Coral's op table live in edgetpu_ops; re-exported here because this
# module is the one callers (inspect, the compiler driver, tests) import the check from.
from edgekit.tflite.edgetpu_ops import QUANTISED_DTYPES as QUANTISED_DTYPES
from edgekit.tflite.edgetpu_ops import SUPPORTED_OPS as SUPPORTED_OPS
from edgekit.tflite.edgetpu_ops import op_problems
from edgekit.tflite.graph import Graph, OperatorInfo, read_graph

# The compiler's name and why it may be absent; shared by the build (builders/edgetpu/compiler.py) and
# `edgekit inspect`, which must not import the build side.
COMPILER = "edgetpu_compiler"
ABSENT_REASON = (
    "edgetpu_compiler not found (it runs only on x86-64 Linux and comes from Coral's apt repository, "
    "package edgetpu-compiler); the plain int8 model and the offline report are kept"
)

MIB = 1024 * 1024
# The Edge TPU has 8 MiB of SRAM; compiler reports show about 6.9-7.5 MiB of it offered
# for parameters ("used" + "remaining" in the compiler's summary), the rest holds
# instructions. Parameters that do not fit are streamed from the host on every inference.
CACHE_BYTES = 8 * MIB
CACHE_SAFE_BYTES = int(6.8 * MIB)

LATEST_RUNTIME = 14  # Edge TPU runtime of compiler 16, the last release
COMPILED_OP = "edgetpu-custom-op"  # what edgetpu_compiler puts in *_edgetpu.tflite

IMPLEMENTED_RULES: tuple[str, ...] = (
    "every activation tensor int8/uint8 with quantisation parameters; constants int8/uint8 (int32 for "
    "biases and shape operands): otherwise 'not int8/uint8 quantised'",
    "static shapes: a -1 in any activation tensor's shape_signature is 'dynamic shape'",
    "tensor rank: only the 3 innermost dimensions may be > 1 (so batch must be 1)",
    "op must be in Coral's supported-operations table, for the chosen minimum runtime version "
    "(custom ops are never supported)",
    "AVERAGE_POOL_2D, MAX_POOL_2D, CONCATENATION: no fused activation function",
    "CONCATENATION: a constant input only as one of exactly 2 inputs, and all zeroes",
    "CONV_2D, DEPTHWISE_CONV_2D: same dilation in x and y; DEPTHWISE_CONV_2D not dilated below runtime 13",
    "FULLY_CONNECTED: default weights format; output one-dimensional (keep_num_dims giving >1-D fails)",
    "MEAN: no batch reduction; runtime <= 12 x/y only; 13+ z-reduction needs z a multiple of 4",
    "SUM, REDUCE_MAX, REDUCE_MIN: no batch-dimension reduction",
    "PAD: no batch padding; runtime <= 12 x/y padding only",
    "PACK, SPLIT: not along the batch dimension",
    "PRELU: constant alpha",
    "SOFTMAX: 1-D input (leading 1s allowed) of at most 16,000 elements",
    "SQUEEZE (runtime <= 12): only leading 1s",
    "STRIDED_SLICE: all strides 1, ellipsis_mask == 0, new_axis_mask == 0",
    "RESIZE_BILINEAR/RESIZE_NEAREST_NEIGHBOR: 3-D input/output (rank rule); a size-dependent refusal is "
    "flagged as a note",
    "graph cut at the first unmapped op in execution order; every later op runs on the CPU",
    "more than one subgraph (control flow): warned, only the main subgraph is mapped",
    "parameter bytes of the TPU segment against the ~8 MiB on-chip cache (off-chip streaming warning)",
    "an already compiled *_edgetpu.tflite: ops inside edgetpu-custom-op count as on the TPU",
)

NOT_IMPLEMENTED_RULES: tuple[str, ...] = (
    "size thresholds at which the compiler refuses RESIZE_* ('to avoid loss in precision') or large "
    "RESHAPEs: unpublished, reported only as a note",
    "the compiler's 'unspecified limitation' and 'Operation version not supported' refusals (older "
    "compilers reject newer op versions); depend on the compiler build",
    "ops newer compilers map although Coral's table omits them (e.g. TRANSPOSE): predicted as unsupported",
    "activation/instruction memory limits ('large activation tensors' failures)",
    "partitioning details: independent branches after the cut that the compiler may still map, "
    "multiple subgraphs (-a) and segmentation (-n)",
    "exact cache layout: the compiler pads and re-lays-out parameters; co-compiled models share the cache",
    "int8 quantisation quality (per-tensor vs per-channel scales, saturation): checked by verification, not here",
)


@dataclass(frozen=True)
class OpVerdict:
    """The prediction for one operator (``index`` is its execution position)."""

    index: int
    opcode: str
    dtypes: str
    on_tpu: bool
    reason: str
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    parameter_bytes: int = 0


@dataclass(frozen=True)
class OpRow:
    """Ops aggregated like the compiler's Operator/Count/Status table."""

    opcode: str
    count: int
    dtypes: str
    on_tpu: bool
    reason: str


@dataclass(frozen=True)
class CompatReport:
    """Offline Edge TPU compatibility of one model. ``to_dict()`` is JSON-ready."""

    model: str
    runtime_version: int
    subgraphs: int
    compiled: bool
    ops: tuple[OpVerdict, ...]
    rows: tuple[OpRow, ...]
    cut: OpVerdict | None
    total_ops: int
    tpu_ops: int
    parameter_bytes: int
    tpu_parameter_bytes: int
    cache_status: str
    cache_message: str
    warnings: tuple[str, ...] = ()

    @property
    def cpu_ops(self) -> int:
        """Operators predicted to run on the CPU."""
        return self.total_ops - self.tpu_ops

    @property
    def op_share(self) -> float:
        """Share of operators predicted on the Edge TPU (0..1)."""
        return self.tpu_ops / self.total_ops if self.total_ops else 0.0

    @property
    def parameter_share(self) -> float:
        """Share of parameter bytes predicted on the Edge TPU (0..1)."""
        return self.tpu_parameter_bytes / self.parameter_bytes if self.parameter_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready dicts, with the derived shares and the cache size."""
        d = asdict(self)
        d.update(
            cpu_ops=self.cpu_ops,
            op_share=round(self.op_share, 4),
            parameter_share=round(self.parameter_share, 4),
            cache_bytes=CACHE_BYTES,
        )
        return d


def check_model(path: str | Path, runtime_version: int | None = None) -> CompatReport:
    """Predict which operators of a ``.tflite`` file run on the Edge TPU.

    Args:
        path: the model (full-integer int8 for any chance of mapping).
        runtime_version: the oldest Edge TPU runtime the model must run on (the compiler's
            ``--min_runtime_version``); None means the newest (14).

    Raises:
        ModelError: the file is not a readable ``.tflite``.
    """
    return check_graph(read_graph(path), runtime_version)


def check_graph(graph: Graph, runtime_version: int | None = None) -> CompatReport:
    """:func:`check_model` for an already parsed graph."""
    runtime = LATEST_RUNTIME if runtime_version is None else int(runtime_version)
    compiled = any(op.opcode == COMPILED_OP for op in graph.operators)
    verdicts, cut = _verdicts(graph, runtime, compiled)
    tpu_ops = sum(v.on_tpu for v in verdicts)
    # Each constant counted once even when several ops read it (shared weights).
    tpu_params = _params_of(graph, [op for op, v in zip(graph.operators, verdicts) if v.on_tpu])
    status, message = _cache(tpu_params, tpu_ops)
    warnings = _warnings(graph, verdicts, None if compiled else cut, tpu_ops)
    if status == "streams":
        warnings.append(message)
    return CompatReport(
        model=str(graph.path),
        runtime_version=runtime,
        subgraphs=graph.subgraph_count,
        compiled=compiled,
        ops=tuple(verdicts),
        rows=_rows(verdicts),
        cut=None if compiled else cut,
        total_ops=len(verdicts),
        tpu_ops=tpu_ops,
        parameter_bytes=graph.parameter_bytes,
        tpu_parameter_bytes=tpu_params,
        cache_status=status,
        cache_message=message,
        warnings=tuple(warnings),
    )


def _verdicts(graph: Graph, runtime: int, compiled: bool) -> tuple[list[OpVerdict], OpVerdict | None]:
    """One verdict per op in execution order, and the first unmapped op (the cut)."""
    verdicts: list[OpVerdict] = []
    cut: OpVerdict | None = None
    for op in graph.operators:
        dtypes = graph.dtype_label(op)
        params = graph.op_parameter_bytes(op)
        if compiled:
            on = op.opcode == COMPILED_OP
            reason = "compiled for the Edge TPU" if on else "left on the CPU by edgetpu_compiler"
            verdicts.append(OpVerdict(op.index, op.opcode, dtypes, on, reason, (), (), params))
            continue
        problems, notes = op_problems(graph, op, runtime)
        if cut is None and not problems:
            verdicts.append(OpVerdict(op.index, op.opcode, dtypes, True, "mapped", (), notes, params))
            continue
        after_cut = f"after the cut at op {cut.index} ({cut.opcode}): runs on the CPU" if cut else ""
        reason = problems[0] if problems else after_cut
        verdict = OpVerdict(op.index, op.opcode, dtypes, False, reason, tuple(problems), notes, params)
        if cut is None:
            cut = verdict
        verdicts.append(verdict)
    return verdicts, cut


def _warnings(graph: Graph, verdicts: list[OpVerdict], cut: OpVerdict | None, tpu_ops: int) -> list[str]:
    """Subgraph and cut warnings (``cut`` is None for a compiled model: nothing to predict)."""
    warnings = []
    if graph.subgraph_count > 1:
        warnings.append(
            f"{graph.subgraph_count} subgraphs: the Edge TPU maps only the main one "
            "(control flow such as WHILE/IF runs on the CPU)"
        )
    if cut is not None and tpu_ops:
        warnings.append(
            f"graph cut at op {cut.index} ({cut.opcode}: {cut.reason}); "
            f"{len(verdicts) - cut.index} of {len(verdicts)} ops run on the CPU"
        )
    if cut is not None and not tpu_ops:
        warnings.append(f"no op is predicted to run on the Edge TPU (op {cut.index} {cut.opcode}: {cut.reason})")
    return warnings


# ---------------------------------------------------------------------------------------
# Parameter cache and the aggregated table.


def _params_of(graph: Graph, ops: list[OperatorInfo]) -> int:
    used = {i for op in ops for i in op.inputs if i >= 0}
    return sum(graph.tensors[i].constant_bytes for i in used)


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.50 KiB"`` (binary units, like the compiler)."""
    for unit, size in (("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _cache(tpu_params: int, tpu_ops: int) -> tuple[str, str]:
    size = format_bytes(tpu_params)
    if tpu_ops == 0:
        return "none", "no op is predicted on the Edge TPU, so nothing uses its parameter cache"
    if tpu_params <= CACHE_SAFE_BYTES:
        return "fits", f"{size} of parameters fit the ~8 MiB on-chip cache"
    if tpu_params <= CACHE_BYTES:
        return "tight", (
            f"{size} of parameters: near the ~7 MiB the compiler offers of the 8 MiB on-chip memory; "
            "some may stream from the host (check the compiler's off-chip figure)"
        )
    return "streams", (
        f"{size} of parameters exceed the ~8 MiB on-chip cache: at least "
        f"{format_bytes(tpu_params - CACHE_BYTES)} stream from the host on every inference (slow); "
        "use a smaller head (e.g. global average pooling instead of Flatten->Dense)"
    )


def _rows(verdicts: list[OpVerdict]) -> tuple[OpRow, ...]:
    counts: dict[tuple, int] = {}
    for v in verdicts:
        key = (v.opcode, v.dtypes, v.on_tpu, v.reason)
        counts[key] = counts.get(key, 0) + 1
    return tuple(OpRow(op, n, dt, on, reason) for (op, dt, on, reason), n in counts.items())
