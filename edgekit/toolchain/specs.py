"""The vendor toolchains edgekit can install: one row per stack, each pinned.

A vendor's converter cannot share edgekit's environment: Rockchip's ``rknn-toolkit2`` pins
``numpy<=1.26.4`` and ``torch<=2.4.0``, Sony's IMX500 stack pins numpy 1.26, onnx 1.17 and its
own quantizer packages while edgekit builds with TensorFlow 2.21 and numpy 2. Each stack therefore gets a virtual
environment of its own under the user's cache (:mod:`edgekit.toolchain.store`), and the build
runs the vendor's steps in that environment's interpreter as child processes
(:mod:`edgekit.toolchain.child`), never importing a vendor package into edgekit's process.

The pins are the versions checked together on x86-64 Linux with Python 3.11 (the wheels
``rknn-toolkit2`` 2.5.0 publishes are cp311 only among the Pythons edgekit supports here).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolchainSpec:
    """One installable vendor stack.

    ``requirements`` are pip requirement strings installed together into a fresh venv;
    ``probe`` is the module the installed environment must import (checked after the install);
    ``python`` the ``major.minor`` the vendor's wheels are built for; ``needs_java`` whether a
    step runs Java (Sony's converter does); ``versions`` the distributions whose versions the
    record keeps (what ``edgekit toolchain list`` shows); ``note`` what the user should know;
    ``no_deps`` requirements installed after the others without their dependencies.
    """

    name: str
    summary: str
    requirements: tuple[str, ...]
    probe: str
    versions: tuple[str, ...]
    python: str = "3.11"
    needs_java: int = 0
    note: str = ""
    no_deps: tuple[str, ...] = ()


RK3588 = ToolchainSpec(
    name="rk3588",
    summary="Rockchip RKNN-Toolkit2: ONNX -> quantised .rknn, the host simulator and accuracy_analysis",
    requirements=(
        "rknn-toolkit2==2.5.0",
        # rknn-toolkit2 imports torch even for ONNX and pins torch<=2.4.0; PyPI serves 2.4.0 for
        # Linux x86-64 only as the CUDA build (nvidia-* wheels, ~5 GB installed): no CPU-only wheel
        "torch==2.4.0",
        "numpy==1.26.4",
        "onnx==1.17.0",
        "onnxruntime==1.20.1",
        "protobuf==4.25.4",
    ),
    probe="rknn.api",
    versions=("rknn-toolkit2", "torch", "numpy", "onnx", "onnxruntime"),
    note="PyPI's torch 2.4.0 is the CUDA build: the environment is about 5-6 GB",
)

IMX500 = ToolchainSpec(
    name="imx500",
    summary="Sony IMX500 (Raspberry Pi AI Camera): MCT PyTorch PTQ + imxconv-pt -> packerOut.zip",
    requirements=(
        # the PyTorch flavour: the ONNX edgekit writes becomes a torch module (onnx2torch); the
        # TensorFlow flavour needs Keras 2, which does not load edgekit's Keras 3 models. MCT 2.6 and
        # the converter 3.19 pin different mct-quantizers (1.7 vs 1.6): 2.5.1 fits both
        "model-compression-toolkit==2.5.1",
        "imx500-converter[pt]==3.19.2",
        # a CPU build (a local wheel here; elsewhere pip takes PyPI's, the CUDA one, several GB)
        "torch==2.13.0",
        "numpy==1.26.4",
    ),
    # onnx2torch requires torchvision, whose PyPI Linux wheels are CUDA builds that do not load
    # against a CPU torch: installed without it (the job stands in for the few names imported)
    no_deps=("onnx2torch==1.5.15",),
    # MCT itself imports torchvision, for which the job stands in: the probe takes what it builds on
    probe="mct_quantizers",
    versions=("model-compression-toolkit", "imx500-converter", "mct-quantizers", "torch", "onnx2torch", "numpy"),
    needs_java=17,
    note="imxconv-pt runs Java: openjdk 17 (Debian: apt-get install openjdk-17-jre-headless)",
)

TOOLCHAINS: dict[str, ToolchainSpec] = {t.name: t for t in (RK3588, IMX500)}
"""Every toolchain ``edgekit toolchain install`` knows, by name."""


def get_spec(name: str) -> ToolchainSpec:
    """The spec called ``name``; UsageError naming the known ones otherwise."""
    from edgekit.errors import UsageError

    if name not in TOOLCHAINS:
        raise UsageError(f"unknown toolchain {name!r}", f"choose one of: {', '.join(TOOLCHAINS)}")
    return TOOLCHAINS[name]
