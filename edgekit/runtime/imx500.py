"""Raspberry Pi AI Camera (Sony IMX500): the network runs in the sensor, the outputs come in each frame's metadata.

picamera2's ``IMX500`` class (``picamera2.devices.IMX500``, on Raspberry Pi OS) uploads the
network (the ``.rpk`` that ``imx500-package`` makes from the bundle's ``packerOut.zip``) to the
sensor; it must exist before the ``Picamera2`` of its camera (``IMX500(rpk)``, then
``Picamera2(imx500.camera_num)``). Every frame the camera delivers then carries the network's
output tensors in its metadata; ``imx500.get_outputs(metadata, add_batch=True)`` returns them as
float32 arrays (reshaped in Fortran order from ``CnnOutputTensor``), or None while the network
is still being uploaded (which takes minutes the first time).

The sensor runs the network on its own image, not on a tensor the host hands it: ``infer``
therefore takes the newest frame's outputs (``capture_metadata``) and uses its argument for its
shape only. The bundle's preprocessing (crop, size, colour) is what the network was built with;
on the sensor the ISP's inference image stands in for it (``set_auto_aspect_ratio`` keeps the
model's aspect ratio). picamera2 is imported only when this adapter is opened.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgekit.errors import BackendUnavailable, DeviceError, ModelError
from edgekit.imaging.image import InputSpec
from edgekit.util.optionspec import Option, defaults

INSTALL_HINT = (
    "picamera2 with its IMX500 support comes with Raspberry Pi OS (sudo apt install imx500-all "
    "python3-picamera2); create the virtualenv with --system-site-packages"
)
PACKAGE_FIX = "on the Pi: imx500-package -i packerOut.zip -o BUNDLE/ (sudo apt install imx500-tools), then run again"
RPK = "network.rpk"
"""What ``imx500-package -o DIR`` writes into ``DIR``: the network the sensor loads."""


def find_rpk(model_path: Path) -> Path:
    """The ``.rpk`` for ``model_path``: itself, or ``network.rpk`` beside the bundle's ``packerOut.zip``
    (or in a folder beside it); ModelError with the packaging command otherwise."""
    if model_path.suffix == ".rpk":
        if model_path.is_file():
            return model_path
        raise ModelError(f"model {model_path} does not exist")
    folder = model_path.parent
    found = sorted([*folder.glob("*.rpk"), *folder.glob(f"*/{RPK}")])
    if not found:
        raise ModelError(
            f"{folder} has no .rpk: the IMX500 loads a packaged network, not {model_path.name}", PACKAGE_FIX
        )
    return found[0]


class Imx500Runtime:
    """The IMX500's outputs for the newest camera frame, through picamera2.

    Args:
        model_path: the bundle's ``packerOut.zip`` (its ``network.rpk`` must be beside it) or a ``.rpk``.
        input_spec: the bundle's input (its shape is the network's; a bare ``.rpk`` is taken as it is).
        frame_rate: the camera's frame rate (0: picamera2's network intrinsics, else 30).
        timeout_s: how long the first outputs may take (the network's upload to the sensor).

    ``infer`` returns float32 arrays the caller owns, each with a batch axis of 1. Not
    thread-safe: one call at a time, as the pipeline makes them.
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("frame_rate", "float", 0.0, "camera frame rate (0: the network's inference rate)", ge=0, le=120),
        Option("timeout_s", "float", 300.0, "seconds the first outputs may take (network upload)", gt=0, le=3600),
    )
    _DEFAULT = defaults(OPTIONS)

    def __init__(
        self,
        model_path: str | Path,
        input_spec: InputSpec | None = None,
        frame_rate: float = _DEFAULT["frame_rate"],
        timeout_s: float = _DEFAULT["timeout_s"],
    ):
        self.model_path = Path(model_path)
        self.rpk = find_rpk(self.model_path)
        self.input_spec, self.timeout_s = input_spec, float(timeout_s)
        try:
            from picamera2 import Picamera2
            from picamera2.devices import IMX500
        except ImportError as exc:
            raise BackendUnavailable(
                "picamera2 (with picamera2.devices.IMX500) is not installed", INSTALL_HINT
            ) from exc
        t0 = time.perf_counter_ns()
        self._cam = None
        try:
            self._imx500 = IMX500(str(self.rpk))  # uploads the network: before the camera is opened
        except Exception as exc:  # picamera2 raises RuntimeError when no IMX500 is attached
            raise DeviceError(
                f"IMX500: cannot load {self.rpk.name} ({type(exc).__name__}: {exc})",
                "is the AI Camera connected? try `rpicam-hello --list-cameras`",
            ) from exc
        self._cam = Picamera2(self._imx500.camera_num)
        self._start(float(frame_rate))
        self._outputs = [list(o.shape) for o in self._wait_outputs(self.timeout_s)]
        self.init_ms = (time.perf_counter_ns() - t0) / 1e6

    def _start(self, frame_rate: float) -> None:
        """Configure and start the camera at ``frame_rate`` (0: the network intrinsics' rate, else 30 fps)."""
        intrinsics = getattr(self._imx500, "network_intrinsics", None)
        rate = frame_rate or float(getattr(intrinsics, "inference_rate", 0) or 30.0)
        try:
            config = self._cam.create_preview_configuration(controls={"FrameRate": rate}, buffer_count=12)
            self._imx500.show_network_fw_progress_bar()
            self._cam.start(config)
            if getattr(intrinsics, "preserve_aspect_ratio", False):
                self._imx500.set_auto_aspect_ratio()
        except Exception as exc:
            self.close()
            raise DeviceError(
                f"IMX500: cannot start the camera ({type(exc).__name__}: {exc})",
                "close other programs using the camera; try frame_rate=15",
            ) from exc

    def _wait_outputs(self, timeout_s: float) -> list[np.ndarray]:
        """The next frame's outputs; DeviceError when ``timeout_s`` passes without any."""
        deadline = time.monotonic() + timeout_s
        while True:
            metadata = self._cam.capture_metadata()
            outputs = self._imx500.get_outputs(metadata, add_batch=True)
            if outputs is not None:
                return [np.array(o, dtype=np.float32, copy=True) for o in outputs]
            if time.monotonic() > deadline:
                raise DeviceError(
                    f"IMX500: no network outputs in {timeout_s:.0f} s of frames from {self.rpk.name}",
                    "check the upload (dmesg | grep imx500); repackage packerOut.zip on this Pi",
                )

    def output_details(self) -> list[dict[str, Any]]:
        """Each output's ``name`` and ``shape`` (batch axis first), as the first frame gave them."""
        return [{"name": f"output{i}", "shape": shape} for i, shape in enumerate(self._outputs)]

    def infer(self, tensor: np.ndarray) -> list[np.ndarray]:
        """The newest frame's outputs (the sensor ran the network on that frame, not on ``tensor``)."""
        if self.input_spec is not None and tuple(np.shape(tensor)) != tuple(self.input_spec.shape):
            raise ModelError(f"IMX500 input {list(np.shape(tensor))} is not the bundle's {self.input_spec.shape}")
        return self._wait_outputs(max(5.0, self.timeout_s / 10))

    def describe(self) -> dict[str, Any]:
        """The backend, the network file and where it runs."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            lib = version("picamera2")
        except PackageNotFoundError:
            lib = "?"
        return {
            "backend": "imx500",
            "version": lib,
            "network": self.rpk.name,
            "init_ms": self.init_ms,
            "device": "Sony IMX500 (in the sensor)",
        }

    def close(self) -> None:
        """Stop and close the camera (idempotent)."""
        cam, self._cam = getattr(self, "_cam", None), None
        if cam is not None:
            try:
                cam.stop()
            finally:
                cam.close()

    def __enter__(self) -> Imx500Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
