"""Before a build reads any image: will it fit this machine? After it: what did it use?

The estimate and the limits are in :mod:`edgekit.builders.host.resources`; this module applies
them to a request and writes the figures to the build log.
"""

from __future__ import annotations

import resource
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.builders.host.resources import (
    GB,
    PHASE_NAMES,
    check_disk,
    check_memory,
    chunk_size,
    memory_phases,
    path_bytes,
    peak_rss,
    width_factor,
)
from edgekit.builders.host.tree import start_watch, stop_watch
from edgekit.errors import UsageError

if TYPE_CHECKING:
    from edgekit.builders.request import BuildRequest


def _files_under(folder: Path | None) -> int:
    """Files under ``folder`` (0 when it is not a folder): an upper bound on its images."""
    if folder is None or not Path(folder).is_dir():
        return 0
    return sum(1 for p in Path(folder).rglob("*") if p.is_file())


def check_resources(request: BuildRequest, log: Any, hwc: tuple[int, int, int],
                    activation_bytes: int | None = None, *,
                    plans: Iterable[tuple[str, Mapping[str, Any]]] | None = None) -> None:
    """Before the model runs and any image is read: refuse a build whose estimated peak memory
    (or spooled images) will not fit this machine, with the flag that overrides; log the estimate
    either way. ``hwc`` is the model's static input; ``activation_bytes`` its graph's widest step
    for one image (:mod:`edgekit.builders.host.memory`; None: unknown). The source loaders call
    it (``load_source_model(..., precheck=)``) before ONNX Runtime or LiteRT first runs the model.
    It also starts the build's memory watch (:mod:`edgekit.builders.host.tree`), which
    :func:`log_peak_memory` reads: from here on the whole process tree's peak is measured. ``plans``:
    each resolved target's builder and options (builders/targets.py resolves them once; None: read here)."""
    start_watch(owner=log)
    h, w, c = hwc
    given = sum(_files_under(Path(s)) if Path(s).is_dir() else 100 for s in request.calib)
    n_calib = min(given, request.calib_count) if request.calib_count else given
    n_eval = _files_under(request.eval_dir)
    chunk = chunk_size(h, w)
    int8, probe = int8_plans(request, plans)
    phases = memory_phases(h, w, chunk, n_calib + n_eval, path_bytes(request.model), activation_bytes,
                           onnx=Path(request.model).suffix.lower() == ".onnx", int8=int8, probe=probe)
    top = max(phases, key=phases.__getitem__)
    estimate = phases[top]
    spool = (n_calib + n_eval) * h * w * c
    widest = (f"its widest layer holds {_size(activation_bytes)} per image, "
              if activation_bytes and width_factor(h, w, activation_bytes) > 1 else "")
    total = getattr(activation_bytes, "total", None)
    during = (f"if {PHASE_NAMES[top]} runs" + (f": {_size(total)} of activations per image" if total else "")
              + f"; conversion alone {phases['convert'] / GB:.1f} GB; " if top != "convert" else "")
    log.info(f"memory: this build should peak near {estimate / GB:.1f} GB ({during}{h}x{w} input, {widest}{chunk} "
             f"image(s) per chunk, up to {n_calib} calibration + {n_eval} evaluation images; "
             f"{spool / GB:.2f} GB spooled to {tempfile.gettempdir()})")
    what = f"building a {h}x{w} model with {n_calib + n_eval} images" + (f" ({widest[:-2]})" if widest else "")
    cap = request.max_memory
    if cap and estimate > cap:  # the user's own limit (a CI runner, a board shared with other work)
        raise UsageError(f"{what} needs about {estimate / GB:.1f} GB of memory; "
                         f"--max-memory caps it at {cap / GB:.1f} GB",
                         "raise --max-memory, or build a smaller input size")
    check_memory(estimate, what, not request.memory_check)
    check_disk(spool, not request.memory_check)


def int8_plans(request: BuildRequest, plans: Iterable[tuple[str, Mapping[str, Any]]] | None = None
               ) -> tuple[bool, bool]:
    """``(int8, probe)`` for :func:`edgekit.builders.host.resources.memory_phases`: whether a
    target quantises int8 with the TFLite builder (its per-layer report may run), and whether one
    of them also may keep layers in float, recovery on (int8 recovery's probe may run: no
    ``compile``, as ``builders/int8/recovery.py`` decides). A target that cannot be read counts as
    both (the estimate errs high; the build refuses it with its own message)."""
    if plans is None:
        try:
            plans = _read_plans(request)
        except Exception:
            return True, bool(request.recover)
    int8 = probe = False
    for builder, options in plans:
        if not str(builder).startswith("edgekit.builders.tflite:") or "int8" not in options.get("variants", ()):
            continue
        int8 = True
        probe = probe or (bool(request.recover) and not options.get("compile"))
    return int8, probe


def _read_plans(request: BuildRequest) -> list[tuple[str, Mapping[str, Any]]]:
    """Each target's builder and options read from its file (for a caller that has not resolved them)."""
    from edgekit.target import load_target

    overrides = request.builder_overrides()
    return [(t.builder, t.build_options(overrides)) for t in map(load_target, map(str, request.targets))]


def _size(n: int) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / (1 << 20):.1f} MB"


def log_peak_memory(log: Any, t_start: float, onnx2tf: bool = False) -> None:
    """The build's time and peak resident memory: its whole process tree's at once (this process
    and its children, onnx2tf's among them, from the watch :func:`check_resources` started), with
    each part; without a watch (not Linux, no pre-check) this process's own.

    ``onnx2tf``: without a watch, also name the largest child's own peak (``RUSAGE_CHILDREN``:
    any child's figure counts the parent's pages at fork, so only when one did real work).
    """
    import time

    seconds = time.perf_counter() - t_start
    peak = stop_watch()
    if peak is None:
        child = peak_rss(resource.RUSAGE_CHILDREN) if onnx2tf else 0
        log.info(f"build: {seconds:.1f}s, peak RSS {peak_rss() / GB:.2f} GB"
                 + (f" (onnx2tf process {child / GB:.2f} GB)" if child else ""))
        return
    parts = (f" (this process {peak.own / GB:.2f} GB + its child processes {peak.children / GB:.2f} GB at that moment)"
             if peak.children else "")
    largest = (f"; the largest child alone {peak.largest_child / GB:.2f} GB"
               if peak.largest_child and not peak.children else "")
    log.info(f"build: {seconds:.1f}s, peak RSS {peak.tree / GB:.2f} GB, this process and its children together"
             f"{parts}{largest}")
