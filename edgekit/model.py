"""Opening a model: ``PATH`` or ``BUNDLE:VARIANT`` -> a runtime plus what decoding needs (labels).

>>> with open_model("dist/demo-cpu:int8") as model:                   # doctest: +SKIP
...     outputs = model.runtime.infer(tensor)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bundle import read_labels
from edgekit.errors import ModelError

__all__ = ["OpenModel", "open_model", "read_labels", "split_model_spec"]


@dataclass
class OpenModel:
    """A runtime opened from a bundle or a bare model file, with what decoding needs.

    ``task`` names the head that decodes its outputs (:data:`edgekit.results.TASK_HEADS`):
    the bundle's ``task``, or for a bare file ``classify`` when it has one vector output and
    ``raw`` otherwise; ``task_options`` are that head's options from the bundle (which
    output holds the class scores; the outputs' names). A context manager: leaving it
    closes the runtime.
    """

    name: str
    path: Path
    variant: str | None
    runtime: Any
    labels: list[str] = field(default_factory=list)
    precision: str | None = None
    target: str | None = None
    task: str = "classify"
    task_options: dict[str, Any] = field(default_factory=dict)

    def assumed_input(self) -> str | None:
        """For a bare model (no bundle, so no preprocessing recorded): the layout, shape, colour
        and scaling edgekit assumed, in words; None for a bundle."""
        if self.variant is not None or self.target is not None:
            return None
        spec = self.runtime.input_spec
        scaling = f"(pixel - {spec.mean[0]:g}) / {spec.std[0]:g}" if not spec.quantized else "quantised uint8/int8"
        return (f"{spec.layout} {'x'.join(map(str, spec.shape))} {spec.dtype}, colour {spec.colour}, {scaling} "
                "(assumed: a bare model carries no preprocessing; build a bundle to record it)")

    def close(self) -> None:
        self.runtime.close()

    def __enter__(self) -> OpenModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_model_spec(spec: str | Path) -> tuple[Path, str | None]:
    """``"dist/demo-cpu:fp16"`` -> (``dist/demo-cpu``, ``"fp16"``); an existing path is taken whole."""
    text = str(spec)
    if Path(text).exists() or ":" not in text:
        return Path(text), None
    path, _, variant = text.rpartition(":")
    return Path(path), variant or None


def open_model(
    spec: str | Path,
    variant: str | None = None,
    labels: str | Path | None = None,
    **options: Any,
) -> OpenModel:
    """Open a bundle (``BUNDLE`` or ``BUNDLE:VARIANT``) or a bare ``.tflite``/``.onnx`` file.

    ``options`` override the bundle's runtime options (``num_threads``, ``delegate``,
    ``device``, ``providers``, ``allow_fallback``, ``profile``); options left None are not
    passed. ``labels`` names a labels file for a bare model (a bundle carries its own).
    ``task`` and ``task_options`` override the task head (a bare YOLO ``.onnx`` is a detector
    only when told); the options are laid over the bundle's.
    """
    options = {k: v for k, v in options.items() if v is not None}
    task = options.pop("task", None)
    extra = dict(options.pop("task_options", None) or {})
    opened = _open(spec, variant, labels, options)
    if task is not None or extra:
        from edgekit.results import TASK_HEADS

        if task is not None and task not in TASK_HEADS:
            opened.close()
            raise ModelError(f"unknown task {task!r}", f"known tasks: {', '.join(TASK_HEADS)}")
        same = task is None or task == opened.task
        opened.task_options = {**(opened.task_options if same else {}), **extra}
        opened.task = task or opened.task
    return opened


def _open(spec: str | Path, variant: str | None, labels: str | Path | None, options: dict[str, Any]) -> OpenModel:
    from edgekit.bundle import load_bundle
    from edgekit.runtime import open_runtime

    path, from_spec = split_model_spec(spec)
    variant = variant or from_spec
    if path.is_dir():
        allow_rejected = bool(options.pop("allow_rejected", False))
        bundle = load_bundle(path, allow_rejected=allow_rejected)
        entry = bundle.model(variant)
        runtime = open_runtime(bundle, model=entry.name, **options)  # hashed once, by load_bundle
        _refuse_unused_device(runtime, options, f"{path.name}:{entry.name}")
        names = read_labels(labels) if labels else bundle.labels
        task_options = _task_options(bundle.task, entry)
        _refuse_label_count(runtime, names, bundle.task, task_options, f"{path.name}:{entry.name}",
                            "give a labels file with one line per class" if labels else "rebuild the bundle")
        return OpenModel(f"{path.name}:{entry.name}", path, entry.name, runtime, names, entry.precision, bundle.target,
                         bundle.task, task_options)
    if variant:
        raise ModelError(
            f"{path} is not a bundle, so it has no variant {variant!r}",
            "give BUNDLE_DIR:VARIANT, or the model file alone",
        )
    options.pop("allow_rejected", None)
    runtime = open_runtime(path, **options)
    _refuse_unused_device(runtime, options, path.name)
    task = _bare_task(runtime)
    names = read_labels(labels) if labels else []
    _refuse_label_count(runtime, names, task, {}, path.name, "give a labels file with one line per class")
    return OpenModel(path.name, path, None, runtime, names, task=task)


def _refuse_label_count(runtime: Any, labels: list[str], task: str, options: dict[str, Any], name: str,
                        fix: str) -> None:
    """Labels must name every class score, one each: 3 labels for a 10-class model would print
    class numbers for most results (or a wrong label for all of them if the file is another model's)."""
    details = getattr(runtime, "output_details", None)
    if task != "classify" or not labels or not callable(details):
        return
    outputs = details()
    index = options.get("output_index", 0)
    if not isinstance(index, int) or not 0 <= index < len(outputs):
        return
    shape = list(outputs[index].get("shape", []))
    width = shape[-1] if shape else None
    if isinstance(width, (int, np.integer)) and width > 0 and int(width) != len(labels):
        runtime.close()
        raise ModelError(f"{name}: {len(labels)} labels for a model with {int(width)} classes", fix)


def _task_options(task: str, entry: Any) -> dict[str, Any]:
    """The head's options a bundle model carries: classify's output index (a converter may
    have moved the class scores), raw's output names as the original model called them."""
    options = dict(entry.extra.get("task_options") or {})
    if task == "raw":
        options.setdefault("names", [str(o.get("name", f"output_{i}")) if isinstance(o, dict) else f"output_{i}"
                                     for i, o in enumerate(entry.outputs)])
    return options


def _bare_task(runtime: Any) -> str:
    """``classify`` for a bare model with one vector output, ``raw`` otherwise (never fake top-k)."""
    from edgekit.results import default_task

    details = getattr(runtime, "output_details", None)
    if not callable(details):
        return "classify"
    return default_task([list(d.get("shape", [])) for d in details()])


def _refuse_unused_device(runtime: Any, options: dict[str, Any], name: str) -> None:
    """An Edge TPU ``device`` the caller asked for must be used: pycoral's ``usb:0`` means "on
    the TPU or fail", so a LiteRT model that runs on the CPU instead (a bundle built without
    edgetpu_compiler) is an error, not a silent fallback to XNNPACK."""
    if "device" not in options:
        return
    describe = getattr(runtime, "describe", None)
    info = describe() if callable(describe) else {}
    delegate = info.get("delegate_requested")
    if delegate is None or delegate == "edgetpu":  # not LiteRT, or really on the Edge TPU
        return
    runtime.close()
    raise ModelError(
        f"--device {options['device']} asks for an Edge TPU, but {name} runs on the CPU ({delegate}): "
        "the bundle has no model compiled for the Edge TPU",
        "build it with edgetpu_compiler on PATH (x86-64 Linux, Coral's apt repository), "
        "or drop --device to run the plain int8 model on the CPU",
    )
