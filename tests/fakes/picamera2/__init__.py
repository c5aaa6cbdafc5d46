"""A fake ``picamera2`` package for tests (the real one needs a Raspberry Pi's libcamera).

It checks the calls a caller makes the way the real library would reject them (configure
before start, start before capture, lores no larger than main and YUV420 before the Pi 5,
known formats only) and records them in ``CALLS``. ``capture_array`` returns ``SCENE`` (a
BGR image, settable) resized to the stream size and packed in the byte order picamera2
uses for that format: "RGB888" -> B,G,R; "BGR888" -> R,G,B; "XRGB8888" -> B,G,R,255;
"XBGR8888" -> R,G,B,255; "YUV420" -> I420 planes with rows padded to a 64-byte stride.

Knobs (module attributes, reset with ``reset()``): ``CAMERAS`` (attached cameras),
``PI5`` (lores may be RGB), ``HANG_AFTER`` (capture_array and capture_request block after that
many frames, like a camera whose cable came loose, until ``close()``); ``IMX500_OUTPUTS`` (a list,
or ``frame number -> list``) and ``IMX500_UPLOAD_FRAMES`` for the AI Camera
(:mod:`picamera2.devices`: each frame's metadata carries the outputs flattened in Fortran order, as
libcamera's ``CnnOutputTensor`` does, and its ``ScalerCrop``, ``SCALER_CROP``); ``STAMP`` writes
each frame's number (mod 256) into its top-left pixel, so a test can tell which frame it holds.

``capture_request`` hands a :class:`CompletedRequest` (``make_array``, ``get_metadata``,
``release``) the caller must release, as picamera2 does; ``HELD`` lists those not released yet.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeoutError

import cv2
import numpy as np

FORMATS = ("RGB888", "BGR888", "XRGB8888", "XBGR8888", "YUV420")
DEFAULT_SIZE = (640, 480)


def _default_scene() -> np.ndarray:
    y, x = np.mgrid[0:120, 0:160]
    return np.stack([x * 255 // 159, y * 255 // 119, (x + y) % 256], -1).astype(np.uint8)


def reset() -> None:
    """Restore the default knobs and clear the call log."""
    global CAMERAS, PI5, HANG_AFTER, SCENE, IMX500_OUTPUTS, IMX500_UPLOAD_FRAMES, SCALER_CROP, STAMP
    global IMX500_INPUT_SIZE, IMX500_PRESERVE_AR
    CAMERAS = [{"Model": "imx708", "Num": 0}]
    PI5 = False
    HANG_AFTER = None
    SCENE = _default_scene()
    IMX500_OUTPUTS = [np.linspace(0, 1, 10, dtype=np.float32)]
    IMX500_UPLOAD_FRAMES = 2
    SCALER_CROP = (0, 0, 4056, 3040)  # libcamera's ScalerCrop: the sensor window the ISP output shows
    STAMP = False
    IMX500_INPUT_SIZE, IMX500_PRESERVE_AR = (28, 28), False  # the network's input (w, h); its intrinsics' flag
    CALLS.clear()
    INSTANCES.clear()
    NETWORKS.clear()
    HELD.clear()


CALLS: list[tuple] = []
INSTANCES: list = []
NETWORKS: list[str] = []  # .rpk files an IMX500 object has loaded (picamera2.devices)
IMX500_OUTPUTS: list[np.ndarray] = []  # the tensors the network gives each frame (as the model lays them out)
IMX500_UPLOAD_FRAMES = 2  # frames without outputs while the network uploads
CAMERAS: list[dict] = []
HELD: list = []  # completed requests handed out and not released
SCALER_CROP = (0, 0, 4056, 3040)
STAMP = False
IMX500_INPUT_SIZE = (28, 28)
IMX500_PRESERVE_AR = False
PI5 = False
HANG_AFTER: int | None = None
SCENE: np.ndarray = _default_scene()
reset()


def pack(bgr: np.ndarray, fmt: str) -> np.ndarray:
    """``bgr`` laid out as picamera2 returns format ``fmt``."""
    h, w = bgr.shape[:2]
    pad = np.full((h, w, 1), 255, np.uint8)
    if fmt == "RGB888":
        return bgr.copy()
    if fmt == "BGR888":
        return np.ascontiguousarray(bgr[..., ::-1])
    if fmt == "XRGB8888":
        return np.concatenate([bgr, pad], -1)
    if fmt == "XBGR8888":
        return np.concatenate([bgr[..., ::-1], pad], -1)
    if fmt == "YUV420":
        i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)  # (h*3/2, w)
        stride = -(-w // 64) * 64
        y, chroma = i420[:h], i420[h:].reshape(-1, w // 2)  # U rows then V rows, w/2 each
        out = np.zeros((h * 3 // 2, stride), np.uint8)
        out[:h, :w] = y
        halves = out.reshape(-1, stride // 2)  # chroma rows are half a stride
        halves[2 * h : 2 * h + chroma.shape[0], : w // 2] = chroma
        return out
    raise ValueError(fmt)


class Picamera2:
    """Just enough of picamera2.Picamera2 for edgekit's source."""

    def __init__(self, camera_num: int = 0):
        CALLS.append(("__init__", camera_num))
        if camera_num >= len(CAMERAS):
            raise IndexError("list index out of range")  # what picamera2 raises with no camera
        self.camera_num = camera_num
        self.config: dict | None = None
        self.started = False
        self.closed = False
        self.frames = 0
        self.first_capture_logged = False
        self._released = threading.Event()
        INSTANCES.append(self)

    @staticmethod
    def global_camera_info() -> list[dict]:
        return list(CAMERAS)

    def create_video_configuration(self, main=None, lores=None, raw=None, transform=None, colour_space=None,
                                   buffer_count=6, controls=None, display="main", encode="main", queue=True,
                                   sensor=None, use_case="video"):  # fmt: skip
        CALLS.append(("create_video_configuration", {"main": main, "lores": lores, "controls": controls,
                                                     "buffer_count": buffer_count, "queue": queue}))  # fmt: skip
        main = {"format": "XBGR8888", "size": DEFAULT_SIZE, **(main or {})}
        for stream in (main, lores):
            if stream is not None and stream.get("format") not in FORMATS:
                raise RuntimeError(f"Format {stream.get('format')} not supported")
        if lores is not None:
            lores = {"format": "YUV420", **lores}
            if "size" not in lores:
                raise RuntimeError("lores stream needs a size")
            if lores["size"][0] > main["size"][0] or lores["size"][1] > main["size"][1]:
                raise RuntimeError("lores stream dimensions may not exceed main stream")
            if not PI5 and lores["format"] != "YUV420":
                raise RuntimeError("lores stream must be YUV")
        return {"main": main, "lores": lores, "controls": dict(controls or {}), "queue": queue,
                "buffer_count": buffer_count}  # fmt: skip

    def configure(self, config: dict) -> None:
        CALLS.append(("configure", config))
        if self.started:
            raise RuntimeError("Camera must be stopped before configuring")
        self.config = config

    def camera_configuration(self) -> dict:
        return self.config

    def create_preview_configuration(self, main=None, lores=None, controls=None, buffer_count=4, **_):
        CALLS.append(("create_preview_configuration", {"controls": controls, "buffer_count": buffer_count}))
        return {"main": {"format": "XBGR8888", "size": DEFAULT_SIZE, **(main or {})}, "lores": lores,
                "raw": {"format": "SRGGB10_CSI2P", "size": (2028, 1520)},  # the IMX500's binned mode
                "controls": dict(controls or {}), "buffer_count": buffer_count}

    def start(self, config: dict | None = None, show_preview=False) -> None:
        CALLS.append(("start",) if config is None else ("start", config))
        if config is not None:  # picamera2 configures first when given a configuration
            self.configure(config)
        if self.config is None:
            raise RuntimeError("Camera has not been configured")
        self.started = True

    def capture_metadata(self, wait=None) -> dict:
        """The next frame's metadata; with an IMX500 network loaded (picamera2.devices.IMX500), its
        output tensors once the upload's frames (``IMX500_UPLOAD_FRAMES``) have passed."""
        if not self.started:
            raise RuntimeError("Camera is not running")
        self.frames += 1
        return self._metadata()

    def _metadata(self) -> dict:
        """Frame ``self.frames``'s metadata: its number, ScalerCrop and, past the upload, the outputs."""
        metadata = {"SensorTimestamp": self.frames, "ScalerCrop": tuple(SCALER_CROP)}
        if NETWORKS and self.frames > IMX500_UPLOAD_FRAMES:
            tensors = IMX500_OUTPUTS(self.frames) if callable(IMX500_OUTPUTS) else IMX500_OUTPUTS
            flat = [np.asarray(o, np.float32).ravel(order="F") for o in tensors]
            metadata["CnnOutputTensor"] = np.concatenate(flat).tolist()
            metadata["CnnOutputTensorInfo"] = [tuple(np.shape(o)) for o in tensors]
        return metadata

    def capture_request(self, wait=None, signal_function=None, flush=None):
        """The next completed request (the caller releases it); ``wait=False``: a job for :meth:`wait`."""
        if not self.started:
            raise RuntimeError("Camera is not running")
        if not any(c[0] == "capture_request" for c in CALLS):
            CALLS.append(("capture_request", wait))  # the grabber asks continuously: log once
        job = _Job("main", request=True)
        return job if wait is False else self.wait(job)

    def cancel_all_and_flush(self) -> None:
        CALLS.append(("cancel_all_and_flush",))

    def stop(self) -> None:
        CALLS.append(("stop",))
        self.started = False

    def close(self) -> None:
        CALLS.append(("close",))
        self.closed = True
        self.started = False
        self._released.set()

    def capture_array(self, name: str = "main", wait=None, signal_function=None):
        """Blocking by default; ``wait=False`` returns a job for :meth:`wait`, as picamera2 does."""
        if not self.started:
            raise RuntimeError("Camera is not running")
        if not (self.config and self.config.get(name)):
            raise KeyError(f"stream {name!r} is not configured")
        job = _Job(name)
        if not self.first_capture_logged:
            self.first_capture_logged = True  # the grabber captures continuously: log once
            CALLS.append(("capture_array", name, wait))
        return job if wait is False else self.wait(job)

    def wait(self, job: _Job, timeout: float | None = None) -> np.ndarray:
        """The job's array once its frame completes; concurrent.futures.TimeoutError after
        ``timeout`` seconds, like picamera2's Job.get_result."""
        if HANG_AFTER is not None and self.frames >= HANG_AFTER:
            if not self._released.wait(timeout):  # a dead camera: the request never completes
                raise FutureTimeoutError()
            raise RuntimeError("Camera closed")
        if not self.started:
            raise RuntimeError("Camera is not running")
        time.sleep(1.0 / float(self.config["controls"].get("FrameRate", 100.0)))
        self.frames += 1
        stream = self.config[job.name]
        w, h = stream["size"]
        array = pack(cv2.resize(SCENE, (w, h), interpolation=cv2.INTER_AREA), stream["format"])
        if STAMP:
            array[0, 0, :3] = self.frames % 256
        return CompletedRequest(self.frames, {job.name: array}, self._metadata()) if job.request else array


class _Job:
    def __init__(self, name: str, request: bool = False):
        self.name = name
        self.request = request


class CompletedRequest:
    """A completed request: one frame's buffers and metadata, held until :meth:`release`."""

    def __init__(self, frame: int, arrays: dict, metadata: dict):
        self.frame, self._arrays, self._metadata = frame, arrays, metadata
        self.released = False
        HELD.append(self)

    def make_array(self, name: str) -> np.ndarray:
        if self.released:
            raise RuntimeError("request already released")
        return self._arrays[name].copy()  # picamera2 copies out of the camera's buffer

    def get_metadata(self) -> dict:
        if self.released:
            raise RuntimeError("request already released")
        return dict(self._metadata)

    def release(self) -> None:
        if self.released:
            raise RuntimeError("CompletedRequest: lock now has negative ref_count")  # picamera2's words
        self.released = True
        HELD.remove(self)
        CALLS.append(("release", self.frame))
