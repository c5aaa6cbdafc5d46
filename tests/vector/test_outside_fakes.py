"""VectorSource and the sign demo against robots that behave unlike our FakeVector.

Outside reviewers bring their own fake Vector, built on the SDK's gRPC servicer as ours is but
written by someone else: other frame sizes, gray JPEGs, encodings the SDK cannot open, a camera
stream that ends, behaviour control taken back, a SayText that fails or refuses, a broken
sdk_config.ini. Each case replaces one RPC of FakeVector (``handlers=``) and drives the real SDK
client through it.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import itertools
import time

import cv2
import numpy as np
import pytest

from edgekit.imaging.image import InputSpec
from edgekit.vector.connection import VectorError
from edgekit.vector.fake import FakeVector

pytest.importorskip("anki_vector", reason="needs wirepod_vector_sdk (pip install 'edgekit-vision[vector]')")

from edgekit.vector.camera import MAX_BAD_IN_ROW, VectorSource  # noqa: E402

FAST = {"connect_timeout_s": 1.0, "frame_timeout_s": 3.0}
GRAY_SPEC = InputSpec(shape=(1, 32, 32, 1), colour="gray", crop=(200, 200), mean=(0.0,), std=(255.0,))
RGB_SPEC = InputSpec(shape=(1, 32, 32, 3), colour="rgb", crop=(200, 200), mean=(0.0,), std=(255.0,))


def sign(value: int, size: tuple[int, int]) -> np.ndarray:
    """A BGR frame of ``size`` (w, h): grey surroundings, a centre square of ``value`` that covers
    the field of view a 200x200 square covers in Vector's 640x360 frame."""
    w, h = size
    half = round(100 * w / 640)
    frame = np.full((h, w, 3), 90, np.uint8)
    frame[h // 2 - half:h // 2 + half, w // 2 - half:w // 2 + half] = value
    return frame


def jpeg(frame: np.ndarray) -> bytes:
    return cv2.imencode(".jpg", frame)[1].tobytes()


def gray_jpeg(frame: np.ndarray) -> bytes:
    return cv2.imencode(".jpg", cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY))[1].tobytes()


def camera_feed(datas, encoding: str = "JPEG_COLOR", period_s: float = 0.03, count: int | None = None):
    """A CameraFeed RPC sending ``datas`` (bytes) round-robin labelled ``encoding``; ends after ``count``."""

    def handler(robot, protocol, request, context):
        done = robot._call_event(context)
        try:
            for k in itertools.count():
                if (count is not None and k >= count) or done.wait(period_s):
                    return
                yield protocol.CameraFeedResponse(image_id=k + 1, data=datas[k % len(datas)],
                                                  image_encoding=getattr(protocol.ImageChunk, encoding))
        finally:
            robot._forget(done)

    return handler


def first_frames(fake: FakeVector, n: int, **source_kwargs) -> tuple[list, dict]:
    with VectorSource(fake.serial, config_home=fake.home, **{**FAST, **source_kwargs}) as cam:
        frames = []
        for frame in cam:
            frames.append(frame)
            if len(frames) == n:
                break
        return frames, cam.stats()


@pytest.mark.parametrize(("size", "nominal"), [((1280, 720), (640, 360)), ((320, 240), (640, 480))])
def test_frames_of_another_size_come_at_vectors_width_so_the_crop_keeps_its_field_of_view(size, nominal):
    """A 200x200 crop means a field of view of Vector's 640x360 frame: a 1280x720 frame used to
    hand the model a 4x zoom of its centre."""
    feed = camera_feed([jpeg(sign(30, size)), jpeg(sign(220, size))])
    with FakeVector(handlers={"CameraFeed": feed}) as fake:
        frames, _ = first_frames(fake, 2)
        windows, _ = first_frames(fake, 2, prepare=GRAY_SPEC)
        [raw], _ = first_frames(fake, 1, frame_width=None)
    assert [f.array.shape for f in frames] == [(nominal[1], nominal[0], 3)] * 2
    assert raw.array.shape == (size[1], size[0], 3)
    assert [w.array.shape for w in windows] == [(200, 200)] * 2
    # the square fills the window: its edge (resampled) is at most a pixel or two wide
    for w in windows:
        inner = w.array[3:-3, 3:-3]
        assert min(abs(inner.mean() - 30), abs(inner.mean() - 220)) < 4 and inner.std() < 6


def test_gray_jpeg_frames_are_2d_and_feed_gray_and_colour_models():
    data = [gray_jpeg(sign(30, (640, 360)))]
    for encoding in ("JPEG_GRAY", "JPEG_MINIMIZED_GRAY"):  # both labels carry a plain gray JPEG here
        with FakeVector(handlers={"CameraFeed": camera_feed(data, encoding)}) as fake:
            [frame], _ = first_frames(fake, 1)
            [gray], _ = first_frames(fake, 1, prepare=GRAY_SPEC)
            [colour], _ = first_frames(fake, 1, prepare=RGB_SPEC)
        assert frame.array.shape == (360, 640) and abs(int(frame.array[180, 320]) - 30) <= 3
        assert gray.array.shape == (200, 200) and colour.array.shape == (200, 200, 3)


@pytest.mark.parametrize(("encoding", "make", "words"), [
    ("RAW_RGB", lambda f: f[:, :, ::-1].tobytes(), "RAW_RGB, 691200 bytes: cannot identify image file"),
    ("JPEG_COLOR", lambda f: b"", "JPEG_COLOR, 0 bytes: cannot identify image file"),
    ("JPEG_COLOR", lambda f: jpeg(f)[: len(jpeg(f)) // 2], "image file is truncated"),
])
def test_undecodable_frames_end_the_stream_with_one_clear_error(encoding, make, words):
    """The SDK opens every image as a JPEG; one it cannot open used to end its feed for good
    (reported as "stopped streaming ... <_io.BytesIO object at 0x...>"), a truncated one raised
    OSError out of the iteration (a traceback in the demo)."""
    feed = camera_feed([make(sign(30, (640, 360)))], encoding, period_s=0.01)
    with FakeVector(handlers={"CameraFeed": feed}) as fake:
        cam = VectorSource(fake.serial, config_home=fake.home, **FAST)
        with pytest.raises(VectorError) as err:
            for _ in cam:
                pass
        stats = cam.stats()
        cam.close()
    assert err.value.reason == "image" and not err.value.retryable
    assert f"sent {MAX_BAD_IN_ROW} camera images in a row that cannot be decoded" in err.value.message
    assert words in err.value.message and "BytesIO" not in err.value.message and "\n" not in err.value.message
    assert "JPEG_COLOR or JPEG_GRAY" in err.value.hint
    assert stats["undecodable"] >= MAX_BAD_IN_ROW and stats["delivered"] == 0  # more may arrive before close


def test_a_few_bad_frames_among_good_ones_are_skipped_and_counted():
    good = jpeg(sign(220, (640, 360)))
    feed = camera_feed([good, b"", good[: len(good) // 3], good], period_s=0.02)
    with FakeVector(handlers={"CameraFeed": feed}) as fake:
        frames, stats = first_frames(fake, 6)
    assert all(f.array.shape == (360, 640, 3) for f in frames)
    assert stats["undecodable"] >= 4 and stats["delivered"] == 6


def test_a_camera_stream_that_ends_is_a_retryable_disconnect():
    with FakeVector(handlers={"CameraFeed": camera_feed([jpeg(sign(30, (640, 360)))], count=3)}) as fake:
        cam = VectorSource(fake.serial, config_home=fake.home, **FAST)
        seen = 0
        with pytest.raises(VectorError) as err:
            for _ in cam:
                seen += 1
        cam.close()
    assert seen <= 3 and err.value.reason == "disconnected" and err.value.retryable
    assert "stopped streaming camera frames" in err.value.message


def lose_control_after(seconds: float, requests: list):
    """BehaviorControl that grants each request, then takes control back after ``seconds``."""

    def handler(robot, protocol, request_iterator, context):
        for req in request_iterator:
            if req.WhichOneof("request_type") != "control_request":
                continue
            requests.append(time.monotonic())
            yield protocol.BehaviorControlResponse(control_granted_response=protocol.ControlGrantedResponse())
            time.sleep(seconds)
            yield protocol.BehaviorControlResponse(control_lost_event=protocol.ControlLostResponse())

    return handler


@pytest.mark.slow  # asserts on wall-clock time
def test_speaking_after_vector_took_control_back_asks_for_it_again():
    """The SDK holds a command 10 s for a grant it never asks for again; we ask, and it speaks at once."""
    requests: list[float] = []
    with FakeVector(handlers={"BehaviorControl": lose_control_after(0.2, requests)}) as fake:
        with VectorSource(fake.serial, config_home=fake.home, **FAST) as cam:
            time.sleep(0.6)  # control granted, then lost
            t0 = time.monotonic()
            cam.say("hello")
            took = time.monotonic() - t0
        assert fake.said == ["hello"]
    assert len(requests) == 2 and took < 5


def test_a_say_text_that_fails_or_refuses_is_a_vector_error():
    def refuse(robot, protocol, request, context):
        return protocol.SayTextResponse(status=protocol.ResponseStatus(code=protocol.ResponseStatus.FORBIDDEN))

    def crash(robot, protocol, request, context):
        import grpc

        context.abort(grpc.StatusCode.INTERNAL, "tts engine crashed")

    for handler, words in ((refuse, "Vector refused the command: FORBIDDEN"), (crash, "INTERNAL: tts engine crashed")):
        with FakeVector(handlers={"SayText": handler}) as fake, \
                VectorSource(fake.serial, config_home=fake.home, **FAST) as cam:
            with pytest.raises(VectorError, match=words):
                cam.say("hello")
            future = cam.say("hello", wait=False)
            assert isinstance(future.exception(5), VectorError)

    def silent(robot, protocol, request, context):  # no status at all: taken as done
        return protocol.SayTextResponse()

    with FakeVector(handlers={"SayText": silent}) as fake, \
            VectorSource(fake.serial, config_home=fake.home, **FAST) as cam:
        cam.say("hello")


def edit_config(fake: FakeVector, **values: str | None) -> None:
    ini = fake.home / ".anki_vector" / "sdk_config.ini"
    parser = configparser.ConfigParser()
    parser.read(ini)
    for key, value in values.items():
        if value is None:
            parser[fake.serial].pop(key, None)
        else:
            parser[fake.serial][key] = value
    with open(ini, "w") as f:
        parser.write(f)


@pytest.mark.slow  # asserts on wall-clock time
@pytest.mark.parametrize(("break_it", "words"), [
    (lambda fake: (fake.home / ".anki_vector" / "sdk_config.ini").write_text("guid = x\n"),
     "is not a valid SDK configuration: File contains no section headers."),
    (lambda fake: edit_config(fake, port="http"), "has port 'http', not a port number"),
    (lambda fake: fake.cert_path.write_text("not a certificate\n"), "is not a PEM certificate"),
    (lambda fake: edit_config(fake, cert=str(fake.home)), "cannot be read (Is a directory)"),
    (lambda fake: edit_config(fake, guid=None), "lacks guid"),
])
def test_a_broken_sdk_config_is_one_config_error_before_any_network(break_it, words):
    with FakeVector() as fake:
        break_it(fake)
        t0 = time.monotonic()
        with pytest.raises(VectorError) as err:
            VectorSource(fake.serial, config_home=fake.home, **FAST).open()
        assert time.monotonic() - t0 < 1.0  # refused before the SDK's connect timeout
        assert fake.calls["ProtocolVersion"] == 0
    assert err.value.reason == "config" and words in err.value.message and err.value.hint


# ---- the sign demo (python -m robot.signs --serial X) against these robots ------------------------


def run_signs(fake: FakeVector, monkeypatch, *extra: str) -> tuple[int, str, str]:
    """robot.signs.main in-process with HOME at the fake's config, a real model (ONNX Runtime)."""
    from robot.signs import main
    from tests.helpers.real_models import onnx_runtime

    monkeypatch.setenv("HOME", str(fake.home))
    runtime = onnx_runtime(GRAY_SPEC, weights=[-20.0, 20.0, 0.0], bias=[5.0, -15.0, 0.0])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["--serial", fake.serial, "--connect-timeout", "1", "--agree", "2", "--quiet", *extra],
                    runtime=runtime, labels=["a", "b", "background"], out=out)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("size", "make", "encoding"), [
    ((1280, 720), jpeg, "JPEG_COLOR"), ((320, 240), jpeg, "JPEG_COLOR"), ((640, 360), gray_jpeg, "JPEG_GRAY")])
def test_the_sign_demo_reads_signs_from_other_frames(monkeypatch, size, make, encoding):
    datas = [make(sign(v, size)) for v in (30,) * 6 + (220,) * 6]
    with FakeVector(handlers={"CameraFeed": camera_feed(datas, encoding)}) as fake:
        code, out, err = run_signs(fake, monkeypatch, "--max-frames", "14")
        said = list(fake.said)
    assert code == 0, err
    assert said[:2] == ["a", "b"]


def test_the_sign_demo_stops_on_undecodable_frames_with_one_line(monkeypatch):
    feed = camera_feed([b"\x00" * 100], "RAW_GRAY", period_s=0.01)
    with FakeVector(handlers={"CameraFeed": feed}) as fake:
        code, out, err = run_signs(fake, monkeypatch, "--max-frames", "14")
    assert code == 1 and "Traceback" not in err  # the robot failed, not the command: exit 1
    assert err.startswith("robot.signs: error: Vector 00e20100 sent 10 camera images in a row that cannot be decoded")
    assert "RAW_GRAY, 100 bytes" in err


def test_a_robot_without_an_rpc_the_sdk_needs_is_named_so():
    def unimplemented(robot, protocol, request, context):
        import grpc

        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")

    with FakeVector(handlers={"SDKInitialization": unimplemented}) as fake, pytest.raises(VectorError) as err:
        VectorSource(fake.serial, config_home=fake.home, **FAST).open()
    assert "does not implement a call the SDK needs: StatusCode.UNIMPLEMENTED" in err.value.message
    assert "firmware or wire-pod" in err.value.hint


@pytest.mark.slow  # the SDK waits 5 s for the first robot state
def test_an_event_stream_without_robot_state_is_a_clear_retryable_error():
    def quiet(robot, protocol, request, context):
        robot._call_event(context).wait()
        yield from ()

    with FakeVector(handlers={"EventStream": quiet}) as fake, pytest.raises(VectorError) as err:
        VectorSource(fake.serial, config_home=fake.home, **FAST).open()
    assert err.value.reason == "disconnected" and err.value.retryable
    assert "its event stream sent no robot state" in err.value.message and "restart the robot" in err.value.hint


def certificate(cn: str, san: list[str] | None, days: float = 2.0) -> tuple[bytes, bytes]:
    """A self-signed robot certificate as another fake might make it: CN, optional SAN, validity."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=3))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(s) for s in san]), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@pytest.mark.parametrize(("pair", "words"), [
    (lambda: certificate("Vector-T3S7", None), None),  # the CN alone: gRPC accepts it
    (lambda: certificate("Vector-T3S7", ["localhost"]),
     "its certificate's subjectAltName is localhost, not Vector-T3S7"),
    (lambda: certificate("Vector-T3S7", ["Vector-T3S7"], days=-1), "certificate has expired"),
])
def test_robot_certificates_made_another_way(pair, words):
    """A SAN naming something else used to be diagnosed as "restart the robot": the CN matched."""
    fake = FakeVector()
    fake._cert_pem, fake._key_pem = pair()
    with fake:
        if words is None:
            frames, _ = first_frames(fake, 1)
            assert frames[0].array.shape == (360, 640, 3)
            return
        with pytest.raises(VectorError) as err:
            VectorSource(fake.serial, config_home=fake.home, **FAST).open()
    assert err.value.reason == "certificate" and words in err.value.message
