"""FakeVector: a loopback Vector robot that the real SDK client connects to unmodified.

It is a TLS gRPC server built from the SDK's own generated servicer, listening on
127.0.0.1 (ephemeral port) with a self-signed certificate named after the robot. It checks
the ``authorization: Bearer <guid>`` header on every call, writes a temporary
``.anki_vector/sdk_config.ini`` (with a ``port`` key, which the SDK honours), streams JPEG
camera frames at a set rate from a video, an image folder or arrays, and records what the
robot was made to say and show. Used by the tests and by ``robot.signs --fake``.

>>> with FakeVector(frames="frames/", fps=15) as robot:        # doctest: +SKIP
...     with VectorSource(robot.serial, config_home=robot.home) as cam:
...         frame = next(iter(cam))
...     robot.said, robot.shown

Needs ``grpcio`` and ``cryptography`` (both installed with the SDK) and the SDK itself for
the generated messages.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edgekit.errors import BackendUnavailable, CameraError
from edgekit.image import IMAGE_SUFFIXES, ImageReadError, read_image
from edgekit.vector.connection import close_at_exit, forget_at_exit
from edgekit.vector.face import decode_rgb565

DEFAULT_NAME = "Vector-T3S7"
DEFAULT_SERIAL = "00e20100"
CAMERA_SIZE = (640, 360)  # what a real Vector streams (width, height)
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".m4v", ".webm")


def make_certificate(name: str) -> tuple[bytes, bytes]:
    """A self-signed certificate (PEM) and its EC P-256 key (PEM) whose CN and SAN are ``name``.

    The SDK pins the robot's certificate as its only root and overrides the TLS target name
    with the robot's name, so both fields must carry that name for the handshake to pass.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def write_sdk_config(
    home: str | Path, serial: str, name: str, ip: str, cert_pem: bytes, guid: str, port: int | None = None
) -> Path:
    """Write ``<home>/.anki_vector/sdk_config.ini`` and the certificate file, as the SDK's
    configure tool would; returns the ini path. Existing sections for other serials are kept."""
    import configparser

    cfg_dir = Path(home) / ".anki_vector"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    cert_path = cfg_dir / f"{name}-{serial}.cert"
    cert_path.write_bytes(cert_pem)
    ini = cfg_dir / "sdk_config.ini"
    parser = configparser.ConfigParser(strict=False)
    parser.read(ini)
    parser[serial] = {"cert": str(cert_path), "ip": ip, "name": name, "guid": guid}
    if port is not None:
        parser[serial]["port"] = str(port)
    with open(ini, "w", encoding="utf-8") as f:
        parser.write(f)
    return ini


def load_frames(
    source: str | Path | Sequence[np.ndarray] | None,
    size: tuple[int, int] | None = CAMERA_SIZE,
    hold: int = 1,
    max_frames: int = 3000,
    jpeg_quality: int = 90,
) -> list[bytes]:
    """Camera frames as JPEG bytes, encoded once up front so streaming costs nothing.

    Args:
        source: an image folder (sorted by name), a video file, a sequence of OpenCV
            frames (gray or BGR uint8), or None for synthetic numbered frames.
        size: ``(width, height)`` every frame is resized to (a real Vector sends 640x360);
            None keeps each frame's size.
        hold: repeat every source image this many consecutive frames (a sign held up).
        max_frames: stop reading a video after this many frames.
        jpeg_quality: OpenCV JPEG quality, 0-100.
    """
    frames: Iterable[np.ndarray]
    if source is None:
        frames = (_numbered_frame(i, size or CAMERA_SIZE) for i in range(30))
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise CameraError(f"{path} holds no images", f"put {', '.join(IMAGE_SUFFIXES)} files there")
            try:
                frames = [read_image(p) for p in files]
            except ImageReadError as exc:
                raise CameraError(str(exc), "remove or replace that file") from exc
        elif path.is_file():
            frames = _read_video(path, max_frames)
        else:
            raise CameraError(f"{path} does not exist", "give an image folder or a video file")
    else:
        frames = source
    encoded = []
    for frame in frames:
        if size is not None and frame.shape[1::-1] != tuple(size):
            frame = cv2.resize(frame, tuple(size), interpolation=cv2.INTER_AREA)
        ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, int(jpeg_quality)])
        if not ok:
            raise CameraError("OpenCV could not JPEG-encode a frame")
        encoded.extend([buf.tobytes()] * max(1, int(hold)))
        if len(encoded) >= max_frames:
            break
    if not encoded:
        raise CameraError(f"no frames read from {source}", "check the file plays and is not empty")
    return encoded[:max_frames]


def _read_video(path: Path, max_frames: int) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():  # OpenCV reports a bad file by returning a closed capture, not an error
        raise CameraError(f"OpenCV cannot open the video {path}", f"use one of {', '.join(VIDEO_SUFFIXES)}")
    frames = []
    try:
        while len(frames) < max_frames:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(frame)
    finally:
        cap.release()
    return frames


def _numbered_frame(i: int, size: tuple[int, int]) -> np.ndarray:
    w, h = size
    frame = np.full((h, w, 3), (40 + 7 * i) % 256, dtype=np.uint8)
    cv2.putText(frame, str(i), (w // 3, h // 2), cv2.FONT_HERSHEY_SIMPLEX, 3.0, (255, 255, 255), 5)
    return frame


class _DaemonExecutor(Executor):
    """One daemon thread per RPC.

    grpc's server runs handlers on the executor it is given; a ThreadPoolExecutor's workers
    are joined at interpreter exit, so a forgotten FakeVector with an open stream would hang
    the process. Daemon threads cannot, and a fake robot handles a handful of RPCs.
    """

    def __init__(self) -> None:
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        fut: Future = Future()

        def run() -> None:
            try:
                if fut.set_running_or_notify_cancel():
                    fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the future, as ThreadPoolExecutor does
                fut.set_exception(exc)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        t = threading.Thread(target=run, name="FakeVector-rpc", daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False, timeout: float = 5.0) -> None:
        if not wait:
            return
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    @property
    def alive(self) -> int:
        with self._lock:
            return sum(t.is_alive() for t in self._threads)


class FakeVector:
    """A loopback Vector robot; see the module docstring.

    Args:
        frames: image folder, video file, sequence of OpenCV frames, or None (numbered frames).
        fps: camera frame rate streamed to each CameraFeed subscriber.
        name: robot name, the certificate's CN and SAN (``Vector-XXXX``).
        serial: the robot's serial, the sdk_config.ini section.
        guid: the secret the client must send as ``Bearer``; random when omitted.
        loop: restart the frame sequence after the last frame; when False, the camera goes
            quiet after it (``exhausted`` is set just before the last frame is sent).
        hold: show every source image for this many frames.
        size: ``(width, height)`` of streamed frames (None: as given).
        grant_control: answer behaviour-control requests (False models another app holding it).
        home: where to write ``.anki_vector/`` (default: a temporary directory removed by stop()).
        config_guid, config_name: write a different guid/name into sdk_config.ini than the
            robot uses (to test authentication and certificate-name errors).
        say_delay_s: how long SayText takes to answer.

    After ``start()`` (or ``with``): ``port``, ``home``, ``cert_path``; records ``said``
    (texts), ``shown`` (decoded 96x184 RGB face images), ``calls`` (RPC name counts),
    ``frames_sent``, ``last_image_id``. Thread-safe to read while running.
    """

    def __init__(
        self,
        frames: str | Path | Sequence[np.ndarray] | None = None,
        fps: float = 15.0,
        name: str = DEFAULT_NAME,
        serial: str = DEFAULT_SERIAL,
        guid: str | None = None,
        loop: bool = True,
        hold: int = 1,
        size: tuple[int, int] | None = CAMERA_SIZE,
        grant_control: bool = True,
        home: str | Path | None = None,
        config_guid: str | None = None,
        config_name: str | None = None,
        say_delay_s: float = 0.0,
        jpeg_quality: int = 90,
    ):
        if fps <= 0:
            raise ValueError("fps must be positive")
        self.fps = float(fps)
        self.name = name
        self.serial = serial
        self.guid = guid or secrets.token_urlsafe(16)
        self.loop = loop
        self.grant_control = grant_control
        self.say_delay_s = say_delay_s
        self._frames = load_frames(frames, size=size, hold=hold, jpeg_quality=jpeg_quality)
        self._home_arg = Path(home) if home is not None else None
        self._config_guid = config_guid
        self._config_name = config_name
        self.home: Path | None = None
        self.cert_path: Path | None = None
        self.port: int | None = None
        self.said: list[str] = []
        self.shown: list[np.ndarray] = []
        self.calls: collections.Counter[str] = collections.Counter()
        self.frames_sent = 0
        self.last_image_id = 0
        self.exhausted = threading.Event()
        self._image_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._call_done: set[threading.Event] = set()
        self._streaming = 0
        self._server = None
        self._executor: _DaemonExecutor | None = None
        self._cert_pem: bytes | None = None
        self._key_pem: bytes | None = None
        self._own_home = False

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> FakeVector:
        """Generate the certificate and config (first time only) and start serving."""
        grpc = _import_grpc()
        if self._server is not None:
            return self
        if self._cert_pem is None:
            self._cert_pem, self._key_pem = make_certificate(self.name)
        if self.home is None:
            if self._home_arg is None:
                self.home = Path(tempfile.mkdtemp(prefix="fakevector-"))
                self._own_home = True
            else:
                self.home = self._home_arg
        self._stopped.clear()
        self._executor = _DaemonExecutor()
        server = grpc.server(self._executor, interceptors=[_bearer_check(self)])
        _add_servicer(server, self)
        creds = grpc.ssl_server_credentials([(self._key_pem, self._cert_pem)])
        # port 0 the first time; the same port on restart, so the client's config stays valid
        port = server.add_secure_port(f"127.0.0.1:{self.port or 0}", creds)
        if port == 0:
            raise CameraError(f"FakeVector could not bind 127.0.0.1:{self.port}", "is another process using it?")
        self.port = port
        server.start()
        self._server = server
        # a fake left running would keep a connected SDK client's streams open at exit
        close_at_exit(self)
        ini = write_sdk_config(
            self.home,
            self.serial,
            self._config_name or self.name,
            "127.0.0.1",
            self._cert_pem,
            self._config_guid or self.guid,
            port=self.port,
        )
        self.cert_path = ini.parent / f"{self._config_name or self.name}-{self.serial}.cert"
        return self

    def stop(self, remove_home: bool = True) -> None:
        """Stop serving at once (open streams end, as when a robot vanishes) and join all
        handler threads. ``remove_home=False`` keeps the config so :meth:`start` can resume
        on the same port."""
        server, self._server = self._server, None
        forget_at_exit(self)
        self._stopped.set()
        with self._lock:
            for ev in self._call_done:
                ev.set()
        if server is not None:
            server.stop(grace=None).wait(5)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if remove_home and self._own_home and self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None

    def vanish(self) -> None:
        """Disappear mid-stream, keeping the config so :meth:`start` brings the robot back."""
        self.stop(remove_home=False)

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def handler_threads(self) -> int:
        """RPC handler threads still alive (0 after stop())."""
        return self._executor.alive if self._executor else 0

    def __enter__(self) -> FakeVector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def close(self) -> None:
        """Same as :meth:`stop`."""
        self.stop()

    @property
    def frame_count(self) -> int:
        """Frames in one pass of the sequence (after ``hold``)."""
        return len(self._frames)

    def env(self) -> dict[str, str]:
        """Environment for a child process whose SDK should find this robot's config."""
        return {**os.environ, "HOME": str(self.home)}

    # ---- helpers for the servicer ---------------------------------------------------
    def _record(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1

    def _call_event(self, context) -> threading.Event:
        """An event set when this RPC ends (client cancel, deadline, or our stop())."""
        done = threading.Event()
        with self._lock:
            self._call_done.add(done)
        if self._stopped.is_set():
            done.set()
        context.add_callback(done.set)
        return done

    def _forget(self, done: threading.Event) -> None:
        with self._lock:
            self._call_done.discard(done)


def _import_grpc():
    try:
        import grpc
    except ImportError as exc:  # pragma: no cover - grpcio comes with the SDK
        raise BackendUnavailable("FakeVector needs grpcio", "pip install 'edgekit[vector]'") from exc
    return grpc


def _sdk_modules():
    try:
        from anki_vector.messaging import external_interface_pb2, external_interface_pb2_grpc, protocol
    except ImportError as exc:
        raise BackendUnavailable(
            "FakeVector needs the Vector SDK's messages (module anki_vector)", "pip install 'edgekit[vector]'"
        ) from exc
    return protocol, external_interface_pb2, external_interface_pb2_grpc


def _bearer_check(robot: FakeVector):
    """A server interceptor refusing every call without ``authorization: Bearer <guid>``, as
    the robot does (the SDK turns the status into VectorUnauthenticatedException)."""
    grpc = _import_grpc()
    # (request_streaming, response_streaming) -> the matching handler factory
    factories = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }

    def deny(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid or missing bearer token")

    def deny_stream(request, context):
        deny(request, context)
        yield from ()

    class BearerCheck(grpc.ServerInterceptor):
        def intercept_service(self, continuation, handler_call_details):
            handler = continuation(handler_call_details)
            metadata = dict(handler_call_details.invocation_metadata or ())
            if handler is None or metadata.get("authorization") == f"Bearer {robot.guid}":
                return handler
            make = factories[(handler.request_streaming, handler.response_streaming)]
            return make(
                deny_stream if handler.response_streaming else deny,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )

    return BearerCheck()


def _add_servicer(server: Any, robot: FakeVector) -> None:
    """Register a servicer built from the SDK's generated ExternalInterfaceServicer."""
    protocol, pb2, pb2_grpc = _sdk_modules()
    ok = protocol.ResponseStatus(code=protocol.ResponseStatus.OK)

    def status_ok(message_cls):
        msg = message_cls()
        if "status" in message_cls.DESCRIPTOR.fields_by_name:
            msg.status.CopyFrom(ok)
        return msg

    class Servicer(pb2_grpc.ExternalInterfaceServicer):
        """What the SDK's connect sequence, camera, speech and face need; every other unary
        call is acknowledged with an empty OK response and counted in ``robot.calls``."""

        def ProtocolVersion(self, request, context):
            robot._record("ProtocolVersion")
            return protocol.ProtocolVersionResponse(
                result=protocol.ProtocolVersionResponse.SUCCESS, host_version=protocol.PROTOCOL_VERSION_CURRENT
            )

        def BehaviorControl(self, request_iterator, context):
            robot._record("BehaviorControl")
            try:
                for req in request_iterator:
                    kind = req.WhichOneof("request_type")
                    if kind == "control_request" and robot.grant_control:
                        granted = protocol.ControlGrantedResponse()
                        yield protocol.BehaviorControlResponse(control_granted_response=granted)
                    elif kind == "control_release":
                        yield protocol.BehaviorControlResponse(control_lost_event=protocol.ControlLostResponse())
            except Exception:  # noqa: BLE001, S110 - the client went away; a robot just drops the stream
                return

        def EventStream(self, request, context):
            robot._record("EventStream")
            done = robot._call_event(context)
            try:
                # the SDK's connect() waits for one robot_state (it reads the pose from it)
                while True:
                    state = protocol.RobotState(pose=protocol.PoseStruct(q0=1.0), head_angle_rad=0.0)
                    yield protocol.EventResponse(status=ok, event=protocol.Event(robot_state=state))
                    if done.wait(0.5):
                        return
            finally:
                robot._forget(done)

        def CameraFeed(self, request, context):
            robot._record("CameraFeed")
            done = robot._call_event(context)
            frames, n = robot._frames, len(robot._frames)
            period = 1.0 / robot.fps
            with robot._lock:
                robot._streaming += 1
            try:
                t0 = time.monotonic()
                for k in itertools.count():
                    if not robot.loop and k >= n:
                        done.wait()  # camera stays on, nothing new: a covered lens
                        return
                    # absolute deadlines, so the rate does not drift with send time
                    if done.wait(max(0.0, t0 + k * period - time.monotonic())):
                        return
                    image_id = next(robot._image_ids)
                    with robot._lock:
                        robot.frames_sent += 1
                        robot.last_image_id = image_id
                    if not robot.loop and k == n - 1:
                        robot.exhausted.set()
                    yield protocol.CameraFeedResponse(
                        frame_time_stamp=int(time.monotonic() * 1000) & 0xFFFFFFFF,
                        image_id=image_id,
                        image_encoding=protocol.ImageChunk.JPEG_COLOR,
                        data=frames[k % n],
                    )
            finally:
                with robot._lock:
                    robot._streaming -= 1
                robot._forget(done)

        def IsImageStreamingEnabled(self, request, context):
            robot._record("IsImageStreamingEnabled")
            with robot._lock:
                on = robot._streaming > 0
            return protocol.IsImageStreamingEnabledResponse(is_image_streaming_enabled=on)

        def GetCameraConfig(self, request, context):
            robot._record("GetCameraConfig")
            # the numbers a real Vector reports (fov ~ 90 x 50 degrees)
            return protocol.CameraConfigResponse(
                focal_length_x=290.0, focal_length_y=290.0, center_x=320.0, center_y=180.0,
                fov_x=1.5708, fov_y=0.8727, min_camera_exposure_time_ms=1, max_camera_exposure_time_ms=67,
                min_camera_gain=0.1, max_camera_gain=3.9,
            )

        def SayText(self, request, context):
            robot._record("SayText")
            if robot.say_delay_s:
                time.sleep(robot.say_delay_s)
            with robot._lock:
                robot.said.append(request.text)
            return protocol.SayTextResponse(status=ok, state=protocol.SayTextResponse.FINISHED)

        def DisplayFaceImageRGB(self, request, context):
            robot._record("DisplayFaceImageRGB")
            try:
                image = decode_rgb565(request.face_data)
            except ValueError as exc:
                context.abort(_import_grpc().StatusCode.INVALID_ARGUMENT, str(exc))
            with robot._lock:
                robot.shown.append(image)
            return status_ok(protocol.DisplayFaceImageRGBResponse)

    service = pb2.DESCRIPTOR.services_by_name["ExternalInterface"]
    for method in service.methods:
        if method.client_streaming or method.server_streaming or method.name in Servicer.__dict__:
            continue
        response_cls = getattr(protocol, method.output_type.name)

        def acknowledge(self, request, context, _name=method.name, _cls=response_cls):
            robot._record(_name)
            return status_ok(_cls)

        setattr(Servicer, method.name, acknowledge)
    pb2_grpc.add_ExternalInterfaceServicer_to_server(Servicer(), server)
