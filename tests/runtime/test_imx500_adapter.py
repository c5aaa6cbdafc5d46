"""The imx500 adapter against a fake ``picamera2`` (tests/fakes/picamera2: its ``devices.IMX500``
checks that the network is loaded before the camera, and ``get_outputs`` reshapes in Fortran order)."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.errors import BackendUnavailable, DeviceError, ModelError
from edgekit.imaging.geometry import box_map
from edgekit.imaging.image import InputSpec
from edgekit.runtime import BACKENDS, check_options, open_runtime
from edgekit.runtime.imx500 import Imx500Runtime, find_rpk

SPEC = InputSpec(shape=(1, 28, 28, 1), layout="NHWC", colour="gray")


@pytest.fixture
def bundle(tmp_path):
    """A bundle folder after ``imx500-package -i packerOut.zip -o BUNDLE/`` on the Pi."""
    (tmp_path / "packerOut.zip").write_bytes(b"PK fake")
    (tmp_path / "network.rpk").write_bytes(b"rpk fake")
    return tmp_path


def _names(fake):
    return [c[0] for c in fake.CALLS]


def test_it_loads_the_network_before_the_camera_and_reads_the_outputs_from_the_metadata(fake_picamera2, bundle):
    scores = np.arange(10, dtype=np.float32)
    grid = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # a non-square tensor: the Fortran order shows
    fake_picamera2.IMX500_OUTPUTS = [scores, grid]
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt:
        assert rt.rpk == bundle / "network.rpk"
        names = _names(fake_picamera2)
        assert names.index("IMX500") < names.index("__init__") < names.index("start")
        (preview,) = [c[1] for c in fake_picamera2.CALLS if c[0] == "create_preview_configuration"]
        assert preview["controls"] == {"FrameRate": 30.0}  # the network intrinsics' inference rate
        shapes = [d["shape"] for d in rt.output_details()]
        assert shapes == [[1, 10], [1, 2, 3, 4]]
        out = rt.infer(np.zeros(SPEC.shape, np.float32))
        np.testing.assert_array_equal(out[0], scores[None])
        np.testing.assert_array_equal(out[1], grid[None])
        assert all(o.dtype == np.float32 for o in out)
        assert rt.describe()["backend"] == "imx500"
    assert fake_picamera2.INSTANCES[0].closed


def test_frames_before_the_upload_ends_are_waited_for_then_a_timeout_is_one_line(
    fake_picamera2, bundle, monkeypatch, caplog
):
    fake_picamera2.IMX500_UPLOAD_FRAMES = 5
    with Imx500Runtime(bundle / "network.rpk", frame_rate=15) as rt:
        assert fake_picamera2.INSTANCES[0].frames == 6
        assert rt.infer(np.zeros((1, 3, 8, 8), np.float32))[0].shape == (1, 10)  # a bare .rpk: any shape
    assert not [r for r in caplog.records if "still uploading" in r.getMessage()]  # a short wait: nothing said
    fake_picamera2.reset()
    fake_picamera2.IMX500_UPLOAD_FRAMES = 10**9
    monkeypatch.setattr(Imx500Runtime, "SAY_WAITING_AFTER_S", 0.0)
    with pytest.raises(DeviceError, match="no network outputs"):
        Imx500Runtime(bundle / "network.rpk", timeout_s=0.05)
    said = [r for r in caplog.records if "network.rpk is still uploading to the sensor" in r.getMessage()]
    assert len(said) == 1  # once, not once a frame
    assert fake_picamera2.INSTANCES[0].closed  # the camera is free for the next try


def test_without_a_packaged_network_it_names_the_packaging_command(fake_picamera2, tmp_path):
    (tmp_path / "packerOut.zip").write_bytes(b"PK fake")
    with pytest.raises(ModelError, match="no .rpk") as info:
        Imx500Runtime(tmp_path / "packerOut.zip", input_spec=SPEC)
    assert "imx500-package -i packerOut.zip" in info.value.hint
    assert not fake_picamera2.CALLS  # refused before picamera2 was touched


def test_a_package_in_a_folder_beside_the_zip_is_found(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "network.rpk").write_bytes(b"rpk")
    assert find_rpk(tmp_path / "packerOut.zip") == tmp_path / "out" / "network.rpk"


def test_no_camera_and_a_wrong_input_are_one_line_errors(fake_picamera2, bundle):
    fake_picamera2.CAMERAS = []
    with pytest.raises(DeviceError, match="cannot load network.rpk"):
        Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC)
    fake_picamera2.reset()
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt, pytest.raises(ModelError, match="input"):
        rt.infer(np.zeros((1, 32, 32, 1), np.float32))


def test_without_picamera2_it_says_what_to_install(bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "picamera2", None)
    with pytest.raises(BackendUnavailable, match="picamera2"):
        Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC)


def test_the_backends_table_row_opens_a_bare_rpk_and_checks_options(fake_picamera2, bundle):
    assert BACKENDS["imx500"].formats == ("imx500", "rpk")
    assert check_options(Imx500Runtime, {"frame_rate": "20"}, ValueError) == {"frame_rate": 20.0}
    with pytest.raises(ValueError):
        check_options(Imx500Runtime, {"frame_rate": -1}, ValueError)
    with open_runtime(bundle / "network.rpk") as rt:
        assert isinstance(rt, Imx500Runtime)


def test_infer_reads_the_given_frames_outputs_and_refuses_a_frame_without_them(fake_picamera2, bundle, caplog):
    fake_picamera2.IMX500_OUTPUTS = lambda n: [np.full(10, n, np.float32)]
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt:
        cam = fake_picamera2.INSTANCES[0]
        cam.frames = 41
        metadata = cam.capture_metadata()  # frame 42
        cam.frames = 99  # later frames exist: the outputs must still be frame 42's
        out = rt.infer(np.zeros(SPEC.shape, np.float32), metadata=metadata)
        np.testing.assert_array_equal(out[0], np.full((1, 10), 42, np.float32))
        assert cam.frames == 99  # no frame of its own was captured
        with pytest.raises(DeviceError, match="carries no network outputs"):
            rt.infer(np.zeros(SPEC.shape, np.float32), metadata={"SensorTimestamp": 7})
        source = SimpleNamespace(name="imx500")
        rt.attach(source)
        with pytest.raises(DeviceError, match="imx500 reads this camera"):
            rt.infer(np.zeros(SPEC.shape, np.float32))
        rt.detach(SimpleNamespace(name="imx500"))  # another source's late detach: still attached
        assert rt.shared_with == "imx500"
        rt.detach(source)
        for _ in range(3):  # another camera's frames: the sensor's newest outputs, said once
            rt.infer(np.zeros(SPEC.shape, np.float32))
    said = [r for r in caplog.records if "not from the frames this run reads" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


def test_the_sensors_inference_window_becomes_the_inputs_crop_so_boxes_land_on_the_frame(fake_picamera2, bundle):
    """A square network with preserve_aspect_ratio: the sensor scales a centred 3040x3040 window of its
    4056x3040 pixels; the 640x480 main stream shows the whole sensor (ScalerCrop), so the window is
    (80, 0, 479, 480) there (picamera2's convert_inference_coords, by hand: 508 * 2028 / 4056 = 254
    raw pixels, 254 * 640 / 2028 = 80; 1520 * 640 / 2028 = 479)."""
    square = InputSpec(shape=(1, 320, 320, 3), layout="NHWC", colour="rgb", resize="letterbox")
    fake_picamera2.IMX500_PRESERVE_AR, fake_picamera2.IMX500_INPUT_SIZE = True, (320, 320)
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=square) as rt:
        assert ("set_auto_aspect_ratio",) in fake_picamera2.CALLS
        assert rt.window == (80, 0, 479, 480)
        assert rt.input_spec.crop == "480:479" and rt.input_spec.resize == "stretch"  # what the sensor does
        assert rt.input_spec.shape == square.shape
        mapping = box_map(rt.input_spec, (480, 640, 3))  # what every head maps its boxes through
        box = mapping(np.array([[0, 0, 320, 320], [80, 160, 240, 320]], np.float32))
        x, y, w, h = rt.window
        want = [[x, y, x + w, y + h], [x + 80 * w / 320, 160 * h / 320, x + 240 * w / 320, y + h]]
        np.testing.assert_allclose(box, want, atol=1.0)
    fake_picamera2.reset()
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=square) as rt:  # the whole sensor: no crop
        assert rt.window == (0, 0, 640, 480) and rt.input_spec.crop is None


def test_without_convert_inference_coords_the_bundles_geometry_stays_and_it_says_so(
    fake_picamera2, bundle, monkeypatch, caplog
):
    import picamera2.devices

    monkeypatch.delattr(picamera2.devices.IMX500, "convert_inference_coords")
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt:
        assert rt.window is None and rt.input_spec == SPEC
    assert any("is unknown" in r.getMessage() for r in caplog.records)
