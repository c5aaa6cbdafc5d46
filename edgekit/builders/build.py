"""``edgekit.build``: model + calibration images -> one verified bundle per target.

The model is loaded, exported and its reference outputs computed once (a
:class:`~edgekit.builders.context.BuildContext`); each target's builder then converts, writes
and verifies its variants into a temporary directory that is renamed into place only when
the accuracy gate passes (:mod:`edgekit.builders.publish`).
"""

from __future__ import annotations

import errno
import logging
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.builders.context import BuildContext
from edgekit.builders.contract import TargetBuild
from edgekit.builders.gate.detect import DetectEval, DetectGate, load_detection_eval
from edgekit.builders.gate.landmarks import LandmarkGate
from edgekit.builders.gate.segment import SegmentGate
from edgekit.builders.host.debris import sweep, work_dir
from edgekit.builders.host.preflight import check_resources, log_peak_memory
from edgekit.builders.log import BuildLog, interruptible
from edgekit.builders.outcome import finish
from edgekit.builders.publish import build_target
from edgekit.builders.request import OPTION_TASKS, BuildRequest, check_bundle_name, check_names
from edgekit.builders.sources.images import ImageSet, load_calibration, load_eval, load_images_eval
from edgekit.builders.sources.inputs import (
    PREPROCESS_KEYS,
    explicit_labels,
    float_input_spec,
    preprocessing,
    read_sidecars,
)
from edgekit.builders.sources.load import SourceModel, load_source_model
from edgekit.builders.targets import BuildTarget, resolve_targets
from edgekit.errors import (
    BackendUnavailable,
    CompilerError,
    EdgekitError,
    ModelError,
    OutputError,
    TargetError,
    UsageError,
)
from edgekit.imaging.image import InputSpec, Preprocessor
from edgekit.target import merge_options
from edgekit.toolchain.child import ToolchainJobError

__all__ = ["BuildRequest", "TargetBuild", "build", "execute", "read_sidecars"]

UNLABELLED = ("raw", "landmarks", "segment")
"""Tasks whose eval images are compared with the original's outputs: their folder names are no classes, and
a folder of images without class folders does."""


def build(model: str | Path | None = None, targets: list[str] | str | None = None,
          calib: list[str | Path] | str | Path | None = None, out: str | Path = "dist", *,
          request: BuildRequest | None = None, **settings: Any) -> list[TargetBuild]:
    """Build one verified bundle per target.

    Args:
        model: ``.keras``, ``.h5``, SavedModel directory, ``.onnx`` (NCHW or NHWC) or float ``.tflite``.
        targets: names (``edgetpu``, ``rpi``, ``cpu``, ``jetson``) or ``.toml`` paths, or one "a,b" string.
        calib: calibration folder(s) and/or video(s); mix in real camera frames here.
        out: the directory that receives ``<name>-<target>/`` bundles.
        request: a :class:`~edgekit.builders.request.BuildRequest` made already (then nothing else).
        settings: any other build setting by name, e.g. ``eval_dir="eval/"``, ``min_accuracy_ratio=0.98``,
            ``task="detect"``, ``quiet=True``: every row of :data:`edgekit.builders.request.SETTINGS`
            (type, default, range and help; ``edgekit build -h`` shows the same as flags). An unknown
            name or a value out of range is refused before any work, in one line.

    Returns one TargetBuild per target; raises, once all are built, as builders/outcome.py:finish says.
    """
    if request is None:
        check_names(settings)
        request = BuildRequest(model=model, targets=targets, calib=calib, out=out, **settings)
    elif settings or model is not None:
        raise UsageError("build() takes a request or settings, not both", "pass one BuildRequest, or keywords")
    return execute_quietly(request)


def execute_quietly(request: BuildRequest) -> list[TargetBuild]:
    """:func:`execute`; with ``quiet``, what TensorFlow, absl and oneDNN print from C++ straight to fd 2
    (and the converter's child processes, which inherit it) goes to the log at DEBUG instead (an
    error-looking line stays a WARNING), so a quiet build writes nothing to stderr."""
    if not request.quiet:
        return execute(request)
    from edgekit.util.quiet import converter_level, native_stderr_to_log

    with native_stderr_to_log(logging.getLogger("edgekit.build.native"), converter_level):
        return execute(request)


def execute(request: BuildRequest) -> list[TargetBuild]:
    """Build every target of ``request``; see :func:`build` for what is returned and raised."""
    t_start = time.perf_counter()
    log = BuildLog(quiet=request.quiet)
    sweep(request.out, log)  # what killed predecessors left (SIGKILL, OOM, power cut): never removed otherwise
    with interruptible(log), _created_dirs_removed_on_failure(request.out):
        resolved = resolve_targets(request)  # each target read, checked, its builder and options: once
        declared_task, input_size = _declared(request, log)
        plans = [(t.target.builder, t.options) for t in resolved]  # what the memory estimate needs of them
        source = load_source_model(request.model, input_size,
                                   precheck=partial(check_resources, request, log, plans=plans))
        task, class_output = choose_task(request.task or declared_task, source, request.eval_dir)
        _log_task_choice(log, request, source, task, class_output)
        side_labels, side_pre = read_sidecars(request.model)
        labels = explicit_labels(request.labels)
        float_spec = _float_spec(request, source, side_pre, log)
        points = LandmarkGate.for_model(request, source, float_spec) if task == "landmarks" else None
        masks = SegmentGate.for_model(request, source) if task == "segment" else None
        eval_labels = None if task in UNLABELLED else labels or side_labels
        calib_all, evalset, detection = _load_images(request, Preprocessor(float_spec), eval_labels, log, task)
        labels = labels or side_labels or (evalset.class_names if evalset and task not in UNLABELLED else None)
        if request.task_options and task not in OPTION_TASKS:
            raise UsageError(f"--task-option applies to detectors, landmarks and segment; this build's task is {task}",
                             "add --task detect (or landmarks, segment), or leave the options out")
        detect = _detect_gate(request, source, labels, float_spec, detection) if task == "detect" else None
        n_out = source.outputs[class_output].size if class_output is not None else None
        if labels and n_out and len(labels) != n_out:
            raise UsageError(f"{len(labels)} labels for a model with {n_out} outputs",
                             "give a labels file with one line per output class (--labels)")
        model = request.model
        name = request.name or check_bundle_name(model.stem if model.is_file() else model.name,
                                                 "the model's file name (give --name)")
        used, holdout = _split_holdout(calib_all, request.holdout_fraction)
        with _disk_full_is_one_line(request.out), work_dir() as work:  # its PID inside: builders/host/debris.py
            ctx = BuildContext(request=request, source=source, name=name, labels=labels or [], float_spec=float_spec,
                               calib_all=calib_all, calib=used, holdout=holdout, evalset=evalset, log=log,
                               workdir=Path(work), task=task, class_output=class_output, detect=detect,
                               landmarks=points, segment=masks, planned={t.name: t for t in resolved})
            results, failures = _build_each(ctx, resolved, t_start)
        log_peak_memory(log, t_start, onnx2tf=source.kind == "onnx")
    return finish(results, failures, request.allow_partial, log)


#: what one target's conversion can fail with while the others may still build
# a vendor toolchain's child that crashed (edgekit/toolchain/child.py) fails its target, not the others
TARGET_FAILURES = (ModelError, TargetError, CompilerError, BackendUnavailable, ToolchainJobError)


def _build_each(ctx: BuildContext, targets: list[BuildTarget],
                t_start: float) -> tuple[list[TargetBuild], dict[str, EdgekitError]]:
    """Build every target; one that fails (an op its converter lacks, a missing tool) does
    not stop the others. Returns the builds and, by target name, the failures."""
    results, failures = [], {}
    for target in targets:
        try:
            results.append(build_target(ctx, target, t_start))
        except TARGET_FAILURES as exc:
            if len(targets) == 1:
                raise
            ctx.log.warn(f"{target.name}: not built: {exc.message}; going on with the other targets")
            failures[target.name] = exc
    return results, failures


@contextmanager
def _created_dirs_removed_on_failure(out: Path) -> Iterator[None]:
    """A build that stops (an error, Ctrl-C, SIGTERM) removes the ``--out`` folders it created
    (``out`` and any missing parents), when they are still empty; a folder that was there before,
    or one holding a finished bundle or a ``.rejected`` one, stays."""
    created = []
    folder = Path(out).absolute()
    while not folder.exists() and folder != folder.parent:
        created.append(folder)
        folder = folder.parent
    try:
        yield
    except BaseException:
        for folder in created:  # deepest first
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # not empty: a bundle was published there
                break
        raise


@contextmanager
def _disk_full_is_one_line(out: Path) -> Iterator[None]:
    """A full disk (or quota) under --out or the temporary directory: one line saying which.

    TensorFlow reports it as its own error type with the OS message inside, hence the text test.
    The bundle writer and the work directory have already removed what they wrote.
    """
    try:
        yield
    except Exception as exc:
        text = str(exc)
        full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
            m in text for m in ("No space left on device", "Disk quota exceeded"))
        if not full or isinstance(exc, EdgekitError):
            raise
        tmp = tempfile.gettempdir()
        in_tmp = str(getattr(exc, "filename", "") or "").startswith(tmp) or f"{tmp}/edgekit-build-" in text
        where = f"the temporary directory {tmp} (TMPDIR)" if in_tmp else f"--out {out}"
        raise OutputError(f"no space left on the disk holding {where}; nothing was written",
                         "free some space, or point TMPDIR/--out at a larger disk") from exc


def _declared(request: BuildRequest, log: BuildLog) -> tuple[str | None, tuple[int, int] | None]:
    """The task and the input size the model file declares about itself (an Ultralytics ONNX
    export's ``task`` and ``imgsz``; edgekit/modelinfo/embedded.py), where the request gives neither. The
    size is used only for an input whose height/width the graph leaves open."""
    from edgekit.errors import EdgekitError
    from edgekit.modelinfo.embedded import read_embedded

    if not request.model.is_file():
        return None, request.input_size
    try:
        found = read_embedded(request.model)
    except EdgekitError:  # loading the model reports a damaged file, with its fix
        return None, request.input_size
    task = found.task if request.task is None and found.task in ("classify", "detect") else None
    dims = found.input_dims or ()
    open_hw = len(dims) == 4 and any(not isinstance(d, int) or d <= 0 for d in dims[2:])
    size = request.input_size or (found.input_size if open_hw else None)
    said = ([f"task {task}"] if task else []) + ([f"input {size[0]}x{size[1]}"] if size != request.input_size else [])
    if said:
        log.info(f"{', '.join(said)} ({found.source}; --task / --input-size override)")
    return task, size


def choose_task(task: str | None, source: SourceModel, eval_dir: Path | None = None) -> tuple[str, int | None]:
    """The bundle's task head and the index of its class output (None for ``raw`` and ``detect``).

    Default: ``detect`` when the eval set is a detection set (COCO JSON, or YOLO images/ +
    labels/: the annotations say what the model is for); else ``classify`` for a model with
    one output of one vector per image (``[C]``, or ``[C, 1, 1]``), ``raw`` otherwise (a
    detector without annotations, a segmenter, a class + regression model): never top-k
    indices of something that is not a class score vector, and every output gated on its
    cosine. ``--task classify`` on several outputs takes the vector sized like the eval set's
    class folders, else the first (torchvision's auxiliary heads come after the main one). A
    detector's layout is checked once its labels are known (:class:`~edgekit.builders.gate.detect.DetectGate`).
    """
    from edgekit.evaluation.dataset import is_detection_set

    flat = [i for i, o in enumerate(source.outputs) if _is_vector(o.shape)]
    if task is None and eval_dir is not None and is_detection_set(eval_dir):
        task = "detect"
    if task is None:
        task = "classify" if len(source.outputs) == 1 and flat else "raw"
    if task in ("raw", "detect", "landmarks", "segment"):
        return task, None
    if not flat:
        shapes = ", ".join(f"{o.name} {list(o.shape)}" for o in source.outputs)
        raise UsageError(f"--task classify needs an output of class scores (one value per class); "
                         f"this model's outputs are {shapes}", "use --task raw")
    if eval_dir is not None and len(flat) > 1:
        folders = _class_folders(eval_dir)
        flat = sorted(flat, key=lambda i: source.outputs[i].size != folders)  # stable: the first on a tie
    return task, flat[0]


def _log_task_choice(log: BuildLog, request: BuildRequest, source: SourceModel, task: str,
                     class_output: int | None) -> None:
    """Say which output a classifier is scored on, and why a model of several outputs is not."""
    if class_output is not None and len(source.outputs) > 1:
        log.info(f"task classify: class scores from output {source.outputs[class_output].name!r} of "
                 f"{len(source.outputs)} (top-1 is gated on it)")
    elif task == "raw" and request.task is None and request.eval_dir is not None:
        vector = choose_task("classify", source, request.eval_dir)[1] if any(
            _is_vector(o.shape) for o in source.outputs) else None
        count = len(source.outputs)
        log.warn(f"task raw: the model has {count} output{'s' if count > 1 else ''}, each gated on its cosine "
                 "with the original's; top-1 is not measured" + (
                     f" (--task classify scores output {source.outputs[vector].name!r}, --task detect a detector)"
                     if vector is not None else ""))


def _is_vector(shape: tuple) -> bool:
    """One vector per image: ``[C]``, or ``[C, 1, 1]`` as a 1x1 convolution head leaves it."""
    return len(shape) == 1 or (all(isinstance(d, int) for d in shape) and sum(d != 1 for d in shape) == 1)


def _class_folders(eval_dir: Path) -> int:
    """How many class folders a classification eval set has (0 when it is not a folder)."""
    try:
        return sum(1 for p in Path(eval_dir).iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return 0


def _float_spec(request: BuildRequest, source: SourceModel, side_pre: dict, log: BuildLog) -> InputSpec:
    """The original model's input with the build's preprocessing (sidecar file, then the request's)."""
    h, w, c = source.input_hwc
    given = merge_options(side_pre, request.preprocess, PREPROCESS_KEYS)
    if source.kind == "tflite" and not source.scales_own_pixels:  # run/bench read the same graph the same way
        from edgekit.modelinfo.rescale import in_graph_rescale

        source.scales_own_pixels = in_graph_rescale(request.model)
    spec_kw = preprocessing(given, c, raw_pixels=bool(source.scales_own_pixels))
    log.info(f"model {request.model.name}: {source.kind}, input {h}x{w}x{c} ({source.layout}), "
             f"outputs {', '.join(f'{o.name} {list(o.shape)}' for o in source.outputs)}; preprocessing "
             + ", ".join(f"{k}={v}" for k, v in spec_kw.items())
             + ("" if side_pre or request.preprocess else " (defaults: no preprocess.json beside the model)")
             + (f"; pixels 0-255: {source.scales_own_pixels}"
                if source.scales_own_pixels and "mean" not in given and "std" not in given else ""))
    return float_input_spec(source, spec_kw)


def _load_images(request: BuildRequest, prep: Preprocessor, labels: list[str] | None, log: BuildLog,
                 task: str = "classify") -> tuple[ImageSet, ImageSet | None, DetectEval | None]:
    """The calibration images, and the eval set (a detector's: images + annotations) when given."""
    with log.step("load calibration images"):
        calib_all = load_calibration(list(request.calib), prep, request.calib_count, request.seed, log)
    evalset, detection = None, None
    if request.eval_dir is not None:
        with log.step("load evaluation images"):
            if task == "detect":
                evalset, detection = load_detection_eval(request.eval_dir, prep, labels, log)
            elif task in UNLABELLED:  # compared with the original's outputs: any folder of images
                evalset = load_images_eval(request.eval_dir, prep, log)
            else:
                evalset = load_eval(request.eval_dir, prep, labels, log)
    return calib_all, evalset, detection


def _detect_gate(request: BuildRequest, source: SourceModel, labels: list[str] | None, spec: InputSpec,
                 detection: DetectEval | None) -> DetectGate:
    """The detect head of the build, its layout checked against the model's outputs now."""
    return DetectGate.for_model(source, labels or [], spec, request.task_options, detection)


def _split_holdout(calib_all: ImageSet, fraction: float) -> tuple[ImageSet, ImageSet]:
    """The calibration images used for int8, and those held back to measure agreement (none of < 10)."""
    n_images = len(calib_all)
    n_hold = int(n_images * fraction) if n_images >= 10 else 0
    return calib_all.subset(np.arange(n_hold, n_images)), calib_all.subset(np.arange(n_hold))
