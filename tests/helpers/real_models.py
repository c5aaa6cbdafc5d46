"""Small REAL models for success-path tests: written with onnx.helper in milliseconds (no
TensorFlow) and run by the real ONNX Runtime adapter (edgekit.runtime.onnxrt.OnnxRuntime).

The models compute simple, known functions of the input so a test can say what it expects:

- :func:`mean_linear_onnx`: logits (or softmax scores) linear in the input's mean value;
- :func:`channel_share_onnx`: each channel's share of the total brightness (an RGB frame whose
  red channel is bright scores class 0, green class 1, blue class 2).

``FakeRuntime`` stays for what only a fake can do (an inference that fails or takes a chosen
time on cue); everything that just needs "a model" uses one of these.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.imaging.image import InputSpec
from edgekit.runtime.onnxrt import OnnxRuntime

_DIR = tempfile.TemporaryDirectory(prefix="edgekit-test-models-")
_CACHE: dict[tuple, Path] = {}


def _save(nodes: list, inits: list, shape: Sequence[int], out_shape: Sequence[int], path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what onnxruntime of every supported version loads
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _const(name: str, a: Any):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(a), name)


def mean_linear_onnx(path: Path, shape: Sequence[int], weights: Sequence[float], bias: Sequence[float],
                     softmax: bool = True) -> Path:
    """``y = softmax(mean(x) * weights + bias)`` (plain logits when ``softmax`` is False):
    one input ``x`` of ``shape`` (any rank, batch 1), one output ``y`` of shape ``[1, K]``."""
    from onnx import helper

    k = len(weights)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=list(range(1, len(shape))), keepdims=0),
        helper.make_node("Reshape", ["m", "shape"], ["m2"]),
        helper.make_node("MatMul", ["m2", "w"], ["l"]),
        helper.make_node("Add", ["l", "b"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"], axis=1) if softmax else helper.make_node("Identity", ["z"], ["y"]),
    ]
    inits = [_const("shape", np.array([1, 1], np.int64)), _const("w", np.array([weights], np.float32)),
             _const("b", np.array(bias, np.float32))]
    return _save(nodes, inits, shape, [1, k], path)


def channel_share_onnx(path: Path, shape: Sequence[int] = (1, 16, 16, 3)) -> Path:
    """``y[c] = mean(x[..., c]) / sum over c of mean(x[..., c])`` for an NHWC input: scores that
    sum to 1, the largest for the brightest channel."""
    from onnx import helper

    c = shape[-1]
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[1, 2], keepdims=0),  # [1, C]
        helper.make_node("MatMul", ["m", "ones"], ["s"]),  # [1, 1]: the total
        helper.make_node("Div", ["m", "s"], ["y"]),
    ]
    return _save(nodes, [_const("ones", np.ones((c, 1), np.float32))], shape, [1, c], path)


def model_file(kind: str, **kwargs: Any) -> Path:
    """A cached model file of ``kind`` (``mean_linear`` or ``channel_share``), written once per process."""
    key = (kind, *sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in kwargs.items()))
    if key not in _CACHE:
        path = Path(_DIR.name) / f"{kind}-{len(_CACHE)}.onnx"
        maker = {"mean_linear": mean_linear_onnx, "channel_share": channel_share_onnx}[kind]
        _CACHE[key] = maker(path, **kwargs)
    return _CACHE[key]


def onnx_runtime(spec: InputSpec, kind: str = "mean_linear", **kwargs: Any) -> OnnxRuntime:
    """The real ONNX Runtime on a ``kind`` model whose input is ``spec.shape`` (one thread: the
    tests run beside each other on a small machine), with ``spec``'s preprocessing."""
    path = model_file(kind, shape=tuple(spec.shape), **kwargs)
    return OnnxRuntime(path, input_spec=spec, num_threads=1)


class Hooked:
    """A real runtime with a hook called before each inference (``hook(calls_so_far)``), a
    count of inferences and whether it was closed: fault injection on cue (a robot vanishing
    mid-run) around a real model, and a record of what the code under test did with it."""

    def __init__(self, runtime: Any, hook: Callable[[int], None] | None = None):
        self.runtime, self.hook, self.calls, self.closed = runtime, hook, 0, False
        self.input_spec = runtime.input_spec

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        if self.hook is not None:
            self.hook(self.calls)
        out = self.runtime.infer(tensor)
        self.calls += 1
        return out

    def close(self) -> None:
        self.closed = True
        self.runtime.close()

    def __getattr__(self, name: str) -> Any:  # describe, output_quantization ...
        return getattr(self.runtime, name)

    def __enter__(self) -> Hooked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
