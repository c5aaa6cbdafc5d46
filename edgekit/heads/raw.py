"""The ``raw`` task head: any model, every output, no interpretation.

Each output's name, shape, dtype and summary statistics of its real (dequantised) values; the
tensors themselves only when asked (no top-k for a model that is not a classifier).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.heads.options import check_head_options
from edgekit.heads.tensors import dequantize, output_quantization
from edgekit.util.optionspec import Option, defaults

OPTIONS = (
    Option("names", "strs", None, "output names in the runtime's order (default: what the runtime reports)"),
    Option("tensors", "bool", False, "keep each output's values in the result (large)"),
)
"""The ``raw`` head's options (its row in :data:`edgekit.heads.table.TASK_HEADS` lists these)."""
_DEFAULT = defaults(OPTIONS)


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


def raw(labels: Sequence[str] = (), runtime: Any = None, names: Sequence[str] | None = _DEFAULT["names"],
        tensors: bool = _DEFAULT["tensors"]) -> RawDecoder:
    """The ``raw`` head: a :class:`RawDecoder` for every output of ``runtime``.

    ``names`` default to what the runtime reports (``output_details()``), else ``output_N``.
    ``labels`` are not used: a raw result names outputs, never classes.
    """
    o = check_head_options("raw", OPTIONS, {"names": names, "tensors": tensors})
    names, tensors = o["names"], bool(o["tensors"])
    if isinstance(names, str):
        names = [names]
    if names is None:
        details = getattr(runtime, "output_details", None)
        names = [d.get("name", f"output_{i}") for i, d in enumerate(details())] if callable(details) else []
    count = len(getattr(runtime, "output_quantization", None) or names)
    quant = [output_quantization(runtime, i) for i in range(count)] if runtime is not None else []
    return RawDecoder(list(names), quant, tensors)
