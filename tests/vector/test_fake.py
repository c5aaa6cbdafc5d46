"""FakeVector: the real, unmodified Vector SDK client connects to it over TLS gRPC."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import textwrap
import threading
import time

import cv2
import numpy as np
import pytest

from edgekit.errors import CameraError
from edgekit.vector.face import encode_rgb565, render_label
from edgekit.vector.fake import FakeVector, load_frames, make_certificate

anki_vector = pytest.importorskip("anki_vector",
                                  reason="needs wirepod_vector_sdk (pip install 'edgekit-vision[vector]')")
grpc = pytest.importorskip("grpc")


def sdk_robot(fake: FakeVector, monkeypatch, **kwargs):
    """The SDK's own Robot, finding its config the way it always does: under $HOME."""
    monkeypatch.setenv("HOME", str(fake.home))
    return anki_vector.Robot(serial=fake.serial, default_logging=False, behavior_activation_timeout=5, **kwargs)


def test_certificate_names_the_robot_in_cn_and_san():
    from cryptography import x509

    cert_pem, key_pem = make_certificate("Vector-T3S7")
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "Vector-T3S7"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["Vector-T3S7"]
    assert b"PRIVATE KEY" in key_pem


def test_writes_an_sdk_config_with_port_and_cleans_up():
    with FakeVector(guid="s3cret") as fake:
        ini = fake.home / ".anki_vector" / "sdk_config.ini"
        cfg = configparser.ConfigParser()
        cfg.read(ini)
        section = cfg[fake.serial]
        assert section["name"] == "Vector-T3S7" and section["guid"] == "s3cret"
        assert section["ip"] == "127.0.0.1" and int(section["port"]) == fake.port > 0
        assert fake.cert_path.read_bytes().startswith(b"-----BEGIN CERTIFICATE")
        home = fake.home
    assert not home.exists()


def test_sdk_robot_connects_streams_speaks_and_shows(monkeypatch):
    frames = [np.full((360, 640, 3), v, np.uint8) for v in (20, 120, 220)]
    with FakeVector(frames, fps=20) as fake:
        robot = sdk_robot(fake, monkeypatch)
        robot.connect()
        try:
            ids = []
            robot.events.subscribe(lambda _r, _t, evt: ids.append(evt.image.image_id),
                                   anki_vector.events.Events.new_camera_image)
            robot.camera.init_camera_feed()
            deadline = time.monotonic() + 5
            while len(ids) < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
            image = robot.camera.latest_image.raw_image
            assert image.size == (640, 360) and image.mode == "RGB"
            assert ids[:3] == [1, 2, 3]
            assert robot.camera.image_streaming_enabled()

            robot.behavior.say_text("hello edge")
            picture = render_label("a", colour=(255, 0, 0))
            robot.screen.set_screen_with_image_data(encode_rgb565(picture), 1.0)
            assert fake.said == ["hello edge"]
            assert len(fake.shown) == 1
            # the decoded face equals the picture up to RGB565's dropped low bits (exact for 0/255)
            diff = np.abs(fake.shown[0].astype(int) - picture.astype(int))
            assert diff[..., 0].max() <= 7 and diff[..., 1].max() <= 3 and diff[..., 2].max() <= 7
            np.testing.assert_array_equal(fake.shown[0] > 127, picture > 127)
        finally:
            from edgekit.vector.connection import disconnect

            disconnect(robot)
        for rpc in ("ProtocolVersion", "SDKInitialization", "BehaviorControl", "EventStream", "GetCameraConfig",
                    "CameraFeed", "SayText", "DisplayFaceImageRGB"):
            assert fake.calls[rpc] >= 1, rpc
    assert fake.handler_threads == 0


def test_frames_stream_at_the_set_rate(monkeypatch):
    with FakeVector(fps=25) as fake:
        robot = sdk_robot(fake, monkeypatch, behavior_control_level=None)
        robot.connect()
        try:
            arrivals = []
            robot.events.subscribe(lambda *_: arrivals.append(time.perf_counter()),
                                   anki_vector.events.Events.new_camera_image)
            robot.camera.init_camera_feed()
            time.sleep(1.6)
        finally:
            from edgekit.vector.connection import disconnect

            disconnect(robot)
    fps = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    assert 25 * 0.8 < fps < 25 * 1.2, fps
    assert 20 <= len(arrivals) <= 45


def test_calls_without_the_right_bearer_guid_are_unauthenticated():
    from anki_vector.messaging import client, protocol

    with FakeVector(guid="right") as fake:
        creds = grpc.ssl_channel_credentials(root_certificates=fake.cert_path.read_bytes())
        options = (("grpc.ssl_target_name_override", fake.name),)
        with grpc.secure_channel(f"127.0.0.1:{fake.port}", creds, options=options) as channel:
            stub = client.ExternalInterfaceStub(channel)
            request = protocol.ProtocolVersionRequest(client_version=protocol.PROTOCOL_VERSION_CURRENT)
            for metadata in (None, [("authorization", "Bearer wrong")]):
                with pytest.raises(grpc.RpcError) as err:
                    stub.ProtocolVersion(request, metadata=metadata, timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = stub.ProtocolVersion(request, metadata=[("authorization", "Bearer right")], timeout=5)
            assert ok.result == protocol.ProtocolVersionResponse.SUCCESS
            with pytest.raises(grpc.RpcError) as err:  # streams are guarded too
                next(iter(stub.CameraFeed(protocol.CameraFeedRequest(), timeout=5)))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_load_frames_from_folder_video_arrays_and_hold(tmp_path):
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i}.png"), np.full((50, 80, 3), 60 * i, np.uint8))
    frames = load_frames(tmp_path, hold=2)
    assert len(frames) == 6 and frames[0] == frames[1] != frames[2]
    decoded = cv2.imdecode(np.frombuffer(frames[0], np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == (360, 640, 3)  # resized to what a real Vector streams

    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for i in range(7):
        writer.write(np.full((48, 64, 3), 30 * i, np.uint8))
    writer.release()
    assert len(load_frames(video, size=None)) == 7
    assert len(load_frames([np.zeros((10, 10), np.uint8)] * 4, size=None)) == 4
    with pytest.raises(CameraError, match="does not exist"):
        load_frames(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CameraError, match="no images"):
        load_frames(tmp_path / "empty")


def test_vanish_and_restart_on_the_same_port():
    fake = FakeVector().start()
    try:
        port, home = fake.port, fake.home
        fake.vanish()
        assert not fake.running and home.exists()
        fake.start()
        assert fake.running and fake.port == port
    finally:
        fake.stop()
    assert fake.home is None and not home.exists()


@pytest.mark.slow  # asserts on wall-clock time
def test_a_forgotten_fake_with_open_streams_does_not_hang_interpreter_exit(tmp_path):
    # handler threads are daemons, and the SDK client is left connected on purpose
    code = textwrap.dedent("""
        import os, time
        from edgekit.vector.fake import FakeVector
        fake = FakeVector(fps=30).start()
        os.environ["HOME"] = str(fake.home)
        import anki_vector
        robot = anki_vector.Robot(serial=fake.serial, default_logging=False)
        robot.connect()
        robot.camera.init_camera_feed()
        deadline = time.monotonic() + 10
        while fake.frames_sent < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        print("streaming", fake.frames_sent >= 3, flush=True)
    """)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "streaming True" in done.stdout
    assert time.monotonic() - t0 < 30


def test_stop_joins_every_handler_thread(monkeypatch):
    before = set(threading.enumerate())
    fake = FakeVector(fps=30).start()
    robot = sdk_robot(fake, monkeypatch)
    robot.connect()
    robot.camera.init_camera_feed()
    time.sleep(0.2)
    fake.stop()  # the robot vanishes under a connected client
    from edgekit.vector.connection import disconnect

    disconnect(robot)
    time.sleep(0.2)
    assert fake.handler_threads == 0
    leftovers = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert [t.name for t in leftovers if "FakeVector" in t.name or "Event Stream" in t.name
            or "Connection Handler" in t.name] == []


def test_a_small_item_is_held_up_inside_the_window_the_model_reads(tmp_path):
    item = np.zeros((28, 28), np.uint8)
    item[4:24, 10:18] = 255  # a bright bar on black, as a Fashion-MNIST item
    cv2.imwrite(str(tmp_path / "item.png"), item)
    held = cv2.imdecode(np.frombuffer(load_frames(tmp_path, window=(200, 200))[0], np.uint8), cv2.IMREAD_GRAYSCALE)
    assert held.shape == (360, 640)
    window = held[80:280, 220:420]  # the centred 200x200 crop of a 640x360 frame
    assert window[100, 100] > 200 and window[5, 5] < 40  # the bar and the item's black background
    assert abs(int(held[10, 10]) - 128) < 8 and abs(int(held[350, 630]) - 128) < 8  # a grey frame around it
    stretched = cv2.imdecode(np.frombuffer(load_frames(tmp_path)[0], np.uint8), cv2.IMREAD_GRAYSCALE)
    assert stretched[10, 10] < 40  # without a window: stretched over the whole frame, as before
