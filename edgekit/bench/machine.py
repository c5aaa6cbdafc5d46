"""Machine context: what a reader needs to trust (or distrust) a benchmark number.

CPU model, cpufreq governors, temperatures, throttling evidence and library versions,
read from /proc and /sys where the kernel exposes them (a VM or container often does
not: :func:`machine_context` says so in its ``warnings`` rather than guessing).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_SYS_CPU = Path("/sys/devices/system/cpu")
_LIBRARIES = (  # distribution names; edgekit's own version comes from edgekit._version
    "numpy",
    "opencv-python-headless",
    "opencv-python",
    "ai-edge-litert",
    "tflite-runtime",
    "onnxruntime",
    "onnxruntime-gpu",
    "tensorrt",
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU (or board) model from /proc/cpuinfo and the device tree, else platform."""
    info = _read(Path("/proc/cpuinfo")) or ""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        for line in info.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    board = _read(Path("/proc/device-tree/model"))
    return (board or platform.processor() or platform.machine()).strip("\x00")


def governors() -> dict[str, str]:
    """cpufreq scaling governor per CPU (empty where the kernel does not expose it)."""
    out = {}
    for path in sorted(_SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_governor")):
        value = _read(path)
        if value:
            out[path.parent.parent.name] = value
    return out


def temperatures() -> dict[str, float]:
    """Thermal zone temperatures in degrees Celsius, keyed by zone type."""
    out = {}
    for zone in sorted(Path("/sys/class/thermal").glob("thermal_zone*")):
        raw = _read(zone / "temp")
        if raw and raw.lstrip("-").isdigit():
            out[_read(zone / "type") or zone.name] = int(raw) / 1000.0
    return out


def throttling() -> dict[str, Any]:
    """Throttling evidence where readable: Raspberry Pi firmware flags, thermal throttle counters."""
    out: dict[str, Any] = {}
    pi = _read(Path("/sys/devices/platform/soc/soc:firmware/get_throttled"))
    if pi is not None:
        out["rpi_get_throttled"] = pi  # bit 2: throttled now; bit 18: has throttled since boot
    counts = [_read(p) for p in _SYS_CPU.glob("cpu[0-9]*/thermal_throttle/core_throttle_count")]
    if counts:
        out["core_throttle_count"] = sum(int(c) for c in counts if c and c.isdigit())
    return out


def library_versions(extra: Iterable[str] = ()) -> dict[str, str]:
    """Installed versions of the libraries that decide the numbers (installed ones only)."""
    import importlib.metadata as md

    from edgekit._version import __version__

    out = {"python": platform.python_version(), "edgekit": __version__}
    for name in (*_LIBRARIES, *extra):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def machine_context(extra_libraries: Iterable[str] = ()) -> dict[str, Any]:
    """Everything recorded with a benchmark result, plus ``warnings`` about trustworthiness.

    Warns when the cpufreq governor is not ``performance`` (frequency scaling moves the
    numbers, as pycoral's benchmarks warn) or cannot be read.
    """
    govs = governors()
    warnings = []
    if not govs:
        warnings.append("cpufreq governor not readable (VM or container?): clock speed may vary")
    elif any(g != "performance" for g in govs.values()):
        found = ", ".join(sorted(set(govs.values())))
        warnings.append(f"CPU governor is {found}, not 'performance': latencies may vary with clock scaling")
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux
        load = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        usable = os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "governor": sorted(set(govs.values()))[0] if len(set(govs.values())) == 1 else govs or None,
        "temperatures_c": temperatures(),
        "throttling": throttling(),
        "load_average": list(load) if load else None,
        "libraries": library_versions(extra_libraries),
        "warnings": warnings,
    }
