"""The imx500 adapter against a fake ``picamera2`` (tests/fakes/picamera2: its ``devices.IMX500``
checks that the network is loaded before the camera, and ``get_outputs`` reshapes in Fortran order)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit.errors import BackendUnavailable, DeviceError, ModelError
from edgekit.imaging.image import InputSpec
from edgekit.runtime import BACKENDS, check_options, open_runtime
from edgekit.runtime.imx500 import Imx500Runtime, find_rpk

FAKES = Path(__file__).resolve().parents[1] / "fakes"
SPEC = InputSpec(shape=(1, 28, 28, 1), layout="NHWC", colour="gray")


@pytest.fixture
def fake_picamera2(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))
    for name in ("picamera2", "picamera2.devices"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import picamera2

    picamera2.reset()
    yield picamera2
    picamera2.reset()
    for name in ("picamera2", "picamera2.devices"):
        sys.modules.pop(name, None)


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


def test_frames_before_the_upload_ends_are_waited_for_then_a_timeout_is_one_line(fake_picamera2, bundle):
    fake_picamera2.IMX500_UPLOAD_FRAMES = 5
    with Imx500Runtime(bundle / "network.rpk", frame_rate=15) as rt:
        assert fake_picamera2.INSTANCES[0].frames == 6
        assert rt.infer(np.zeros((1, 3, 8, 8), np.float32))[0].shape == (1, 10)  # a bare .rpk: any shape
    fake_picamera2.reset()
    fake_picamera2.IMX500_UPLOAD_FRAMES = 10**9
    with pytest.raises(DeviceError, match="no network outputs"):
        Imx500Runtime(bundle / "network.rpk", timeout_s=0.01)


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
