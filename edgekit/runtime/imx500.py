"""Raspberry Pi AI Camera (Sony IMX500): the network runs in the sensor, the outputs come in each frame's metadata.

picamera2's ``IMX500`` class (``picamera2.devices.IMX500``, on Raspberry Pi OS) uploads the
network (the ``.rpk`` that ``imx500-package`` makes from the bundle's ``packerOut.zip``) to the
sensor; it must exist before the ``Picamera2`` of its camera (``IMX500(rpk)``, then
``Picamera2(imx500.camera_num)``). Every frame the camera delivers then carries the network's
output tensors in its metadata; ``imx500.get_outputs(metadata, add_batch=True)`` returns them as
float32 arrays (reshaped in Fortran order from ``CnnOutputTensor``), or None while the network
is still being uploaded (which takes minutes the first time).

The sensor runs the network on its own image, not on a tensor the host hands it, so the frames
a run shows must be the sensor's too: the ``imx500`` camera source (:mod:`edgekit.camera.imx500`)
reads this runtime's ``Picamera2``, one completed request at a time, and hands each frame with
its metadata; the pipeline passes that metadata to ``infer(tensor, metadata=...)``
(:attr:`Imx500Runtime.reads_frame_metadata`), which returns the outputs of that very frame. With
any other camera, ``infer(tensor)`` takes the sensor's newest frame's outputs
(``capture_metadata``), which belong to no frame the run shows: said once, as a warning.

Where the network's input lies in the frame: the sensor scales its inference window (the whole
sensor, or a centred crop to the input's aspect with ``set_auto_aspect_ratio``) to the input
size. picamera2's ``convert_inference_coords((0, 0, 1, 1), metadata, picam2)`` gives that
window in the main stream's pixels; the runtime's ``input_spec`` then says it as a crop and a
stretch, and every head maps its boxes, points and masks to the frame through it. picamera2 is
imported only when this adapter is opened.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
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
log = logging.getLogger(__name__)
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
    """The IMX500's outputs for a camera frame, through picamera2.

    Args:
        model_path: the bundle's ``packerOut.zip`` (its ``network.rpk`` must be beside it) or a ``.rpk``.
        input_spec: the bundle's input (its shape is the network's; a bare ``.rpk`` is taken as it is).
        frame_rate: the camera's frame rate (0: picamera2's network intrinsics, else 30).
        timeout_s: how long the first outputs may take (the network's upload to the sensor).

    ``infer`` returns float32 arrays the caller owns, each with a batch axis of 1. ``input_spec``
    is the bundle's with the sensor's own crop (see the module). Not thread-safe: one call at a
    time, as the pipeline makes them.
    """

    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("frame_rate", "float", 0.0, "camera frame rate (0: the network's inference rate)", ge=0, le=120),
        Option("timeout_s", "float", 300.0, "seconds the first outputs may take (network upload)", gt=0, le=3600),
    )
    _DEFAULT = defaults(OPTIONS)
    SAY_WAITING_AFTER_S = 3.0
    """Frames without outputs for this long (the upload) are said, once per wait."""
    reads_frame_metadata = True
    """The pipeline passes each frame's ``metadata`` to :meth:`infer` (the outputs ride on the frame)."""

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
        self._source: Any = None  # the camera source reading this camera (attach)
        self._warned = False
        self._axes: dict[int, tuple[int, ...]] = {}  # conform_outputs: output -> the reorder back to the bundle's
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
        self.frame_rate = self._start(float(frame_rate))
        try:
            metadata, outputs = self._wait_outputs(self.timeout_s)
        except BaseException:
            self.close()  # the camera is free again for the next try
            raise
        self._outputs = [list(o.shape) for o in outputs]
        self.window = self._sensor_window(metadata)
        self.init_ms = (time.perf_counter_ns() - t0) / 1e6

    def _start(self, frame_rate: float) -> float:
        """Configure and start the camera at ``frame_rate`` (0: the network intrinsics' rate, else 30 fps),
        as picamera2's examples/imx500 demos do; returns the rate asked for."""
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
        return rate

    def _wait_outputs(self, timeout_s: float) -> tuple[dict, list[np.ndarray]]:
        """The next frame with outputs: its metadata and outputs; DeviceError when ``timeout_s`` passes without.
        A wait longer than :attr:`SAY_WAITING_AFTER_S` is said once (an upload without picamera2's
        progress bar, which needs the debugfs files, would otherwise be minutes of silence)."""
        start = time.monotonic()
        deadline, said = start + timeout_s, False
        while True:
            metadata = self._cam.capture_metadata()
            outputs = self.network_outputs(metadata)
            if outputs is not None:
                return metadata, outputs
            if not said and time.monotonic() - start >= self.SAY_WAITING_AFTER_S:
                said = True
                log.warning("IMX500: no network outputs yet: %s is still uploading to the sensor (the first "
                            "time takes minutes); waiting up to %.0f s", self.rpk.name, timeout_s)
            if time.monotonic() > deadline:
                raise DeviceError(
                    f"IMX500: no network outputs in {timeout_s:.0f} s of frames from {self.rpk.name}",
                    "check the upload (dmesg | grep imx500); repackage packerOut.zip on this Pi",
                )

    def _sensor_window(self, metadata: Mapping[str, Any]) -> tuple[int, int, int, int] | None:
        """Where the network's input lies in the main stream, ``(x, y, w, h)`` pixels, and ``input_spec``
        made to say it (a centred crop of that aspect, stretched to the input: what the sensor does).

        picamera2's ``convert_inference_coords`` (picamera2/devices/imx500/imx500.py) maps a box of the
        inference image through the sensor's ROI, ``ScalerCrop`` and the ISP output size; the whole
        input, ``(0, 0, 1, 1)``, gives the window. Its per-box use is not taken: it scales a box by the
        full sensor's size before bounding it to the ROI, exact only while the ROI is the whole sensor,
        and edgekit's heads map points and masks too, through one map.
        """
        try:
            x, y, w, h = (int(v) for v in self._imx500.convert_inference_coords((0, 0, 1, 1), metadata, self._cam))
            fw, fh = (int(v) for v in self._cam.camera_configuration()["main"]["size"])
        except Exception as exc:  # an older picamera2, or no ScalerCrop in the metadata
            log.warning("IMX500: where the network's input lies in the frame is unknown (%s: %s); boxes are "
                        "mapped with the bundle's preprocessing", type(exc).__name__, exc)
            return None
        if w <= 0 or h <= 0:
            return None
        if abs(2 * x + w - fw) > 2 or abs(2 * y + h - fh) > 2:
            log.warning("IMX500: the network sees %dx%d at (%d, %d) of the %dx%d frame, not its centre: boxes "
                        "drawn on the frame are off by the difference", w, h, x, y, fw, fh)
        if self.input_spec is not None:
            g = math.gcd(w, h)
            crop = None if abs(w - fw) <= 2 and abs(h - fh) <= 2 else f"{h // g}:{w // g}"
            self.input_spec = replace(self.input_spec, crop=crop, resize="stretch")
        return x, y, w, h

    @property
    def camera(self) -> Any:
        """The started ``Picamera2`` (None once closed): the ``imx500`` camera source reads it."""
        return self._cam

    @property
    def shared_with(self) -> str | None:
        """The name of the camera source reading this camera (None when none does)."""
        return None if self._source is None else str(getattr(self._source, "name", self._source))

    def attach(self, source: Any) -> None:
        """``source`` reads this camera from now on: :meth:`infer` then needs its frames' metadata,
        never capturing a frame of its own (it would take one of the source's)."""
        self._source = source

    def detach(self, source: Any) -> None:
        """``source`` has closed (a late call from a source already replaced changes nothing)."""
        if self._source is source:
            self._source = None

    def has_outputs(self, metadata: Mapping[str, Any]) -> bool:
        """Whether a frame's metadata carries the network's outputs (it does not while the network
        uploads): picamera2's ``get_outputs`` returns None without ``CnnOutputTensor``."""
        return bool(metadata.get("CnnOutputTensor"))

    def network_outputs(self, metadata: Mapping[str, Any]) -> list[np.ndarray] | None:
        """The outputs a frame's metadata carries, float32 copies with a batch axis; None before the upload ends."""
        outputs = self._imx500.get_outputs(metadata, add_batch=True)
        if outputs is None:
            return None
        return [np.array(np.transpose(o, self._axes[i]) if i in self._axes else o, dtype=np.float32, copy=True)
                for i, o in enumerate(outputs)]

    def conform_outputs(self, expected: Sequence[Sequence[int] | None]) -> None:
        """Hold the sensor's outputs to the shapes the bundle recorded (batch axis first), so a network
        and bundle that do not belong together, or a sensor that lays a tensor out otherwise, stop here
        instead of decoding as nonsense. An output whose non-batch axes come reversed (a C-ordered
        tensor read through picamera2's Fortran-order reshape) is transposed back; any other mismatch is
        a ModelError naming both shapes. ``None`` for an output (or no record at all): whatever the sensor gives."""
        if not expected:
            return  # a bundle that records no outputs: nothing to hold them to
        if len(expected) != len(self._outputs):
            raise ModelError(f"IMX500: {self.rpk.name} gives {len(self._outputs)} outputs; the bundle records "
                             f"{len(expected)}", PACKAGE_FIX)
        for i, (got, want) in enumerate(zip(self._outputs, expected)):
            if want is None or list(got) == list(want):
                continue
            if [got[0], *got[:0:-1]] == list(want):
                self._axes[i], self._outputs[i] = (0, *range(len(got) - 1, 0, -1)), list(want)
                log.info("IMX500: output %d comes as %s; reordered to the bundle's %s", i, got, list(want))
                continue
            raise ModelError(f"IMX500: output {i} of {self.rpk.name} is {got}, the bundle's is {list(want)}: "
                             "the network is not this bundle's", PACKAGE_FIX)

    def output_details(self) -> list[dict[str, Any]]:
        """Each output's ``name`` and ``shape`` (batch axis first), as the first frame gave them."""
        return [{"name": f"output{i}", "shape": shape} for i, shape in enumerate(self._outputs)]

    def infer(self, tensor: np.ndarray, metadata: Mapping[str, Any] | None = None) -> list[np.ndarray]:
        """The outputs of the frame whose ``metadata`` is given (the sensor ran the network on that frame,
        not on ``tensor``, which is checked for its shape only); without ``metadata``, the newest frame's.

        Raises DeviceError when the metadata carries no outputs, or when a camera source reads this
        camera and no metadata is given.
        """
        if self.input_spec is not None and tuple(np.shape(tensor)) != tuple(self.input_spec.shape):
            raise ModelError(f"IMX500 input {list(np.shape(tensor))} is not the bundle's {self.input_spec.shape}")
        if metadata is not None:
            outputs = self.network_outputs(metadata)
            if outputs is None:
                raise DeviceError("IMX500: this frame carries no network outputs",
                                  "read the AI Camera with --camera imx500, which hands only frames with outputs")
            return outputs
        if self.shared_with is not None:
            raise DeviceError(f"IMX500: {self.shared_with} reads this camera: infer needs its frame's metadata",
                              "pass the frame's metadata: infer(tensor, metadata=frame.metadata)")
        if not self._warned:
            self._warned = True
            log.warning("IMX500: the outputs come from the sensor's own newest frame, not from the frames this "
                        "run reads; use --camera imx500 for the sensor's frames and their outputs")
        return self._wait_outputs(max(5.0, self.timeout_s / 10))[1]

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
