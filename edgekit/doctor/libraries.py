"""Doctor checks of Python and its libraries: numpy, OpenCV, the build tools, LiteRT and ONNX Runtime."""

from __future__ import annotations

import platform
import sys

from edgekit.doctor.base import INFO, MISSING, OK, WARN, Check, Env, dist_version, has_module


def check_python(env: Env) -> list[Check]:
    """Python, edgekit, numpy, OpenCV and the (host-side) build tools."""
    from edgekit._version import __version__

    out = [
        Check("python", "Python", OK, f"{platform.python_version()} ({platform.machine()}, {sys.executable})"),
        Check("python", "edgekit", OK, __version__),
    ]
    np_v = dist_version("numpy")
    out.append(
        Check("python", "numpy", OK if np_v else MISSING, np_v or "not installed", "" if np_v else "pip install numpy")
    )
    cv_v = dist_version(
        "opencv-python-headless", "opencv-python", "opencv-contrib-python-headless", "opencv-contrib-python"
    )
    # OpenCV and Pillow are extras: a device reading picamera2 or synthetic frames needs neither.
    out.append(Check("python", "OpenCV", OK if cv_v else INFO, cv_v or "not installed; optional, for v4l2:, "
                     "rtsp:// and file: video input: pip install 'edgekit-vision[opencv]'"))
    pil_v = dist_version("pillow", "Pillow")
    out.append(Check("python", "Pillow", OK if pil_v or cv_v else INFO,
                     pil_v or ("not installed (OpenCV reads images)" if cv_v else
                               "not installed; optional, for folder: input: pip install 'edgekit-vision[images]'")))
    tools = {
        "tensorflow": dist_version("tensorflow-cpu", "tensorflow"),
        "onnx": dist_version("onnx"),
        "tf2onnx": dist_version("tf2onnx"),
        "onnxconverter-common": dist_version("onnxconverter-common"),
    }
    have = ", ".join(f"{k} {v}" for k, v in tools.items() if v)
    lacking = [k for k, v in tools.items() if not v]
    out.append(
        Check(
            "python",
            "build tools (host side)",
            INFO if lacking else OK,
            (have or "none") + (f"; not installed: {', '.join(lacking)}" if lacking else ""),
            "only needed to run `edgekit build`: pip install 'edgekit-vision[build]'" if lacking else "",
        )
    )
    return out


def check_litert(env: Env) -> list[Check]:
    """ai_edge_litert (the LiteRT interpreter) and the frozen tflite_runtime fallback."""
    lite = dist_version("ai-edge-litert") if has_module("ai_edge_litert") else None
    out = [
        Check(
            "litert",
            "ai_edge_litert",
            OK if lite else MISSING,
            lite or "not installed",
            "" if lite else "pip install 'edgekit-vision[litert]'",
        )
    ]
    tfl = dist_version("tflite-runtime") if has_module("tflite_runtime") else None
    np_major = int((dist_version("numpy") or "0").split(".")[0])
    if tfl and np_major >= 2:
        out.append(
            Check(
                "litert",
                "tflite_runtime",
                WARN,
                f"{tfl} with numpy {dist_version('numpy')}: crashes on numpy 2",
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
                "pip install 'edgekit-vision[litert]' (tflite_runtime only on old numpy<2 images)",
            )
        )
    return out


def check_onnxruntime(env: Env) -> list[Check]:
    """ONNX Runtime and which execution providers this build has."""
    version = dist_version("onnxruntime-gpu", "onnxruntime") if has_module("onnxruntime") else None
    if not version:
        return [
            Check(
                "onnx",
                "onnxruntime",
                MISSING,
                "not installed",
                "pip install 'edgekit-vision[onnx]' (onnxruntime-gpu on a Jetson or NVIDIA GPU)",
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
