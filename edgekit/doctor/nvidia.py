"""Doctor checks of NVIDIA hardware and software: JetPack/L4T (``/etc/nv_tegra_release``), the GPU
(``nvidia-smi``, ``/proc/driver/nvidia``), the CUDA toolkit, cuda-python and TensorRT."""

from __future__ import annotations

import json

from edgekit.doctor.base import MISSING, OK, Check, Env, dist_version, has_module, read_text, run_program


def _nv_tegra(env: Env) -> str | None:
    text = read_text(env.p("etc", "nv_tegra_release"))
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
    tegra = _nv_tegra(env)
    jetpack = Check(
        "jetson",
        "JetPack / L4T",
        OK if tegra else MISSING,
        tegra or "no /etc/nv_tegra_release (not a Jetson)",
        "" if tegra else "only on an NVIDIA Jetson: flash JetPack 6 (SDK Manager or the SD card image)",
    )
    gpu = _gpu_detail(env) or ("integrated Jetson GPU" if tegra else None)
    gpu_check = Check(
        "jetson",
        "NVIDIA GPU",
        OK if gpu else MISSING,
        gpu or "none found",
        "" if gpu else "the jetson target needs a Jetson or an NVIDIA GPU with its driver (nvidia-smi must list it)",
    )
    return [jetpack, gpu_check, _cuda(env), _cuda_python(), _tensorrt()]


def _gpu_detail(env: Env) -> str | None:
    """What nvidia-smi says, else what the driver's /proc files say, else None."""
    smi = env.which("nvidia-smi")
    if smi:
        query = "--query-gpu=name,driver_version,memory.total,compute_cap"
        code, text = run_program([smi, query, "--format=csv,noheader"])
        if code == 0 and text:
            return "; ".join(line.strip() for line in text.splitlines())
    version = read_text(env.p("proc", "driver", "nvidia", "version"))
    models = []
    for info in sorted(env.p("proc", "driver", "nvidia", "gpus").glob("*/information")):
        for line in (read_text(info) or "").splitlines():
            if line.startswith("Model:"):
                models.append(line.split(":", 1)[1].strip())
    if not (version or models):
        return None
    detail = ", ".join(models) or "NVIDIA driver loaded"
    return detail + (f" ({version.splitlines()[0][:80]})" if version else "")


def _cuda(env: Env) -> Check:
    cuda = None
    version_json = env.p("usr", "local", "cuda", "version.json")
    if version_json.is_file():
        try:
            cuda = "CUDA " + json.loads(version_json.read_text())["cuda"]["version"]
        except (ValueError, KeyError, TypeError):
            cuda = "CUDA (version.json unreadable)"
    return Check(
        "jetson",
        "CUDA toolkit",
        OK if cuda else MISSING,
        cuda or "no /usr/local/cuda",
        ""
        if cuda
        else "comes with JetPack (sudo apt install nvidia-jetpack); on x86 install the NVIDIA driver and CUDA 12",
    )


def _cuda_python() -> Check:
    cp = None
    if has_module("cuda.bindings") or has_module("cuda.cudart"):
        binding = "cuda.bindings.runtime" if has_module("cuda.bindings") else "cuda.cudart"
        cp = f"{dist_version('cuda-python', 'cuda-bindings') or '?'} ({binding})"
    return Check(
        "jetson",
        "cuda-python",
        OK if cp else MISSING,
        cp or "not installed",
        "" if cp else "pip install 'cuda-python<13' (match your CUDA major version)",
    )


def _tensorrt() -> Check:
    trt = None
    if has_module("tensorrt"):
        trt = dist_version("tensorrt", "tensorrt-cu12", "tensorrt_libs")
        if trt is None:
            try:
                import tensorrt

                trt = str(tensorrt.__version__)
            except Exception as exc:  # a broken install must not break the report
                trt = f"present but not importable: {str(exc)[:80]}"
    if trt:
        major = trt.split(".")[0]
        trt += " (strongly typed builds only)" if major.isdigit() and int(major) >= 11 else " (FP16 builder flag)"
    return Check(
        "jetson",
        "TensorRT",
        OK if trt else MISSING,
        trt or "tensorrt Python bindings not installed",
        ""
        if trt
        else "sudo apt install nvidia-jetpack (brings python3-libnvinfer; with a venv use "
        "--system-site-packages); not installable from PyPI on a Jetson",
    )
