"""``edgekit doctor``: what this machine can build and run, what is missing, and the fix for each.

Checks Python and library versions, the LiteRT runtimes, libedgetpu and an Edge TPU on USB
(by vendor/product id in sysfs) or PCIe (``/dev/apex_0``), ``edgetpu_compiler``, an NVIDIA GPU
(``nvidia-smi``, ``/proc/driver/nvidia``), CUDA, cuda-python, TensorRT and JetPack
(``/etc/nv_tegra_release``), ONNX Runtime's providers, cameras (``/dev/video*``), picamera2,
and the Vector SDK and its configuration. Prints a table (or ``--json``) and always exits 0:
doctor reports, it does not fail. Nothing here imports TensorFlow; external programs are run
with argument lists and a timeout.
"""

from __future__ import annotations

import argparse
import configparser
import ctypes
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

OK, MISSING, WARN, INFO = "ok", "missing", "warn", "info"

EDGETPU_USB_IDS = {
    ("1a6e", "089a"): "Coral USB Accelerator (before first use: the runtime loads its firmware)",
    ("18d1", "9302"): "Coral USB Accelerator (initialised)",
}
EDGETPU_LIBRARY = "libedgetpu.so.1"
CORAL_APT = (
    "add Coral's apt repository (https://coral.ai/software/#debian-packages), then "
    "sudo apt install libedgetpu1-std (a build matching your LiteRT version)"
)


@dataclass
class Check:
    """One line of the report: what was checked, its status, what was found, and the fix."""

    group: str
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Env:
    """Where to look: the filesystem root, the home directory and PATH (tests point these at fakes)."""

    root: Path = Path("/")
    home: Path | None = None
    path: str | None = None

    def p(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    @property
    def home_dir(self) -> Path:
        return self.home if self.home is not None else Path.home()

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.path if self.path is not None else os.environ.get("PATH"))


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            continue
    return None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _run(argv: list[str], timeout: float = 10.0) -> tuple[int, str]:
    """Run a program (full path, argument list, no shell); return (exit code, stdout+stderr)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


# ------------------------------------------------------------------------------------ checks


def check_python(env: Env) -> list[Check]:
    """Python, edgekit, numpy, OpenCV and the (host-side) build tools."""
    from edgekit._version import __version__

    out = [
        Check("python", "Python", OK, f"{platform.python_version()} ({platform.machine()}, {sys.executable})"),
        Check("python", "edgekit", OK, __version__),
    ]
    np_v = _version("numpy")
    out.append(
        Check("python", "numpy", OK if np_v else MISSING, np_v or "not installed", "" if np_v else "pip install numpy")
    )
    cv_v = _version(
        "opencv-python-headless", "opencv-python", "opencv-contrib-python-headless", "opencv-contrib-python"
    )
    out.append(
        Check(
            "python",
            "OpenCV",
            OK if cv_v else MISSING,
            cv_v or "not installed",
            "" if cv_v else "pip install opencv-python-headless",
        )
    )
    tools = {
        "tensorflow": _version("tensorflow-cpu", "tensorflow"),
        "onnx": _version("onnx"),
        "tf2onnx": _version("tf2onnx"),
        "onnxconverter-common": _version("onnxconverter-common"),
    }
    have = ", ".join(f"{k} {v}" for k, v in tools.items() if v)
    lacking = [k for k, v in tools.items() if not v]
    out.append(
        Check(
            "python",
            "build tools (host side)",
            INFO if lacking else OK,
            (have or "none") + (f"; not installed: {', '.join(lacking)}" if lacking else ""),
            "only needed to run `edgekit build`: pip install 'edgekit[build]'" if lacking else "",
        )
    )
    return out


def check_litert(env: Env) -> list[Check]:
    """ai_edge_litert (the LiteRT interpreter) and the frozen tflite_runtime fallback."""
    lite = _version("ai-edge-litert") if _has_module("ai_edge_litert") else None
    out = [
        Check(
            "litert",
            "ai_edge_litert",
            OK if lite else MISSING,
            lite or "not installed",
            "" if lite else "pip install 'edgekit[litert]'",
        )
    ]
    tfl = _version("tflite-runtime") if _has_module("tflite_runtime") else None
    np_major = int((_version("numpy") or "0").split(".")[0])
    if tfl and np_major >= 2:
        out.append(
            Check(
                "litert",
                "tflite_runtime",
                WARN,
                f"{tfl} with numpy {_version('numpy')}: crashes on numpy 2",
                "pip uninstall tflite-runtime (ai_edge_litert replaces it), or pin numpy<2",
            )
        )
    elif tfl:
        out.append(Check("litert", "tflite_runtime", OK, f"{tfl} (fallback)"))
    elif lite:
        out.append(Check("litert", "tflite_runtime", INFO, "not installed; not needed (ai_edge_litert is)"))
    else:
        out.append(
            Check(
                "litert",
                "tflite_runtime",
                MISSING,
                "not installed",
                "pip install 'edgekit[litert]' (tflite_runtime only on old numpy<2 images)",
            )
        )
    return out


def check_onnxruntime(env: Env) -> list[Check]:
    """ONNX Runtime and which execution providers this build has."""
    version = _version("onnxruntime-gpu", "onnxruntime") if _has_module("onnxruntime") else None
    if not version:
        return [
            Check(
                "onnx",
                "onnxruntime",
                MISSING,
                "not installed",
                "pip install 'edgekit[onnx]' (onnxruntime-gpu on a Jetson or NVIDIA GPU)",
            )
        ]
    import onnxruntime

    providers = onnxruntime.get_available_providers()
    gpu = [p for p in providers if p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    return [
        Check("onnx", "onnxruntime", OK, f"{version}: {', '.join(providers)}"),
        Check(
            "onnx",
            "onnxruntime GPU providers",
            OK if gpu else MISSING,
            ", ".join(gpu) if gpu else "none (CPU-only build)",
            ""
            if gpu
            else "pip uninstall onnxruntime && pip install onnxruntime-gpu (on a Jetson: "
            "the JetPack wheel from NVIDIA's Jetson AI Lab index)",
        ),
    ]


def _dpkg_version(env: Env, packages: list[str]) -> str | None:
    dpkg = env.which("dpkg-query")
    if not dpkg:
        return None
    for pkg in packages:
        code, text = _run([dpkg, "-W", "-f=${Version}", pkg])
        if code == 0 and text:
            return f"{pkg} {text.splitlines()[0]}"
    return None


def _loaded_path(fragment: str) -> str | None:
    maps = _read(Path("/proc/self/maps")) or ""
    for line in maps.splitlines():
        if fragment in line and "/" in line:
            return line[line.index("/") :]
    return None


def check_edgetpu(env: Env) -> list[Check]:
    """libedgetpu, an Edge TPU on USB or PCIe, and edgetpu_compiler."""
    out = []
    try:
        ctypes.CDLL(EDGETPU_LIBRARY)
        where = _loaded_path("libedgetpu") or EDGETPU_LIBRARY
        version = _dpkg_version(env, ["libedgetpu1-std", "libedgetpu1-max"]) or "version unknown (not from dpkg)"
        out.append(Check("edgetpu", "libedgetpu", OK, f"{where}; {version}"))
    except OSError:
        out.append(Check("edgetpu", "libedgetpu", MISSING, f"{EDGETPU_LIBRARY} not found", CORAL_APT))
    found = []
    for dev in sorted(env.p("sys", "bus", "usb", "devices").glob("*")):
        ids = (_read(dev / "idVendor") or "", _read(dev / "idProduct") or "")
        if ids in EDGETPU_USB_IDS:
            speed = _read(dev / "speed") or "?"
            found.append((dev.name, ids, speed))
    if found:
        name, ids, speed = found[0]
        slow = speed not in ("5000", "10000", "20000")
        out.append(
            Check(
                "edgetpu",
                "Edge TPU (USB)",
                WARN if slow else OK,
                f"{EDGETPU_USB_IDS[ids]} {ids[0]}:{ids[1]} at {name}, {speed} Mb/s"
                + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""),
                "plug it into a USB 3 port (blue): USB 2 makes every inference slower" if slow else "",
            )
        )
    else:
        out.append(
            Check(
                "edgetpu",
                "Edge TPU (USB)",
                MISSING,
                "no device 1a6e:089a or 18d1:9302 on USB",
                "plug in the Coral USB Accelerator (lsusb shows 1a6e:089a, then 18d1:9302 once used)",
            )
        )
    apex = env.p("dev", "apex_0")
    if apex.exists():
        ok = os.access(apex, os.R_OK | os.W_OK)
        out.append(
            Check(
                "edgetpu",
                "Edge TPU (PCIe)",
                OK if ok else WARN,
                f"{apex}" + ("" if ok else ": no read/write permission"),
                "" if ok else "sudo usermod -aG apex $USER (then log in again)",
            )
        )
    else:
        out.append(
            Check(
                "edgetpu",
                "Edge TPU (PCIe)",
                MISSING,
                "no /dev/apex_0",
                "M.2/Mini PCIe Coral: sudo apt install gasket-dkms libedgetpu1-std, then reboot",
            )
        )
    compiler = env.which("edgetpu_compiler")
    if compiler:
        code, text = _run([compiler, "--version"])
        out.append(
            Check(
                "edgetpu",
                "edgetpu_compiler",
                OK if code == 0 else WARN,
                (text.splitlines() or ["?"])[0] if code == 0 else f"{compiler} fails: {text[:120]}",
            )
        )
    else:
        out.append(
            Check(
                "edgetpu",
                "edgetpu_compiler",
                MISSING,
                "not on PATH (host-side tool)",
                "x86-64 Linux only: sudo apt install edgetpu-compiler from Coral's apt repository "
                "(to build Edge TPU bundles; devices do not need it)",
            )
        )
    return out


def _nv_tegra(env: Env) -> str | None:
    text = _read(env.p("etc", "nv_tegra_release"))
    if not text:
        return None
    # "# R36 (release), REVISION: 4.3, GCID: ..., BOARD: generic, EABI: aarch64, DATE: ..."
    head = text.splitlines()[0]
    major = head.split("(")[0].replace("#", "").strip().lstrip("R")
    rev = head.split("REVISION:")[1].split(",")[0].strip() if "REVISION:" in head else "?"
    family = {"36": "JetPack 6.x", "35": "JetPack 5.x", "34": "JetPack 5.0 DP", "32": "JetPack 4.x"}.get(major, "")
    return f"L4T R{major}.{rev}" + (f" ({family})" if family else "")


def check_nvidia(env: Env) -> list[Check]:
    """JetPack/L4T, the NVIDIA GPU, CUDA, cuda-python and TensorRT."""
    out = []
    tegra = _nv_tegra(env)
    out.append(
        Check(
            "jetson",
            "JetPack / L4T",
            OK if tegra else MISSING,
            tegra or "no /etc/nv_tegra_release (not a Jetson)",
            "" if tegra else "only on an NVIDIA Jetson: flash JetPack 6 (SDK Manager or the SD card image)",
        )
    )
    smi = env.which("nvidia-smi")
    gpu_detail = None
    if smi:
        code, text = _run([smi, "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"])
        if code == 0 and text:
            gpu_detail = "; ".join(line.strip() for line in text.splitlines())
    if gpu_detail is None:
        version = _read(env.p("proc", "driver", "nvidia", "version"))
        models = []
        for info in sorted(env.p("proc", "driver", "nvidia", "gpus").glob("*/information")):
            for line in (_read(info) or "").splitlines():
                if line.startswith("Model:"):
                    models.append(line.split(":", 1)[1].strip())
        if version or models:
            gpu_detail = ", ".join(models) or "NVIDIA driver loaded"
            if version:
                gpu_detail += f" ({version.splitlines()[0][:80]})"
    if gpu_detail is None and tegra:
        gpu_detail = "integrated Jetson GPU"
    out.append(
        Check(
            "jetson",
            "NVIDIA GPU",
            OK if gpu_detail else MISSING,
            gpu_detail or "none found",
            ""
            if gpu_detail
            else "the jetson target needs a Jetson or an NVIDIA GPU with its driver (nvidia-smi must list it)",
        )
    )
    cuda = None
    version_json = env.p("usr", "local", "cuda", "version.json")
    if version_json.is_file():
        try:
            cuda = "CUDA " + json.loads(version_json.read_text())["cuda"]["version"]
        except (ValueError, KeyError, TypeError):
            cuda = "CUDA (version.json unreadable)"
    out.append(
        Check(
            "jetson",
            "CUDA toolkit",
            OK if cuda else MISSING,
            cuda or "no /usr/local/cuda",
            ""
            if cuda
            else "comes with JetPack (sudo apt install nvidia-jetpack); on x86 install the NVIDIA driver and CUDA 12",
        )
    )
    cp = None
    if _has_module("cuda.bindings") or _has_module("cuda.cudart"):
        binding = "cuda.bindings.runtime" if _has_module("cuda.bindings") else "cuda.cudart"
        cp = f"{_version('cuda-python', 'cuda-bindings') or '?'} ({binding})"
    out.append(
        Check(
            "jetson",
            "cuda-python",
            OK if cp else MISSING,
            cp or "not installed",
            "" if cp else "pip install 'cuda-python<13' (match your CUDA major version)",
        )
    )
    trt = None
    if _has_module("tensorrt"):
        trt = _version("tensorrt", "tensorrt-cu12", "tensorrt_libs")
        if trt is None:
            try:
                import tensorrt

                trt = str(tensorrt.__version__)
            except Exception as exc:  # a broken install must not break the report
                trt = f"present but not importable: {str(exc)[:80]}"
    if trt:
        major = trt.split(".")[0]
        trt += " (strongly typed builds only)" if major.isdigit() and int(major) >= 11 else " (FP16 builder flag)"
    out.append(
        Check(
            "jetson",
            "TensorRT",
            OK if trt else MISSING,
            trt or "tensorrt Python bindings not installed",
            ""
            if trt
            else "sudo apt install nvidia-jetpack (brings python3-libnvinfer; with a venv use "
            "--system-site-packages); not installable from PyPI on a Jetson",
        )
    )
    return out


def check_cameras(env: Env) -> list[Check]:
    """V4L2 camera devices and picamera2."""
    out = []
    devices = sorted(env.p("dev").glob("video*"), key=lambda p: (len(p.name), p.name))
    if devices:
        names = []
        unreadable = []
        for d in devices:
            label = _read(env.p("sys", "class", "video4linux", d.name, "name"))
            names.append(f"{d.name}" + (f" ({label})" if label else ""))
            if not os.access(d, os.R_OK | os.W_OK):
                unreadable.append(d.name)
        out.append(
            Check(
                "camera",
                "cameras (V4L2)",
                WARN if unreadable else OK,
                ", ".join(names),
                f"sudo usermod -aG video $USER (no access to {', '.join(unreadable)})" if unreadable else "",
            )
        )
    else:
        out.append(
            Check(
                "camera",
                "cameras (V4L2)",
                MISSING,
                "no /dev/video* devices",
                "connect a USB camera (it appears as /dev/video0); or use --camera file:VIDEO / folder:DIR",
            )
        )
    pc = _has_module("picamera2")
    out.append(
        Check(
            "camera",
            "picamera2",
            OK if pc else MISSING,
            (_version("picamera2") or "installed") if pc else "not importable",
            ""
            if pc
            else "Raspberry Pi OS only: sudo apt install python3-picamera2 (with a venv, create "
            "it with --system-site-packages)",
        )
    )
    return out


def check_vector(env: Env) -> list[Check]:
    """The Vector SDK (wirepod_vector_sdk) and ~/.anki_vector/sdk_config.ini (secrets are never printed)."""
    out = []
    sdk = _version("wirepod_vector_sdk", "wirepod-vector-sdk") if _has_module("anki_vector") else None
    out.append(
        Check(
            "vector",
            "Vector SDK",
            OK if sdk else MISSING,
            f"wirepod_vector_sdk {sdk}" if sdk else "anki_vector not installed",
            "" if sdk else "pip install 'edgekit[vector]'",
        )
    )
    ini = env.home_dir / ".anki_vector" / "sdk_config.ini"
    configure = "python -m anki_vector.configure (asks for the wire-pod address and the robot's name, IP and serial)"
    if not ini.is_file():
        out.append(Check("vector", "Vector configuration", MISSING, "no ~/.anki_vector/sdk_config.ini", configure))
        return out
    parser = configparser.ConfigParser()
    try:
        parser.read(ini)
    except configparser.Error as exc:
        out.append(Check("vector", "Vector configuration", WARN, f"unreadable: {str(exc).splitlines()[0]}", configure))
        return out
    robots, problems = [], []
    for serial in parser.sections():
        sec = parser[serial]
        lacking = [k for k in ("cert", "ip", "name", "guid") if not sec.get(k)]
        cert = sec.get("cert")
        if cert and not Path(cert).is_file():  # the SDK opens the path as written (no ~ expansion)
            lacking.append(f"cert file {cert}")
        robots.append(f"{sec.get('name', '?')} (serial {serial}, {sec.get('ip', '?')})")
        if lacking:
            problems.append(f"{serial} lacks {', '.join(lacking)}")
    if not robots:
        out.append(Check("vector", "Vector configuration", MISSING, f"{ini} lists no robot", configure))
    else:
        out.append(
            Check(
                "vector",
                "Vector configuration",
                WARN if problems else OK,
                "; ".join(robots) + (f"; {'; '.join(problems)}" if problems else ""),
                configure if problems else "",
            )
        )
    return out


CHECKS: list[Callable[[Env], list[Check]]] = [
    check_python,
    check_litert,
    check_onnxruntime,
    check_edgetpu,
    check_nvidia,
    check_cameras,
    check_vector,
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


def format_table(checks: list[Check]) -> str:
    """A fixed-width table, then each problem with its fix, then the targets that can run here."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'group':8} {'check'.ljust(width)}  {'status':8} detail"]
    for c in checks:
        lines.append(f"{c.group:8} {c.name.ljust(width)}  {c.status.upper() if c.status != OK else 'ok':8} {c.detail}")
    fixes = [c for c in checks if c.fix and c.status in (MISSING, WARN)]
    if fixes:
        lines += ["", "to fix:"]
        lines += [f"  {c.name}: {c.fix}" for c in fixes]
    lines.append("")
    for target, t in targets_summary(checks).items():
        lines.append(
            f"target {target:8} "
            + ("can run here" if t["can_run"] else "cannot run here: needs " + "; ".join(t["missing"]))
        )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``doctor`` arguments."""
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def main(args: argparse.Namespace) -> int:
    """Print the report; always 0 (a missing piece is information, not an error)."""
    checks = run_checks()
    if getattr(args, "json", False):
        print(json.dumps(report(checks), indent=2))
    else:
        print(format_table(checks))
    return 0
