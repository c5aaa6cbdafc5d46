"""What this machine can build and run, what is missing, and the fix for each.

Checks Python and library versions, the LiteRT runtimes, libedgetpu and an Edge TPU on USB
(by vendor/product id in sysfs) or PCIe (``/dev/apex_0``), ``edgetpu_compiler``, an NVIDIA GPU
(``nvidia-smi``, ``/proc/driver/nvidia``), CUDA, cuda-python, TensorRT and JetPack
(``/etc/nv_tegra_release``), ONNX Runtime's providers, cameras (``/dev/video*``), picamera2,
and the Vector SDK and its configuration. One module per area; each check takes an
:class:`Env` (where to look) and returns :class:`Check` lines. Nothing here imports
TensorFlow; external programs are run with argument lists and a timeout. ``edgekit doctor``
(:mod:`edgekit.commands.doctor`) prints the result.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from edgekit.doctor.base import INFO, MISSING, OK, WARN, Check, Env
from edgekit.doctor.cameras import check_cameras
from edgekit.doctor.edgetpu import check_edgetpu
from edgekit.doctor.libraries import check_litert, check_onnxruntime, check_python
from edgekit.doctor.nvidia import check_nvidia
from edgekit.doctor.toolchains import check_toolchains
from edgekit.doctor.vector import check_vector

__all__ = ["CHECKS", "INFO", "MISSING", "OK", "WARN", "Check", "Env", "check_cameras", "check_edgetpu",
           "check_litert", "check_nvidia", "check_onnxruntime", "check_python", "check_toolchains", "check_vector",
           "report",
           "run_checks", "targets_summary"]

CHECKS: list[Callable[[Env], list[Check]]] = [
    check_python,
    check_litert,
    check_onnxruntime,
    check_edgetpu,
    check_nvidia,
    check_cameras,
    check_vector,
    check_toolchains,
]


def run_checks(env: Env | None = None) -> list[Check]:
    """Run every check; a check that crashes becomes a ``warn`` line instead of stopping the report."""
    env = env or Env()
    out: list[Check] = []
    for check in CHECKS:
        try:
            out.extend(check(env))
        except Exception as exc:  # doctor must always finish its report
            out.append(
                Check(
                    check.__name__.removeprefix("check_"),
                    check.__name__,
                    WARN,
                    f"check crashed: {type(exc).__name__}: {exc}",
                    "report this at the edgekit issue tracker, with `edgekit doctor --json`",
                )
            )
    return out


def targets_summary(checks: list[Check]) -> dict[str, dict[str, Any]]:
    """Which targets can run here, and what each one that cannot is missing."""
    ok = {c.name for c in checks if c.status in (OK, WARN)}
    need = {
        "cpu": [["ai_edge_litert", "onnxruntime"]],
        "rpi": [["ai_edge_litert"]],
        "edgetpu": [["ai_edge_litert"], ["libedgetpu"], ["Edge TPU (USB)", "Edge TPU (PCIe)"]],
        "jetson": [["NVIDIA GPU"], ["TensorRT", "onnxruntime GPU providers"]],
    }
    out = {}
    for target, groups in need.items():
        lacking = [" or ".join(g) for g in groups if not any(n in ok for n in g)]
        if (
            target == "jetson"
            and "TensorRT" in ok
            and "cuda-python" not in ok
            and "onnxruntime GPU providers" not in ok
        ):
            lacking.append("cuda-python")
        out[target] = {"can_run": not lacking, "missing": lacking}
    return out


def report(checks: list[Check]) -> dict[str, Any]:
    """The JSON document ``--json`` prints."""
    from edgekit._version import __version__

    return {
        "edgekit": __version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "checks": [asdict(c) for c in checks],
        "targets": targets_summary(checks),
        "missing": sum(c.status == MISSING for c in checks),
    }
