"""What a build needs (memory, temporary disk) against what this machine has, and what it used.

A build streams its images a chunk at a time (:mod:`edgekit.builders.sources.spool`), so its memory
no longer grows with the number of images; it grows with the input size (the activations of
one chunk in the original model, one image in TensorFlow's int8 calibrator) and the model's
size (the converter holds several copies of the weights). Figures from
``benchmarks/build_scaling.py`` (MobileNetV2, 2-core x86-64, TF 2.21): 224x224 peaks at about
1.1 GB whatever the number of images, 640x640 at about 1.2 GB. A 4096x4096 input would need
several GB for one image's activations: that is refused up front with the override flag
instead of being OOM-killed without a word.

That is the conversion. Three later phases can peak higher, each from what is known before the
build (:func:`memory_phases`; measured with ``benchmarks/build_memory.py``, whose figures are
the RSS of the whole process tree at once):

* onnx2tf's child process (an ONNX source): a second Python with TensorFlow and the model,
  while this process waits holding ONNX Runtime and the model;
* the per-layer quantisation report (an int8 variant that missed its gate): TensorFlow's
  QuantizationDebugger runs an instrumented model that keeps every tensor;
* int8 recovery's per-layer probe (a target that may keep layers in float: cpu): every op output
  of a few images, of the float and of the int8 model, as float64 and concatenated. This one
  peaked at 2.3 GB on MediaPipe's palm detector and 3.8 GB on PP-OCRv4 det at 320x320, where
  the conversion alone stayed under 1.1 GB. Its size is the graph's *activation total* (every op
  output of one image, :mod:`edgekit.builders.host.memory`) times :data:`PROBE_COPIES`.
"""

from __future__ import annotations

import re
import resource
import shutil
import tempfile
from pathlib import Path

from edgekit.errors import UsageError

GB = 1 << 30
# TensorFlow, Keras and the converter loaded, before any image (measured: 0.66-0.93 GB).
BASE_BYTES = int(0.9 * GB)
# Live activations per input pixel of one chunk in the original model (MobileNetV2: 8 images
# of 224x224 add about 190 MB) and of one image in the int8 calibrator; wider networks need more.
ACTIVATION_BYTES_PER_PIXEL = 480
CALIBRATOR_BYTES_PER_PIXEL = 400
# TensorFlow's converter holds the weights several times over (SavedModel, MLIR, flatbuffers).
WEIGHT_COPIES = 10
# The widest step of MobileNetV2's graph (edgekit.builders.host.memory: one op's inputs and
# outputs) per input pixel, what the two figures above were measured on: a model whose graph is
# wider per pixel scales them up in proportion.
REFERENCE_WIDEST_BYTES_PER_PIXEL = 194
PER_IMAGE_BYTES = 1024  # what still grows with N: file lists, top-1 indices, spool offsets
OVERRIDE_FLAG = "--no-memory-check"
# ---- the later phases (issue 38 item 9; benchmarks/build_memory.py, 2-core x86-64, TF 2.21) ----
# TensorFlow and LiteRT loaded in the build process before a phase adds its own: 0.66-0.70 GB
# measured on MediaPipe's float .tflite files and the demo models
PHASE_BASE_BYTES = int(0.72 * GB)
# an ONNX source's build also holds ONNX Runtime's session and the ONNX graph (0.86-0.90 GB
# measured on PP-OCRv4 det before the probe)
ONNX_RUNTIME_BYTES = int(0.2 * GB)
# int8 recovery (its per-layer probe and its attempts): the probe streams an image at a time (two
# interpreters keeping every tensor, one image's outputs of each in float64), so about 6 activation
# totals; measured 4.2 on palm detection lite (1.03 GB) and under base on PP-OCRv4 det at 160x160
# (0.96 GB). Holding four images whole, it took 20-24 (2.30 and 1.68 GB).
PROBE_COPIES = 6
# the quantisation report's instrumented model (float, int8 and NumericVerify outputs kept):
# measured 1.8-3.4 activation totals
REPORT_COPIES = 4
# onnx2tf's process with the parent beside it: 0.74-1.01 GB measured (PP-OCR cls, det 160-320)
ONNX_CHILD_BYTES = int(0.75 * GB)
ONNX_CHILD_COPIES = 2
# MobileNetV2's activation total per input pixel (Keras layers, batch norm and ReLU fused as
# TensorFlow fuses them): the stand-in when a graph's total is unknown, scaled like the widest step
REFERENCE_TOTAL_BYTES_PER_PIXEL = 708
PHASE_NAMES = {
    "convert": "conversion and calibration",  # always runs
    "onnx2tf": "onnx2tf's process beside this one",
    "report": "the int8 per-layer quantisation report",
    "probe": "int8 recovery's per-layer probe",
}
# images per chunk: the build streams its images (builders/sources/spool.py) this many at a time
CHUNK_PIXELS = 8 * 224 * 224
MAX_CHUNK = 32


def chunk_size(height: int, width: int) -> int:
    """Images per chunk for an input of ``height`` x ``width``: 1 for large inputs, at most MAX_CHUNK."""
    return max(1, min(MAX_CHUNK, CHUNK_PIXELS // max(1, height * width)))


def width_factor(height: int, width: int, activation_bytes: int | None) -> float:
    """How many times wider per pixel than MobileNetV2 a graph's widest step is (at least 1)."""
    if not activation_bytes:
        return 1.0
    return max(1.0, activation_bytes / (height * width * REFERENCE_WIDEST_BYTES_PER_PIXEL))


def estimate_memory(height: int, width: int, chunk: int, n_images: int, model_bytes: int,
                    activation_bytes: int | None = None, *, onnx: bool = False, int8: bool = False,
                    probe: bool = False) -> int:
    """Peak memory (bytes) a build of an ``height`` x ``width`` model is expected to need: the
    largest of :func:`memory_phases` (see it for the arguments)."""
    return max(memory_phases(height, width, chunk, n_images, model_bytes, activation_bytes,
                             onnx=onnx, int8=int8, probe=probe).values())


def memory_phases(height: int, width: int, chunk: int, n_images: int, model_bytes: int,
                  activation_bytes: int | None = None, *, onnx: bool = False, int8: bool = False,
                  probe: bool = False) -> dict[str, int]:
    """Each phase's expected peak (bytes), by :data:`PHASE_NAMES` key; only the phases that run.

    ``convert``: MobileNetV2-like channel widths, or wider in proportion when the graph's widest
    step (``activation_bytes`` for one image, from :mod:`edgekit.builders.host.memory`) says so;
    never narrower (a graph whose shapes are unknown gives None). ``chunk`` images go through
    the original model at once; ``n_images`` adds only bookkeeping. ``onnx``: the source is ONNX
    (onnx2tf's child process, ONNX Runtime beside TensorFlow); ``int8``: a target quantises int8
    with TensorFlow (the report may run); ``probe``: one may also keep layers in float (int8
    recovery's probe may run). The later phases scale with the graph's activation total
    (``activation_bytes.total``; else MobileNetV2's per pixel, scaled like the widest step).
    """
    pixels = height * width
    wider = width_factor(height, width, activation_bytes)
    per_pixel = (ACTIVATION_BYTES_PER_PIXEL * chunk + CALIBRATOR_BYTES_PER_PIXEL) * wider
    phases = {"convert": int(BASE_BYTES + WEIGHT_COPIES * model_bytes + per_pixel * pixels
                             + PER_IMAGE_BYTES * n_images)}
    total = getattr(activation_bytes, "total", None) or int(REFERENCE_TOTAL_BYTES_PER_PIXEL * pixels * wider)
    base = PHASE_BASE_BYTES + WEIGHT_COPIES * model_bytes + (ONNX_RUNTIME_BYTES if onnx else 0)
    if onnx:
        phases["onnx2tf"] = ONNX_CHILD_BYTES + WEIGHT_COPIES * model_bytes + ONNX_CHILD_COPIES * total
    if int8:
        phases["report"] = base + REPORT_COPIES * total
    if probe:
        phases["probe"] = base + PROBE_COPIES * total
    return phases


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(stat: Path) -> int:
    """Reclaimable page cache charged to a cgroup (memory.stat), 0 when unknown."""
    try:
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("inactive_file", "total_inactive_file"):
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_dirs() -> list[tuple[Path, str, str, str]]:
    """(dir, limit file, usage file, stat file) for this process's memory cgroup, v2 then v1."""
    own_v2, own_v1 = "", ""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                own_v2 = path
            elif "memory" in controllers.split(","):
                own_v1 = path
    except (OSError, ValueError):
        pass
    root = Path("/sys/fs/cgroup")
    v2 = ("memory.max", "memory.current", "memory.stat")
    v1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat")
    # inside a container the cgroup's own directory is usually the mount's root
    return [(root / own_v2.lstrip("/"), *v2), (root, *v2),
            (root / "memory" / own_v1.lstrip("/"), *v1), (root / "memory", *v1)]


def cgroup_headroom() -> int | None:
    """Bytes this process's memory cgroup may still take (limit - usage + reclaimable cache);
    None without a limit."""
    for folder, limit_file, usage_file, stat_file in _cgroup_dirs():
        limit = _read_int(folder / limit_file)
        usage = _read_int(folder / usage_file)
        if limit is None or usage is None:
            continue
        if limit >= 1 << 60:  # "max" (v2, not a number) or the v1 "unlimited" sentinel
            return None
        return max(0, limit - usage + _inactive_file(folder / stat_file))
    return None


def available_memory() -> tuple[int | None, str]:
    """Bytes a new allocation may use now, and where that figure comes from.

    The smaller of ``MemAvailable`` (/proc/meminfo) and the memory cgroup's headroom; None
    when neither can be read (not Linux).
    """
    found: list[tuple[int, str]] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except (OSError, ValueError, IndexError):
        pass
    headroom = cgroup_headroom()
    if headroom is not None:
        found.append((headroom, "the memory cgroup's limit"))
    return min(found) if found else (None, "unknown")


def current_rss() -> int:
    """This process's resident memory now (bytes; 0 when /proc is not there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def peak_rss(who: int = resource.RUSAGE_SELF) -> int:
    """The largest resident memory this process (or its largest finished child) has had, in bytes
    (ru_maxrss is KiB on Linux).

    For this process, Linux's ``VmHWM`` when it can be read: ``ru_maxrss`` survives ``exec`` and so
    starts at the resident size of the process that spawned this one (a build started from a test
    runner holding 1.2 GB "peaked" at 1.2 GB before it did anything)."""
    if who == resource.RUSAGE_SELF:
        try:
            with open("/proc/self/status", encoding="ascii", errors="replace") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    return resource.getrusage(who).ru_maxrss * 1024


def parse_size(text: str) -> int:
    """``--max-memory`` values: ``4G``, ``4GB``, ``4GiB``, ``512M``, ``1.5g`` or bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--max-memory {text!r} is not a size", "give it as 4G, 1.5G or 512M")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))


def build_peak() -> int:
    """The build's peak so far: its whole process tree's at once while the build's watch runs
    (:mod:`edgekit.builders.host.tree`: this process and onnx2tf's beside it); else this
    process's, or its largest finished child's if larger."""
    from edgekit.builders.host.tree import current_watch

    watch = current_watch()
    if watch is not None:
        return watch.peak().tree
    return max(peak_rss(), peak_rss(resource.RUSAGE_CHILDREN))


def check_memory(estimate: int, what: str, override: bool) -> None:
    """Refuse (UsageError naming the override flag) when ``estimate`` bytes of peak memory will not
    fit: what this process holds now plus what is available."""
    have, where = available_memory()
    in_use = current_rss()
    if override or have is None or estimate <= in_use + have:
        return
    raise UsageError(f"{what} needs about {estimate / GB:.1f} GB of memory; this machine has "
                     f"{(in_use + have) / GB:.1f} GB for it ({in_use / GB:.1f} GB in use + {have / GB:.1f} GB "
                     f"available, {where})",
                     f"free memory, build a smaller input size, or pass {OVERRIDE_FLAG} to try anyway")


def check_disk(need: int, override: bool) -> None:
    """Refuse when the temporary directory (TMPDIR) cannot hold the spooled images."""
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free
    if override or need <= free:
        return
    raise UsageError(f"the build spools {need / GB:.1f} GB of shaped images to {tmp}, which has "
                     f"{free / GB:.1f} GB free",
                     f"set TMPDIR to a larger disk, use fewer --calib-count images, or pass {OVERRIDE_FLAG}")


def path_bytes(path: Path) -> int:
    """A model's size on disk (a file, or every file of a SavedModel directory)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


