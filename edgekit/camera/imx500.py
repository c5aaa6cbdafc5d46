"""The Raspberry Pi AI Camera (Sony IMX500) as a camera source that shares the ``imx500`` backend's picamera2.

The network runs in the sensor and its outputs ride on each frame's metadata, so the frames a run
shows, saves and publishes must be the very frames those outputs belong to. picamera2 allows one
``Picamera2`` per camera, and the network must be loaded (``IMX500(rpk)``) before it is created,
so the ``imx500`` backend (:mod:`edgekit.runtime.imx500`) opens it and this source reads it: each
frame is one completed request (``capture_request``), its pixels copied (``make_array("main")``)
and its metadata kept (``get_metadata()``) before the request goes back (``release()``). The
frame carries that metadata (:attr:`~edgekit.camera.base.Frame.metadata`) and the pipeline hands it
to the backend's ``infer``, which reads that frame's outputs: never a later frame's.

Frames without outputs (the network still uploading to the sensor) are not handed on: they are
said once and counted (``stats()["without_outputs"]``); none with outputs for ``timeout_s`` is one
error naming why, as is a camera that stops delivering.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

import numpy as np

from edgekit.camera.base import DEFAULT_OPEN_TIMEOUT_S, DEFAULT_TIMEOUT_S, LatestFrameSource
from edgekit.camera.picamera import PICAMERA2_TO_BGR
from edgekit.errors import CameraError, CameraUnavailable

log = logging.getLogger(__name__)

NEEDS_BACKEND = (
    "give a bundle built for --target imx500 (its backend opens the sensor): "
    "edgekit run BUNDLE --camera imx500"
)


class NoOutputsYet(RuntimeError):
    """A frame without the network's outputs: a read error whose words the stall message repeats."""


class _RequestReader:
    """The grabber's ``read()``: one completed request -> (ok, BGR array, metadata), the request released.

    The request is asked for asynchronously and waited for in ``poll_s`` slices (picamera2's
    ``capture_request(wait=False)`` returns a job, ``Picamera2.wait(job, timeout)`` its request), so
    a camera that stops shows as timed-out reads the grabber can notice ``close()`` between.
    """

    def __init__(self, cam: Any, runtime: Any, convert: Callable[[np.ndarray], np.ndarray], poll_s: float):
        self._cam, self._runtime, self._convert, self._poll_s = cam, runtime, convert, poll_s
        self._job: Any = None
        self.without_outputs = 0

    def __call__(self) -> tuple[bool, np.ndarray | None, dict | None]:
        if self._job is None:
            self._job = self._cam.capture_request(wait=False)
        try:
            request = self._cam.wait(self._job, timeout=self._poll_s)
        except (TimeoutError, FutureTimeoutError):
            return False, None, None  # still pending: waited for again on the next read
        except Exception:
            self._job = None
            raise
        self._job = None
        try:
            array = request.make_array("main")  # a copy (picamera2 request.py): safe after release
            metadata = request.get_metadata()
        finally:
            request.release()  # back to the camera at once: it has 12 buffers, not one per frame we keep
        if not self._runtime.has_outputs(metadata):
            self.without_outputs += 1
            if self.without_outputs == 1:
                log.warning("imx500: frames without the network's outputs (still uploading to the sensor?): "
                            "skipped until outputs come")
            raise NoOutputsYet("frames carry no network outputs (the network is still uploading to the sensor?)")
        return True, self._convert(array), metadata

    def release(self) -> None:
        """On the grabber thread at its end: a request still pending goes back to the camera, which
        stays open (the backend owns it and closes it)."""
        job, self._job = self._job, None
        if job is not None:
            try:
                self._cam.wait(job, timeout=self._poll_s).release()
            except Exception:  # not completed: picamera2 drops the queued job (cancel_all_and_flush)
                with contextlib.suppress(Exception):
                    self._cam.cancel_all_and_flush()


class Imx500Source(LatestFrameSource):
    """The AI Camera's main stream as the ``imx500`` backend configured it, each frame with its metadata.

    Args:
        runtime: the open ``imx500`` backend (:class:`edgekit.runtime.imx500.Imx500Runtime`): its
            ``camera`` (the started ``Picamera2``), ``has_outputs(metadata)``, ``shared_with``,
            ``attach``/``detach``.
        timeout_s: no frame with outputs for this long: the camera (or the network) stopped.
        open_timeout_s: the same for the first frame.
    """

    kind = "imx500"

    def __init__(
        self,
        runtime: Any,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
    ):
        label = "imx500"
        if not callable(getattr(runtime, "has_outputs", None)):
            raise CameraError(
                f"{label}: the model's runtime ({type(runtime).__name__}) does not run in the AI Camera's sensor",
                f"{NEEDS_BACKEND}; another model on a Pi camera: --camera picamera2",
            )
        cam = runtime.camera
        if cam is None:
            raise CameraUnavailable(f"{label}: the imx500 backend has closed the camera", "open the model again")
        main = cam.camera_configuration()["main"]
        fmt = main["format"]
        if fmt not in PICAMERA2_TO_BGR:
            raise CameraError(f"{label}: the main stream is {fmt}", f"configure one of {', '.join(PICAMERA2_TO_BGR)}")
        if runtime.shared_with is not None:  # two readers would each take the other's requests
            raise CameraError(f"{label}: {runtime.shared_with} already reads this camera", "close it first")
        self._reader = _RequestReader(cam, runtime, PICAMERA2_TO_BGR[fmt], poll_s=min(float(timeout_s), 0.5))
        self._runtime = runtime
        runtime.attach(self)  # before the grabber's first read: infer() must wait for our frames from now on
        try:
            super().__init__(self._reader, name=label, release=self._release, timeout_s=timeout_s,
                             open_timeout_s=open_timeout_s)
        except BaseException:
            runtime.detach(self)
            raise
        self._info.update({"stream": "main", "format": fmt, "size": tuple(main["size"]),
                           "nominal_fps": getattr(runtime, "frame_rate", None),
                           "network": getattr(getattr(runtime, "rpk", None), "name", None)})

    def _release(self) -> None:
        """The grabber's end: the pending request back, the camera left to the backend."""
        try:
            self._reader.release()
        finally:
            self._runtime.detach(self)

    def stats(self) -> dict[str, Any]:
        """:meth:`LatestFrameSource.stats` and ``without_outputs``: frames the network had no outputs for
        (also counted in ``read_errors``)."""
        return {**super().stats(), "without_outputs": self._reader.without_outputs}


def open_imx500(target: str, runtime: Any = None, /, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S) -> Imx500Source:
    """Open ``imx500`` on the ``runtime`` that ``open_camera`` was given (the model's open backend).

    Raises CameraError (one line, exit 2) without one, or with a runtime that is not the imx500 backend.
    """
    if runtime is None:
        raise CameraError("imx500: the AI Camera is opened by an imx500 model's backend, and no model was given",
                          NEEDS_BACKEND)
    return Imx500Source(runtime, timeout_s=timeout_s, open_timeout_s=open_timeout_s)
