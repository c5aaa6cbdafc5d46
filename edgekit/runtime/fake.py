"""FakeRuntime: a Runtime built from a plain function, for testing the layers above
(pipeline, daemon, robot) without a model, as httpx's MockTransport does for transports."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from edgekit.imaging.image import InputSpec
from edgekit.util.optionspec import Option, defaults


class FakeRuntime:
    """Satisfies the Runtime contract by calling ``fn(tensor) -> list[array]``.

    ``delay_s`` makes every inference take at least that long (to model a slow backend).
    ``calls`` counts inferences.
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("delay_s", "float", 0.0, "minimum time per inference (s)", ge=0, le=3600),
        Option("name", "str", "fake", "backend name in describe()"),
    )
    _DEFAULT = defaults(OPTIONS)  # the keyword defaults below come from the spec, never a second copy

    def __init__(
        self,
        fn: Callable[[np.ndarray], list[np.ndarray]],
        input_spec: InputSpec,
        delay_s: float = _DEFAULT["delay_s"],
        name: str = _DEFAULT["name"],
    ):
        self._fn = fn
        self.input_spec = input_spec
        self.delay_s = delay_s
        self.name = name
        self.calls = 0
        self.closed = False

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        if self.closed:
            raise RuntimeError("FakeRuntime used after close()")
        if tuple(tensor.shape) != tuple(self.input_spec.shape):
            raise ValueError(f"input shape {tensor.shape} != {self.input_spec.shape}")
        if self.delay_s:
            time.sleep(self.delay_s)
        self.calls += 1
        return [np.array(o, copy=True) for o in self._fn(tensor)]

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "version": "0", "calls": self.calls}

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
