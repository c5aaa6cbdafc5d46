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
from edgekit.errors import ModelError, UsageError

__all__ = ["OpenModel", "open_model", "read_labels", "split_model_spec"]


@dataclass
class OpenModel:
    """A runtime opened from a bundle or a bare model file, with what decoding needs.

    ``task`` names the head that decodes its outputs (:data:`edgekit.heads.table.TASK_HEADS`):
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
    origin: dict[str, str] = field(default_factory=dict)
    """A bare model's preprocessing, labels and task: key -> where each came from (flag, sidecar, model
    metadata, default; :mod:`edgekit.modelinfo.preprocessing`). Empty for a bundle, which records its own."""
    notes: tuple[str, ...] = ()

    def assumed_input(self) -> str | None:
        """For a bare model (no bundle, so no preprocessing recorded): the layout, shape and every
        preprocessing value edgekit uses, each with where it came from, in words; None for a bundle."""
        if self.variant is not None or self.target is not None:
            return None
        from edgekit.modelinfo.preprocessing import describe

        spec = self.runtime.input_spec
        quant = f" (quantised: scale {spec.scale:g}, zero point {spec.zero_point})" if spec.quantized else ""
        extra = [f"{what} {value} ({self.origin.get(what) or 'default'})" for what, value in (
            ("labels", f"{len(self.labels)}" if self.labels else "none"), ("task", self.task),
            ("input size", "x".join(map(str, (spec.height, spec.width))) if "input size" in self.origin else None))
            if value is not None]
        return (f"{spec.layout} {'x'.join(map(str, spec.shape))} {spec.dtype}{quant}; assumed: "
                + describe(spec, self.origin) + "; " + ", ".join(extra)
                + "".join(f"; note: {n}" for n in self.notes))

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
    ``task`` and ``task_options`` override the task head; the options are laid over the bundle's.
    ``preprocess`` (InputSpec keys: colour, crop, resize, pad_value, mean, std...) is a bare
    model's preprocessing, over its ``<stem>.preprocess.json`` and what the file itself declares
    (:mod:`edgekit.modelinfo.preprocessing`; an Ultralytics export is a detector, letterboxed with grey 114).
    A bundle refuses it: its preprocessing was calibrated and verified as recorded.
    """
    options = {k: v for k, v in options.items() if v is not None}
    task = options.pop("task", None)
    extra = dict(options.pop("task_options", None) or {})
    opened = _open(spec, variant, labels, options, dict(options.pop("preprocess", None) or {}))
    if task is not None or extra:
        from edgekit.heads.table import TASK_HEADS

        if task is not None and task not in TASK_HEADS:
            opened.close()
            raise ModelError(f"unknown task {task!r}", f"known tasks: {', '.join(TASK_HEADS)}")
        same = task is None or task == opened.task
        opened.task_options = {**(opened.task_options if same else {}), **extra}
        opened.task = task or opened.task
    return opened


def _open(spec: str | Path, variant: str | None, labels: str | Path | None, options: dict[str, Any],
          preprocess: dict[str, Any]) -> OpenModel:
    from edgekit.bundle import load_bundle
    from edgekit.runtime import open_runtime

    path, from_spec = split_model_spec(spec)
    variant = variant or from_spec
    if path.is_dir() and preprocess:
        # the bundle's int8 was calibrated and its gate measured on its recorded preprocessing: another
        # would run unverified (and a quantised input's scale was chosen for the recorded one)
        raise UsageError(f"--{next(iter(preprocess)).replace('_', '-')} applies to a bare model; bundle "
                         f"{path.name} records its preprocessing (edgekit.json input)",
                         "rebuild the bundle with these flags (edgekit build --colour/--mean/--std/--resize ...)")
    if path.is_dir():
        allow_rejected = bool(options.pop("allow_rejected", False))
        bundle = load_bundle(path, allow_rejected=allow_rejected)
        entry = bundle.model(variant)
        runtime = open_runtime(bundle, model=entry.name, **options)  # hashed once, by load_bundle
        _refuse_unused_device(runtime, options, f"{path.name}:{entry.name}")
        names = read_labels(labels) if labels else bundle.labels
        from edgekit.modelinfo.bundled import task_options as bundle_task_options

        task_options = bundle_task_options(bundle, entry)
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
    return _open_bare(path, labels, options, preprocess)


def _open_bare(path: Path, labels: str | Path | None, options: dict[str, Any], preprocess: dict[str, Any]) -> OpenModel:
    """A bare .tflite/.onnx with its preprocessing, labels and task from flags, sidecar files or the
    file's own metadata (:func:`edgekit.modelinfo.preprocessing.resolve`), each with its origin."""
    from edgekit.modelinfo.preprocessing import FLAG, resolve
    from edgekit.runtime import open_runtime

    if not path.is_file():
        return OpenModel(path.name, path, None, open_runtime(path, **options))  # open_runtime says what is wrong
    resolved = resolve(path, preprocess, read_labels(labels) if labels else None)
    origin = dict(resolved.origin)
    embedded = resolved.embedded
    if embedded and embedded.input_size and "input_size" not in options and _free_size(embedded.input_dims):
        options["input_size"] = list(embedded.input_size)  # an export with dynamic=True: its imgsz
        origin["input size"] = embedded.source
    runtime = open_runtime(path, **options)
    try:
        _refuse_unused_device(runtime, options, path.name)
        runtime.input_spec = _bare_spec(path, runtime.input_spec, resolved.given, origin, resolved.scales_own_pixels)
        said, notes = _metadata_fits(embedded, runtime)
        task = embedded.task if said else _bare_task(runtime)
        origin["task"] = embedded.source if said else "default"
        task_options = dict(embedded.task_options) if said else {}
        names, notes = resolved.labels or [], list(resolved.notes) + notes
        if labels:
            _refuse_label_count(runtime, names, task, {}, path.name, "give a labels file with one line per class")
        elif names and _label_count_problem(runtime, names, task):
            notes.append(f"{len(names)} labels from {resolved.labels_origin} left out: "
                         f"{_label_count_problem(runtime, names, task)}")
            names = []
        origin["labels"] = FLAG if labels else resolved.labels_origin or "default"
    except BaseException:
        runtime.close()
        raise
    return OpenModel(path.name, path, None, runtime, names, task=task, task_options=task_options, origin=origin,
                     notes=tuple(notes))


def _metadata_fits(embedded: Any, runtime: Any) -> tuple[bool, list[str]]:
    """Whether the metadata's task is kept, and a note for each way it contradicts the graph."""
    if not embedded:
        return False, []
    from edgekit.modelinfo.embedded import graph_disagreements

    details = getattr(runtime, "output_details", None)
    outputs = [list(d.get("shape", [])) for d in details()] if callable(details) else []
    spec = runtime.input_spec
    # a dynamic export takes its size from imgsz (or a flag): only a fixed graph input can disagree
    hw = (None, None) if _free_size(embedded.input_dims) else (spec.height, spec.width)
    keep, notes = graph_disagreements(embedded, hw, outputs)
    return bool(embedded.task) and keep, notes


def _free_size(dims: Any) -> bool:
    """Whether an ONNX input's height or width is symbolic (a name, not a number)."""
    return bool(dims) and len(dims) == 4 and not all(isinstance(d, int) and d > 0 for d in dims[1:])


def _bare_spec(path: Path, base: Any, given: dict[str, Any], origin: dict[str, str], raw_why: str | None) -> Any:
    """The runtime's input (shape, dtype, quantisation) with the resolved preprocessing; ``raw_why``:
    why the graph takes 0-255 pixels (its first op divides by 255), recorded in ``origin``."""
    from edgekit.imaging.image import InputSpec
    from edgekit.modelinfo.preprocessing import fit_resize, preprocessing, raw_pixels_origin

    if raw_why:
        origin.update(mean=raw_pixels_origin(raw_why), std=raw_pixels_origin(raw_why))
    try:
        kw = fit_resize(preprocessing(given, base.channels, raw_pixels=bool(raw_why)), base.height, base.width)
    except UsageError as exc:
        said = ", ".join(sorted({o for o in origin.values() if o}))
        raise UsageError(f"{path.name}: {exc.message}" + (f" (preprocessing from {said})" if said else ""),
                         exc.hint) from exc
    return InputSpec.from_dict({**base.to_dict(), **kw})


def _refuse_label_count(runtime: Any, labels: list[str], task: str, options: dict[str, Any], name: str,
                        fix: str) -> None:
    """Labels must name every class score, one each: 3 labels for a 10-class model would print
    class numbers for most results (or a wrong label for all of them if the file is another model's)."""
    problem = _label_count_problem(runtime, labels, task, options)
    if problem:
        runtime.close()
        raise ModelError(f"{name}: {problem}", fix)


def _label_count_problem(runtime: Any, labels: list[str], task: str, options: dict[str, Any] | None = None) -> str:
    """Why ``labels`` cannot name a classifier's scores ('' when they can, or it is no classifier)."""
    details = getattr(runtime, "output_details", None)
    if task != "classify" or not labels or not callable(details):
        return ""
    outputs = details()
    index = (options or {}).get("output_index", 0)
    if not isinstance(index, int) or not 0 <= index < len(outputs):
        return ""
    shape = list(outputs[index].get("shape", []))
    width = shape[-1] if shape else None
    if isinstance(width, (int, np.integer)) and width > 0 and int(width) != len(labels):
        return f"{len(labels)} labels for a model with {int(width)} classes"
    return ""


def _bare_task(runtime: Any) -> str:
    """``classify`` for a bare model with one vector output, ``raw`` otherwise (never fake top-k)."""
    from edgekit.heads.table import default_task

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
