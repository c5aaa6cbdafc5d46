"""The ``imx500`` camera source: the AI Camera's frames, each with the sensor's outputs for that very frame.

Against the fake ``picamera2`` (tests/fakes/picamera2): its ``capture_request`` hands requests that
must be released, ``STAMP`` writes each frame's number into its top-left pixel and ``IMX500_OUTPUTS``
may depend on the frame number, so a test can tell which frame an image and an output belong to.
"""

from __future__ import annotations

import json
import logging

import cv2
import numpy as np
import pytest

from edgekit.bundle import FORMAT_VERSION, sha256_file
from edgekit.camera import open_camera
from edgekit.errors import CameraError, CameraUnavailable
from edgekit.imaging.image import InputSpec
from edgekit.model import open_model
from edgekit.pipeline import Pipeline
from edgekit.runtime.imx500 import Imx500Runtime
from tests.helpers.faults import assert_refused, edgekit

SPEC = InputSpec(shape=(1, 28, 28, 1), layout="NHWC", colour="gray")
LABELS = [f"c{i}" for i in range(10)]


# every frame numbered (stamped, its outputs naming it; tests/conftest.py's fake_picamera2): these tests tell
# which frame an image and an output belong to
pytestmark = pytest.mark.fake_picamera2(numbered=True)


@pytest.fixture
def fake(fake_picamera2):
    """The fake picamera2 by the short name these tests read it through."""
    return fake_picamera2


@pytest.fixture
def bundle(tmp_path):
    """An imx500 bundle after ``imx500-package`` on the Pi: packerOut.zip, network.rpk, labels, edgekit.json."""
    (tmp_path / "packerOut.zip").write_bytes(b"PK fake")
    (tmp_path / "network.rpk").write_bytes(b"rpk fake")
    (tmp_path / "labels.txt").write_text("\n".join(LABELS) + "\n")
    manifest = {
        "format_version": FORMAT_VERSION, "name": "demo", "target": "imx500", "labels": "labels.txt",
        "default_model": "int8", "runtime": {"adapter": "edgekit.runtime.imx500:Imx500Runtime"},
        "models": [{"name": "int8", "file": "packerOut.zip", "format": "imx500", "precision": "int8",
                    "input": SPEC.to_dict(), "outputs": []}],
        "files": {n: sha256_file(tmp_path / n) for n in ("packerOut.zip", "labels.txt")},
    }  # fmt: skip
    (tmp_path / "edgekit.json").write_text(json.dumps(manifest))
    return tmp_path


def _number(frame) -> int:
    """The frame number the fake wrote into the image (mod 256), the same in B, G and R."""
    stamp = frame.array[0, 0]
    assert stamp[0] == stamp[1] == stamp[2]
    return int(stamp[0])


def test_one_request_gives_the_frame_its_metadata_and_the_backend_the_outputs_of_that_request(fake, bundle):
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt:
        with open_camera("imx500", rt) as cam:
            frames = [next(cam) for _ in range(4)]
            stats = cam.stats()
            with pytest.raises(CameraError, match="imx500 already reads this camera"):
                open_camera("imx500", rt)  # a second reader would take the first one's requests
        assert fake.INSTANCES[0].started  # closing the source leaves the camera to the backend
        for frame in frames:
            n = frame.metadata["SensorTimestamp"]
            assert _number(frame) == n % 256  # the image and the metadata are one request's
            (out,) = rt.infer(np.zeros(SPEC.shape, np.float32), metadata=frame.metadata)
            np.testing.assert_array_equal(out, np.eye(10, dtype=np.float32)[n % 10][None])
        numbers = [f.metadata["SensorTimestamp"] for f in frames]
        assert numbers == sorted(set(numbers))
    names = [c[0] for c in fake.CALLS]
    assert names.index("IMX500") < names.index("__init__") < names.index("start") < names.index("capture_request")
    assert len(fake.INSTANCES) == 1  # one Picamera2, shared
    assert not fake.HELD  # every request went back to the camera
    assert stats["read_errors"] == 0 and stats["without_outputs"] == 0  # each request released once
    assert stats["kind"] == "imx500" and stats["size"] == (640, 480) and stats["network"] == "network.rpk"
    scene = cv2.resize(fake.SCENE, (640, 480), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(frames[0].array[1:], scene[1:])  # XBGR8888 -> B,G,R
    assert fake.INSTANCES[0].closed


def test_the_pipeline_decodes_each_frame_with_the_outputs_the_sensor_gave_that_frame(fake, bundle, monkeypatch):
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt, open_camera("imx500", rt) as cam:
        def own_frame(self, wait=None):
            raise AssertionError("infer captured a frame of its own")

        monkeypatch.setattr(fake.Picamera2, "capture_metadata", own_frame)
        pairs = list(Pipeline(rt, LABELS, warmup=0).steps(cam, max_frames=5))
    assert len(pairs) == 5
    for frame, result in pairs:
        assert result.classification.top.index == frame.metadata["SensorTimestamp"] % 10 == _number(frame) % 10


def test_frames_without_outputs_are_said_once_and_counted_and_outputs_that_never_come_are_one_error(
    fake, bundle, caplog
):
    caplog.set_level(logging.WARNING, "edgekit.camera.imx500")
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt:
        fake.IMX500_UPLOAD_FRAMES = fake.INSTANCES[0].frames + 4  # the next 4 frames: the network uploads again
        with open_camera("imx500", rt) as cam:
            first = next(cam)
            stats = cam.stats()
        assert rt.infer(np.zeros(SPEC.shape, np.float32), metadata=first.metadata)  # the first frame has outputs
        assert stats["without_outputs"] == 4 and stats["delivered"] == 1
        said = [r for r in caplog.records if "without the network's outputs" in r.getMessage()]
        assert len(said) == 1
        fake.IMX500_UPLOAD_FRAMES = 10**9
        with open_camera("imx500", rt, open_timeout_s=0.3) as cam, pytest.raises(CameraUnavailable) as info:
            next(cam)
    assert "no frame within 0.3 s" in str(info.value) and "no network outputs" in str(info.value)
    assert not fake.HELD


def test_a_camera_that_disappears_is_one_error_and_its_pending_request_is_dropped(fake, bundle):
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt:
        fake.HANG_AFTER = fake.INSTANCES[0].frames + 2  # the cable comes loose after two frames
        cam = open_camera("imx500", rt, timeout_s=0.3)
        with pytest.raises(CameraUnavailable, match="imx500: camera stopped delivering"):
            for _ in cam:
                pass
        cam.close()
        cam._thread.join(2)  # the grabber's release runs as it ends
        assert ("cancel_all_and_flush",) in fake.CALLS and rt.shared_with is None
    assert not fake.HELD


def test_run_reads_the_sensors_frames_and_stops_in_one_line_when_the_camera_goes(fake, bundle, capsys):
    result = edgekit(capsys, "run", bundle, "--camera", "imx500", "--max-frames", "3", "--json", "--warmup", "0")
    assert result.code == 0, result.text
    lines = [json.loads(line) for line in result.out.splitlines()]
    frames = [line for line in lines if "frame" in line]
    assert len(frames) == 3 and lines[0]["runtime"]["backend"] == "imx500"
    # the backend's first wait took frames 1-3: the source's frame k is request k + 4, class (k + 4) % 10
    assert [f["top"][0]["index"] for f in frames] == [(f["frame"] + 4) % 10 for f in frames]
    assert "not from the frames this run reads" not in result.err
    fake.reset()
    fake.HANG_AFTER = 5
    assert_refused(edgekit(capsys, "run", bundle, "--camera", "imx500", "-O", "timeout_s=0.3", "--quiet"),
                   "imx500: camera stopped delivering", code=1)


def test_the_imx500_camera_needs_the_imx500_backend_and_picamera2_points_to_it(fake, bundle, capsys):
    with pytest.raises(CameraError, match="no model was given") as info:
        open_camera("imx500")
    assert "--camera imx500" in info.value.hint
    with pytest.raises(CameraError, match=r"runtime \(object\) does not run in the AI Camera"):
        open_camera("imx500", object())
    with pytest.raises(CameraError, match="bad camera URI"):
        open_camera("imx500:0", object())
    with Imx500Runtime(bundle / "packerOut.zip", input_spec=SPEC) as rt:
        with pytest.raises(CameraError, match="imx500 backend holds the AI Camera") as info:
            open_camera("picamera2", rt)
        assert "--camera imx500" in info.value.hint
    assert_refused(edgekit(capsys, "run", bundle, "--camera", "picamera2"), "imx500 backend holds")


def test_an_imx500_bundle_on_another_camera_keeps_the_sensors_outputs_and_says_so_once(fake, bundle, capsys):
    result = edgekit(capsys, "run", bundle, "--camera", "synthetic:64x48", "--max-frames", "4", "--json")
    assert result.code == 0, result.text
    assert result.err.count("not from the frames this run reads; use --camera imx500") == 1


def test_a_network_that_is_not_the_bundles_is_refused_on_open_and_the_camera_let_go(fake, bundle):
    """The bundle records its network's outputs; the sensor's ([1, 10] here) must match them, else opening the
    model is one ModelError and the camera is closed again for the next try (runtime/__init__.py)."""
    from edgekit.errors import ModelError

    manifest = json.loads((bundle / "edgekit.json").read_text())
    manifest["models"][0]["outputs"] = [{"name": "output0", "shape": [1, 11], "dtype": "float32"}]
    (bundle / "edgekit.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match=r"output 0 of network.rpk is \[1, 10\], the bundle's is \[1, 11\]"):
        open_model(bundle)
    assert fake.INSTANCES and all(cam.closed for cam in fake.INSTANCES)
    manifest["models"][0]["outputs"][0]["shape"] = [1, 10]
    (bundle / "edgekit.json").write_text(json.dumps(manifest))
    with open_model(bundle) as model:
        assert [d["shape"] for d in model.runtime.output_details()] == [[1, 10]]
