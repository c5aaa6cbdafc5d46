"""The demo detector's output through the imx500 adapter (a fake ``picamera2``, tests/fakes/picamera2:
the sensor's tensor flattened in Fortran order, ``get_outputs(add_batch=True)`` reshaping it back)
into the detect head: the same detections as the head gives on the host's output, as the gate decodes it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.detect.head import detector
from edgekit.imaging.image import InputSpec
from edgekit.runtime.imx500 import Imx500Runtime

LABELS = ["circle", "triangle", "square", "star"]
SPEC = InputSpec(shape=(1, 3, 160, 160), layout="NCHW", colour="rgb", resize="letterbox")


def yolo_output() -> np.ndarray:
    """``[8, 500]``: cx, cy, w, h normalised to the input, then 4 class scores, on MCT's 1/128 grid;
    two confident objects of different classes, the rest background."""
    rng = np.random.default_rng(3)
    out = np.zeros((8, 500), np.float32)
    out[:4] = rng.uniform(0.2, 0.4, (4, 500))
    out[4:] = rng.uniform(0.0, 0.05, (4, 500))
    out[:, 17] = [0.25, 0.30, 0.20, 0.10, 0.02, 0.90, 0.01, 0.00]  # a triangle at the top left
    out[:, 412] = [0.70, 0.65, 0.15, 0.25, 0.00, 0.03, 0.01, 0.85]  # a star at the bottom right
    return np.round(out * 128) / 128


@pytest.mark.parametrize("frame", [None, (480, 640, 3)], ids=["input", "frame"])
def test_the_sensors_detector_output_decodes_as_the_hosts_does(fake_picamera2, tmp_path, frame):
    (tmp_path / "packerOut.zip").write_bytes(b"PK fake")
    (tmp_path / "network.rpk").write_bytes(b"rpk fake")
    host = yolo_output()
    fake_picamera2.IMX500_OUTPUTS = [host]
    with Imx500Runtime(tmp_path / "packerOut.zip", input_spec=SPEC) as rt:
        assert [d["shape"] for d in rt.output_details()] == [[1, 8, 500]]  # add_batch=True: the bundle's shape
        head = detector(LABELS, runtime=rt, layout="yolo")
        sensor = rt.infer(np.zeros(SPEC.shape, np.float32))
        np.testing.assert_array_equal(sensor[0], host[None])
        found = head(sensor, frame)
        # the host's decode of the same output through the same input geometry (the gate's head)
        on_host = SimpleNamespace(input_spec=rt.input_spec, output_details=lambda: [{"shape": [1, 8, 500]}])
        want = detector(LABELS, runtime=on_host, layout="yolo")([host[None]], frame)
    assert [d.label for d in found.detections] == ["triangle", "star"]
    assert [(d.label, d.score) for d in found.detections] == [(d.label, d.score) for d in want.detections]
    np.testing.assert_allclose([d.box for d in found.detections], [d.box for d in want.detections], atol=1e-4)
    transposed = head([host.T[None]], frame)  # a sensor that lays it out [1, 500, 8] decodes alike
    assert [d.label for d in transposed.detections] == ["triangle", "star"]


def test_the_sensors_outputs_are_held_to_the_bundles_shapes(fake_picamera2, tmp_path):
    """A sensor tensor whose non-batch axes come reversed (C order read through picamera2's Fortran reshape)
    is transposed back to the bundle's shape; a network that is not the bundle's is one ModelError."""
    from edgekit.errors import ModelError

    (tmp_path / "packerOut.zip").write_bytes(b"PK fake")
    (tmp_path / "network.rpk").write_bytes(b"rpk fake")
    host = yolo_output()
    fake_picamera2.IMX500_OUTPUTS = [host.T.copy()]  # the sensor hands [500, 8]
    with Imx500Runtime(tmp_path / "packerOut.zip", input_spec=SPEC) as rt:
        assert [d["shape"] for d in rt.output_details()] == [[1, 500, 8]]
        rt.conform_outputs([[1, 8, 500]])
        assert [d["shape"] for d in rt.output_details()] == [[1, 8, 500]]
        np.testing.assert_array_equal(rt.infer(np.zeros(SPEC.shape, np.float32))[0], host[None])
        rt.conform_outputs([None])  # nothing recorded: taken as it comes
        with pytest.raises(ModelError, match=r"is \[1, 8, 500\], the bundle.s is \[1, 4, 500\]"):
            rt.conform_outputs([[1, 4, 500]])
        with pytest.raises(ModelError, match="gives 1 outputs; the bundle records 2"):
            rt.conform_outputs([[1, 8, 500], [1, 10]])
