"""Decode model outputs: the task heads table, dequantisation, softmax, top-k with labels.

What a model's outputs mean is its *task head*. :data:`TASK_HEADS` maps a task name to the
dotted path of a decoder factory and the options it accepts (fsspec style: resolved on
first use, so a head's dependencies load only when a model needs it), and
:func:`make_decoder` builds one, refusing options the head does not take. The pipeline picks
its decoder from this table, never by ``if task == ...``. Today: ``classify`` (top-k
classes of a class-score output) and ``raw`` (every output's shape and summary statistics,
the tensors themselves only when asked: no top-k for a model that is not a classifier).

Results are small frozen types (as pycoral's ``classify.get_classes`` returns tiny
immutable ``Class`` tuples), cheap to pass to a daemon, a robot or a JSON line. Every
result has ``to_dict()``, the JSON form the pipeline, ``edgekit run --json`` and the daemon
write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edgekit.errors import UsageError
from edgekit.util.plugins import resolve


@dataclass(frozen=True)
class Prediction:
    """One class: its index in the output vector, its label and its score (a probability
    when the output was a probability distribution or softmax was applied)."""

    index: int
    label: str
    score: float


@dataclass(frozen=True)
class Classification:
    """The top-k classes of one output, best first.

    ``softmax_applied`` says whether edgekit applied a softmax (the model emitted logits);
    then ``energy`` is the logits' free energy ``-logsumexp(z)`` (low for what the model knows;
    the sign demo's open-set gate compares it with the bundle's ``max_energy``), else None.
    """

    predictions: tuple[Prediction, ...]
    softmax_applied: bool = False
    energy: float | None = None

    @property
    def top(self) -> Prediction:
        return self.predictions[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "top": [{"index": p.index, "label": p.label, "score": round(p.score, 6)} for p in self.predictions],
            "softmax_applied": self.softmax_applied,
            **({} if self.energy is None else {"energy": round(self.energy, 6)}),
        }

    def __str__(self) -> str:
        return "  ".join(f"{p.label} {p.score:.3f}" for p in self.predictions)


def dequantize(values: np.ndarray, scale: float | None, zero_point: int | None) -> np.ndarray:
    """Real values of a quantised tensor: ``(q - zero_point) * scale`` as float32.

    The tensor is cast to int32 *before* subtracting: in uint8 arithmetic ``3 - 128``
    wraps around to 131 and silently corrupts every score below the zero point.
    A tensor without quantisation (scale None or 0) is only cast to float32.
    """
    if not scale:
        return np.asarray(values, dtype=np.float32)
    q = np.asarray(values).astype(np.int32) - int(zero_point or 0)
    return q.astype(np.float32) * np.float32(scale)


def softmax(logits: np.ndarray, axis: int = -1, work: type = np.float64) -> np.ndarray:
    """Numerically stable softmax along ``axis``, returned as float32.

    Computed in ``work`` precision: float64 by default, so that a float16 output (an fp16 ONNX
    model) is not exponentiated in float16; a detector's thousands of boxes pass float32, which
    is exact enough once the maximum is subtracted and 4x faster there (8400x80: 9 ms, not 40).
    """
    z = np.asarray(logits, dtype=work)
    z = np.exp(z - z.max(axis=axis, keepdims=True))
    return (z / z.sum(axis=axis, keepdims=True)).astype(np.float32, copy=False)


def looks_like_probabilities(scores: np.ndarray, tolerance: float = 0.05) -> bool:
    """True when scores are in [0, 1] and sum to 1 within ``tolerance``.

    The tolerance absorbs the rounding of a quantised softmax output (uint8 steps of 1/256
    do not sum to exactly 1).
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0 or s.min() < -1e-6 or s.max() > 1 + tolerance:
        return False
    return bool(abs(s.sum() - 1.0) <= tolerance)


def label_for(index: int, labels: Sequence[str]) -> str:
    """The label of a class index, or the index as text when there is no such label."""
    return labels[index] if 0 <= index < len(labels) else str(index)


def top_k(scores: np.ndarray, k: int = 5, labels: Sequence[str] = ()) -> tuple[Prediction, ...]:
    """The ``k`` highest scores, best first; ties keep the lower index first."""
    s = np.asarray(scores).reshape(-1)
    k = max(1, min(int(k), s.size))
    # A stable sort on the negated scores keeps ties in index order (argpartition would not).
    order = np.argsort(-s, kind="stable")[:k]
    return tuple(Prediction(int(i), label_for(int(i), labels), float(s[i])) for i in order)


class Decoder:
    """Turns a runtime's raw outputs into a :class:`Classification`.

    Args:
        labels: class names in output order (``labels.txt``).
        k: how many classes to keep.
        quantization: ``(scale, zero_point)`` of the output tensor, or None for a float output.
        output_index: which output holds the class scores.
        softmax: ``"auto"`` (apply only when the scores are not already probabilities),
            ``"always"`` or ``"never"``.
    """

    def __init__(
        self,
        labels: Sequence[str] = (),
        k: int = 5,
        quantization: tuple[float, int] | None = None,
        output_index: int = 0,
        softmax: str = "auto",
    ):
        if softmax not in ("auto", "always", "never"):
            raise ValueError(f"softmax must be auto, always or never, not {softmax!r}")
        self.labels = list(labels)
        self.k = k
        self.quantization = quantization
        self.output_index = output_index
        self.softmax = softmax

    def scores(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, bool]:
        """Dequantised class scores of the first batch item, and whether softmax was applied."""
        values = self._values(outputs)
        if self._applies_softmax(values):
            return softmax(values), True
        return values, False

    def _values(self, outputs: Sequence[np.ndarray]) -> np.ndarray:
        if self.output_index >= len(outputs):
            raise UsageError(f"classify output_index {self.output_index}, but the model has {len(outputs)} "
                             "output(s)", "edgekit inspect MODEL lists the outputs")
        raw = np.asarray(outputs[self.output_index])
        raw = raw[0] if raw.ndim > 1 else raw
        scale, zero_point = self.quantization or (None, None)
        return dequantize(raw.reshape(-1), scale, zero_point)

    def _applies_softmax(self, values: np.ndarray) -> bool:
        return self.softmax == "always" or (self.softmax == "auto" and not looks_like_probabilities(values))

    def __call__(self, outputs: Sequence[np.ndarray]) -> Classification:
        values = self._values(outputs)
        if not self._applies_softmax(values):
            return Classification(top_k(values, self.k, self.labels), False)
        return Classification(top_k(softmax(values), self.k, self.labels), True, free_energy(values))


def free_energy(logits: np.ndarray) -> float:
    """``-logsumexp(z)`` of one logit vector (Liu et al. 2020): low for inputs the model knows."""
    from edgekit.openset import energy

    return float(energy(np.asarray(logits).reshape(1, -1))[0])


def output_quantization(runtime: Any, index: int = 0) -> tuple[float, int] | None:
    """``(scale, zero_point)`` of a runtime's output ``index``, or None for a float output.

    Uses the adapter's ``output_quantization`` list when it has one (LiteRT does); other
    runtimes (ONNX Runtime, fakes) produce float outputs.
    """
    quant = getattr(runtime, "output_quantization", None)
    if not quant or index >= len(quant):
        return None
    return quant[index]


# ---------------------------------------------------------------------------------------------
# Task heads: name -> decoder factory, chosen by table


class TaskResult(Protocol):
    """What a decoder returns for one frame: anything with a JSON form."""

    def to_dict(self) -> dict[str, Any]: ...


OutputDecoder = Callable[[Sequence[np.ndarray]], TaskResult]
"""A decoder: a runtime's outputs (one array per model output) -> a :class:`TaskResult`."""


@dataclass(frozen=True)
class TaskHead:
    """One row of :data:`TASK_HEADS`.

    ``factory`` is ``"package.module:callable"``, called as
    ``factory(labels, runtime, **options)`` and returning an :data:`OutputDecoder`;
    ``options`` are the keyword options it accepts; ``install_hint`` is shown when its
    module cannot be imported.
    """

    factory: str
    options: tuple[str, ...]
    summary: str
    install_hint: str | None = None


DEFAULT_TASK = "classify"

TASK_HEADS: dict[str, TaskHead] = {
    "classify": TaskHead(
        "edgekit.results:classifier",
        ("k", "top_k", "softmax", "output_index"),
        "top-k classes with labels (softmax auto|always|never)",
    ),
    "raw": TaskHead(
        "edgekit.results:raw",
        ("names", "tensors"),
        "every output's name, shape, dtype and min/max/mean/std (tensors=True: the values too)",
    ),
    "detect": TaskHead(
        "edgekit.detect.head:detector",
        ("layout", "score_threshold", "iou_threshold", "max_detections", "max_candidates", "class_agnostic",
         "box_format", "box_units", "anchors", "ssd_anchors", "box_coder_scales", "background_class", "outputs",
         "score_activation", "ssd_decode"),
        "boxes, labels and scores after class-aware NMS, in source-frame pixels "
        "(YOLO, SSD with anchors, or NMS in the graph)",
        "pip install opencv-python-headless (NMS)",
    ),
}
"""Task name -> :class:`TaskHead`. Add a task by adding a row and a factory module."""


def default_task(output_shapes: Sequence[Sequence[Any]]) -> str:
    """The task of a model that does not say: ``classify`` for one output holding one vector
    per image (``[1, N]`` or ``[N]``), ``raw`` for anything else."""
    if len(output_shapes) != 1:
        return "raw"
    dims = list(output_shapes[0])
    batch = len(dims) == 2 and (not isinstance(dims[0], int) or dims[0] in (1, -1))  # symbolic or 1
    return "classify" if len(dims) == 1 or batch else "raw"


def make_decoder(
    task: str = DEFAULT_TASK, labels: Sequence[str] = (), runtime: Any = None, **options: Any
) -> OutputDecoder:
    """Build the decoder of ``task`` from :data:`TASK_HEADS` for a model's outputs.

    Args:
        task: a key of :data:`TASK_HEADS`.
        labels: class names in output order.
        runtime: the open runtime (its output quantisation is read), or None for float outputs.
        options: the head's options, e.g. ``k=3, softmax="never"`` for ``classify``.

    Raises UsageError naming an unknown task or an option the head does not accept (a typo
    must not silently do nothing), BackendUnavailable when the head's module cannot load.
    """
    head = TASK_HEADS.get(task)
    if head is None:
        raise UsageError(f"unknown task {task!r}", f"known tasks: {', '.join(TASK_HEADS)}")
    unknown = sorted(set(options) - set(head.options))
    if unknown:
        raise UsageError(
            f"task {task!r} has no option {unknown[0]!r}", f"{task} accepts: {', '.join(head.options)}"
        )
    factory = resolve(head.factory, head.install_hint)
    return factory(labels, runtime, **options)


def classifier(
    labels: Sequence[str] = (),
    runtime: Any = None,
    k: int | None = None,
    top_k: int | None = None,
    softmax: str = "auto",
    output_index: int = 0,
) -> Decoder:
    """The ``classify`` head: a :class:`Decoder` for ``runtime``'s output ``output_index``.

    ``top_k`` is another name for ``k`` (default 5); giving both with different values is
    an error rather than a silent choice.
    """
    if k is not None and top_k is not None and k != top_k:
        raise UsageError(f"classify got k={k} and top_k={top_k}", "give one of them")
    count = k if k is not None else top_k if top_k is not None else 5
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"classify k must be a whole number of at least 1, not {count!r}", "e.g. -T k=5")
    if softmax not in ("auto", "always", "never"):
        raise UsageError(f"classify softmax must be auto, always or never, not {softmax!r}", "e.g. -T softmax=auto")
    outputs = len(getattr(runtime, "output_quantization", None) or []) or None  # known for LiteRT and ONNX Runtime
    if isinstance(output_index, bool) or not isinstance(output_index, int) or output_index < 0 \
            or (outputs is not None and output_index >= outputs):
        raise UsageError(f"classify output_index must be a whole number from 0 to the model's outputs - 1"
                         f"{f' ({outputs - 1})' if outputs else ''}, not {output_index!r}",
                         "edgekit inspect MODEL lists the outputs")
    quantization = output_quantization(runtime, output_index) if runtime is not None else None
    return Decoder(labels, count, quantization, output_index, softmax)


# ---------------------------------------------------------------------------------------------
# The raw head: any model, every output, no interpretation


@dataclass(frozen=True)
class OutputSummary:
    """One output of one frame: its name, shape and dtype (as the model gives it) and summary
    statistics of its real (dequantised) values; ``values`` only when asked for."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    min: float
    max: float
    mean: float
    std: float
    values: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                             "min": round(self.min, 6), "max": round(self.max, 6),
                             "mean": round(self.mean, 6), "std": round(self.std, 6)}
        if self.values is not None:
            d["values"] = np.round(self.values.astype(np.float64), 6).tolist()
        return d


@dataclass(frozen=True)
class RawResult:
    """Every output of one frame, in the model's output order (the ``raw`` head's result)."""

    outputs: tuple[OutputSummary, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"outputs": [o.to_dict() for o in self.outputs]}

    def __str__(self) -> str:
        return "  ".join(f"{o.name} {'x'.join(map(str, o.shape))} mean {o.mean:.3g} [{o.min:.3g}, {o.max:.3g}]"
                         for o in self.outputs)


class RawDecoder:
    """Summarise every output (dequantised with its own scale/zero point).

    Args:
        names: output names in the runtime's output order (a bundle's manifest names them).
        quantization: per output ``(scale, zero_point)`` or None for a float output.
        tensors: keep each output's values in the result (large; for ``--json`` consumers).
    """

    def __init__(self, names: Sequence[str] = (), quantization: Sequence[Any] = (), tensors: bool = False):
        self.names = list(names)
        self.quantization = list(quantization)
        self.tensors = tensors

    def __call__(self, outputs: Sequence[np.ndarray]) -> RawResult:
        summaries = []
        for i, raw_out in enumerate(outputs):
            arr = np.asarray(raw_out)
            scale, zero_point = (self.quantization[i] if i < len(self.quantization) else None) or (None, None)
            real = dequantize(arr, scale, zero_point)
            name = self.names[i] if i < len(self.names) else f"output_{i}"
            summaries.append(OutputSummary(
                name, tuple(int(d) for d in arr.shape), arr.dtype.name,
                float(real.min()) if real.size else 0.0, float(real.max()) if real.size else 0.0,
                float(real.mean()) if real.size else 0.0, float(real.std()) if real.size else 0.0,
                real if self.tensors else None,
            ))
        return RawResult(tuple(summaries))


def raw(labels: Sequence[str] = (), runtime: Any = None, names: Sequence[str] | None = None,
        tensors: bool = False) -> RawDecoder:
    """The ``raw`` head: a :class:`RawDecoder` for every output of ``runtime``.

    ``names`` default to what the runtime reports (``output_details()``), else ``output_N``.
    ``labels`` are not used: a raw result names outputs, never classes.
    """
    if not isinstance(tensors, bool):
        raise UsageError(f"raw tensors must be true or false, not {tensors!r}")
    if names is None:
        details = getattr(runtime, "output_details", None)
        names = [d.get("name", f"output_{i}") for i, d in enumerate(details())] if callable(details) else []
    count = len(getattr(runtime, "output_quantization", None) or names)
    quant = [output_quantization(runtime, i) for i in range(count)] if runtime is not None else []
    return RawDecoder(list(names), quant, tensors)
