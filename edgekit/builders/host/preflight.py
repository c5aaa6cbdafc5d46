"""Before a build reads any image: will it fit this machine? After it: what did it use?

The estimate and the limits are in :mod:`edgekit.builders.host.resources`; this module applies
them to a request and writes the figures to the build log.
"""

from __future__ import annotations

import resource
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.builders.host.resources import (
    GB,
    check_disk,
    check_memory,
    chunk_size,
    estimate_memory,
    path_bytes,
    peak_rss,
    width_factor,
)
from edgekit.errors import UsageError

if TYPE_CHECKING:
    from edgekit.builders.request import BuildRequest


def _files_under(folder: Path | None) -> int:
    """Files under ``folder`` (0 when it is not a folder): an upper bound on its images."""
    if folder is None or not Path(folder).is_dir():
        return 0
    return sum(1 for p in Path(folder).rglob("*") if p.is_file())


def check_resources(request: BuildRequest, log: Any, hwc: tuple[int, int, int],
                    activation_bytes: int | None = None) -> None:
    """Before the model runs and any image is read: refuse a build whose estimated peak memory
    (or spooled images) will not fit this machine, with the flag that overrides; log the estimate
    either way. ``hwc`` is the model's static input; ``activation_bytes`` its graph's widest step
    for one image (:mod:`edgekit.builders.host.memory`; None: unknown). The source loaders call
    it (``load_source_model(..., precheck=)``) before ONNX Runtime or LiteRT first runs the model."""
    h, w, c = hwc
    given = sum(_files_under(Path(s)) if Path(s).is_dir() else 100 for s in request.calib)
    n_calib = min(given, request.calib_count) if request.calib_count else given
    n_eval = _files_under(request.eval_dir)
    chunk = chunk_size(h, w)
    estimate = estimate_memory(h, w, chunk, n_calib + n_eval, path_bytes(request.model), activation_bytes)
    spool = (n_calib + n_eval) * h * w * c
    widest = (f"its widest layer holds {_size(activation_bytes)} per image, "
              if activation_bytes and width_factor(h, w, activation_bytes) > 1 else "")
    log.info(f"memory: this build should peak near {estimate / GB:.1f} GB ({h}x{w} input, {widest}{chunk} image(s) "
             f"per chunk, up to {n_calib} calibration + {n_eval} evaluation images; "
             f"{spool / GB:.2f} GB spooled to {tempfile.gettempdir()})")
    what = f"building a {h}x{w} model with {n_calib + n_eval} images" + (f" ({widest[:-2]})" if widest else "")
    cap = request.max_memory
    if cap and estimate > cap:  # the user's own limit (a CI runner, a board shared with other work)
        raise UsageError(f"{what} needs about {estimate / GB:.1f} GB of memory; "
                         f"--max-memory caps it at {cap / GB:.1f} GB",
                         "raise --max-memory, or build a smaller input size")
    check_memory(estimate, what, not request.memory_check)
    check_disk(spool, not request.memory_check)


def _size(n: int) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / (1 << 20):.1f} MB"


def log_peak_memory(log: Any, t_start: float, onnx2tf: bool = False) -> None:
    """The build's time and peak resident memory; with ``onnx2tf`` also its conversion process's.

    (Any child's figure counts the parent's pages at fork, so children are reported only when
    one did real work.)
    """
    import time

    child = peak_rss(resource.RUSAGE_CHILDREN) if onnx2tf else 0
    log.info(f"build: {time.perf_counter() - t_start:.1f}s, peak RSS {peak_rss() / GB:.2f} GB"
             + (f" (onnx2tf process {child / GB:.2f} GB)" if child else ""))
