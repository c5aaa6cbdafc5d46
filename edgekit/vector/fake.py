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
the generated messages. The frames are prepared by :mod:`edgekit.vector.fake_frames`, the
RPCs answered by :mod:`edgekit.vector.fake_servicer`.
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
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from pathlib import Path

import numpy as np

from edgekit.errors import CameraError
from edgekit.vector.connection import close_at_exit, forget_at_exit

# Frames and the gRPC servicer live in their own modules; these names stay importable from
# here, where tests and robot/ have always found them.
from edgekit.vector.fake_frames import CAMERA_SIZE as CAMERA_SIZE
from edgekit.vector.fake_frames import VIDEO_SUFFIXES as VIDEO_SUFFIXES
from edgekit.vector.fake_frames import load_frames as load_frames
from edgekit.vector.fake_servicer import add_servicer, bearer_check, import_grpc

DEFAULT_NAME = "Vector-T3S7"
DEFAULT_SERIAL = "00e20100"


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
        handlers: RPC name -> ``handler(robot, protocol, request, context)`` replacing the
            fake's own (see :mod:`edgekit.vector.fake_servicer`): a robot that behaves
            differently (gray frames, a stream that ends, control lost, a failing SayText).
        window: ``(width, height)`` of the centred window the model reads: images that fit four
            times into it are held up inside it (see :func:`~edgekit.vector.fake_frames.load_frames`).

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
        handlers: dict | None = None,
        window: tuple[int, int] | None = None,
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
        self.handlers = dict(handlers or {})
        self._frames = load_frames(frames, size=size, hold=hold, jpeg_quality=jpeg_quality, window=window)
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
        grpc = import_grpc()
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
        server = grpc.server(self._executor, interceptors=[bearer_check(self)])
        add_servicer(server, self)
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
        """True between start() and stop()."""
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
