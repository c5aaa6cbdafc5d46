"""The ``classify`` task head: top-k classes with labels from a class-score output.

Results are small frozen types (as pycoral's ``classify.get_classes`` returns tiny immutable
``Class`` tuples), cheap to pass to a daemon, a robot or a JSON line; ``to_dict()`` is the JSON
form the pipeline, ``edgekit run --json`` and the daemon write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import UsageError
from edgekit.heads.options import check_head_options
from edgekit.heads.tensors import Prediction, dequantize, looks_like_probabilities, output_quantization, softmax, top_k
from edgekit.util.optionspec import Option, OptionValueError, defaults

SOFTMAX_MODES = ("auto", "always", "never")

OPTIONS = (
    Option("k", "int", None, "how many classes to keep, best first (default 5)", ge=1),
    Option("top_k", "int", None, "another name for k", ge=1),
    Option("softmax", "str", "auto", "auto (only when the scores are not probabilities), always or never",
           choices=SOFTMAX_MODES),
    Option("output_index", "int", 0, "which output holds the class scores", ge=0),
)
"""The ``classify`` head's options (its row in :data:`edgekit.heads.table.TASK_HEADS` lists these)."""
_DEFAULT = defaults(OPTIONS)
_INDEX = OPTIONS[3]
DEFAULT_K = 5


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
        k: int = DEFAULT_K,
        quantization: tuple[float, int] | None = None,
        output_index: int = _DEFAULT["output_index"],
        softmax: str = _DEFAULT["softmax"],
    ):
        if softmax not in SOFTMAX_MODES:
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
    from edgekit.heads.openset import energy

    return float(energy(np.asarray(logits).reshape(1, -1))[0])


def classifier(
    labels: Sequence[str] = (),
    runtime: Any = None,
    k: int | None = _DEFAULT["k"],
    top_k: int | None = _DEFAULT["top_k"],
    softmax: str = _DEFAULT["softmax"],
    output_index: int = _DEFAULT["output_index"],
) -> Decoder:
    """The ``classify`` head: a :class:`Decoder` for ``runtime``'s output ``output_index``.

    ``top_k`` is another name for ``k`` (default 5); giving both with different values is
    an error rather than a silent choice. Options are checked against :data:`OPTIONS`.
    """
    o = check_head_options("classify", OPTIONS, {"k": k, "top_k": top_k, "softmax": softmax,
                                                 "output_index": output_index},
                           skip=("output_index",), examples={"k": DEFAULT_K, "top_k": DEFAULT_K})
    k, top_k = o["k"], o["top_k"]
    if k is not None and top_k is not None and k != top_k:
        raise UsageError(f"classify got k={k} and top_k={top_k}", "give one of them")
    count = k if k is not None else top_k if top_k is not None else DEFAULT_K
    outputs = len(getattr(runtime, "output_quantization", None) or []) or None  # known for LiteRT and ONNX Runtime
    try:  # its upper bound is the model's: one message for both ends
        index = _INDEX.coerce(output_index, text=False)
    except OptionValueError:
        index = None
    if index is None or (outputs is not None and index >= outputs):
        raise UsageError(f"classify output_index must be a whole number from 0 to the model's outputs - 1"
                         f"{f' ({outputs - 1})' if outputs else ''}, not {output_index!r}",
                         "edgekit inspect MODEL lists the outputs")
    quantization = output_quantization(runtime, index) if runtime is not None else None
    return Decoder(labels, count, quantization, index, o["softmax"] or _DEFAULT["softmax"])
