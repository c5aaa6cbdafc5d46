"""A fake ``picamera2.devices`` with the ``IMX500`` class (the Raspberry Pi AI Camera).

It checks what the real class needs: the ``.rpk`` exists and is loaded before the camera's
``Picamera2`` is created (the upload is set up on the sensor first), and ``get_outputs`` reads
``CnnOutputTensor`` from a frame's metadata, each tensor reshaped in Fortran order, with a
batch axis when ``add_batch``. ``convert_inference_coords`` is picamera2's arithmetic
(picamera2/devices/imx500/imx500.py, libcamera's Rectangle ``scaled_by``/``bounded_to`` in integers).
Calls are recorded in ``picamera2.CALLS``.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np

import picamera2

FULL_SENSOR = (0, 0, 4056, 3040)  # picamera2's IMX500.__get_full_sensor_resolution


def _scaled(r: tuple, numerator: tuple, denominator: tuple) -> tuple:
    """libcamera's Rectangle::scaledBy: x and width by num.w/den.w, y and height by num.h/den.h."""
    x, y, w, h = r
    return (x * numerator[0] // denominator[0], y * numerator[1] // denominator[1],
            w * numerator[0] // denominator[0], h * numerator[1] // denominator[1])


def _bounded(r: tuple, bound: tuple) -> tuple:
    """libcamera's Rectangle::boundedTo: the intersection."""
    x0, y0 = max(r[0], bound[0]), max(r[1], bound[1])
    x1, y1 = min(r[0] + r[2], bound[0] + bound[2]), min(r[1] + r[3], bound[1] + bound[3])
    return x0, y0, max(x1 - x0, 0), max(y1 - y0, 0)


class IMX500:
    """Just enough of picamera2.devices.IMX500."""

    def __init__(self, network_file: str, camera_id: str = ""):
        picamera2.CALLS.append(("IMX500", network_file))
        if not os.path.isfile(network_file):
            raise RuntimeError(f"Firmware file {network_file} does not exist.")
        if any(not cam.closed for cam in picamera2.INSTANCES):
            raise RuntimeError("IMX500: the network must be loaded before Picamera2 is created")
        if not picamera2.CAMERAS:
            raise RuntimeError("IMX500: Requested camera dev-node not found")
        picamera2.NETWORKS.append(network_file)
        self.camera_num = 0
        self.network_intrinsics = SimpleNamespace(inference_rate=30.0,
                                                  preserve_aspect_ratio=picamera2.IMX500_PRESERVE_AR)
        self.config = {"roi": FULL_SENSOR, "input_tensor_size": picamera2.IMX500_INPUT_SIZE}

    def show_network_fw_progress_bar(self) -> None:
        picamera2.CALLS.append(("show_network_fw_progress_bar",))

    def set_auto_aspect_ratio(self) -> None:
        """The ROI: the largest centred window of the input's aspect ratio (set_inference_aspect_ratio)."""
        picamera2.CALLS.append(("set_auto_aspect_ratio",))
        w, h = self.config["input_tensor_size"]
        fw, fh = FULL_SENSOR[2:]
        rw, rh = (fw, fw * h // w) if fw * h <= fh * w else (fh * w // h, fh)
        self.config["roi"] = ((fw - rw) // 2, (fh - rh) // 2, rw, rh)

    def get_input_size(self) -> tuple:
        return self.config["input_tensor_size"]

    def convert_inference_coords(self, coords: tuple, metadata: dict, picam2, stream="main") -> tuple:
        """picamera2's: (y0, x0, y1, x1) fractions of the full sensor -> (x, y, w, h) in ``stream``'s pixels."""
        isp = picam2.camera_configuration()[stream]["size"]
        raw = picam2.camera_configuration()["raw"]["size"]
        scaler_crop = tuple(metadata["ScalerCrop"])
        y0, x0, y1, x1 = coords
        fw, fh = FULL_SENSOR[2:]
        obj = tuple(int(v) for v in np.maximum([x0 * fw, y0 * fh, (x1 - x0) * fw, (y1 - y0) * fh], 0))
        sensor_crop = _scaled(scaler_crop, raw, (fw, fh))
        obj = _bounded(obj, self.config["roi"])
        obj = _bounded(_scaled(obj, raw, (fw, fh)), sensor_crop)
        obj = (obj[0] - sensor_crop[0], obj[1] - sensor_crop[1], obj[2], obj[3])
        return _scaled(obj, isp, sensor_crop[2:])

    def get_output_shapes(self, metadata: dict) -> list:
        return list(metadata.get("CnnOutputTensorInfo") or [])

    def get_outputs(self, metadata: dict, add_batch: bool = False):
        """The output tensors in ``metadata``, float32, reshaped in Fortran order; None before the upload ends."""
        flat = metadata.get("CnnOutputTensor")
        if not flat:
            return None
        values = np.fromiter(flat, dtype=np.float32)
        outputs, offset = [], 0
        for shape in self.get_output_shapes(metadata):
            size = int(np.prod(shape))
            tensor = values[offset:offset + size].reshape(shape, order="F")
            outputs.append(np.expand_dims(tensor, 0) if add_batch else tensor)
            offset += size
        return outputs
