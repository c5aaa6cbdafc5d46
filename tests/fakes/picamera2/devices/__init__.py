"""A fake ``picamera2.devices`` with the ``IMX500`` class (the Raspberry Pi AI Camera).

It checks what the real class needs: the ``.rpk`` exists and is loaded before the camera's
``Picamera2`` is created (the upload is set up on the sensor first), and ``get_outputs`` reads
``CnnOutputTensor`` from a frame's metadata, each tensor reshaped in Fortran order, with a
batch axis when ``add_batch``. Calls are recorded in ``picamera2.CALLS``.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np

import picamera2


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
        self.network_intrinsics = SimpleNamespace(inference_rate=30.0, preserve_aspect_ratio=False)

    def show_network_fw_progress_bar(self) -> None:
        picamera2.CALLS.append(("show_network_fw_progress_bar",))

    def set_auto_aspect_ratio(self) -> None:
        picamera2.CALLS.append(("set_auto_aspect_ratio",))

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
