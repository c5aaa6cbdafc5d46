"""The AI Camera's source in the daemon: it reads the ``Picamera2`` that the model's imx500 backend owns.

picamera2 allows one ``Picamera2`` per camera and needs the network loaded (``IMX500(rpk)``) before
it, so the backend (:mod:`edgekit.runtime.imx500`) opens the camera and the ``imx500`` source reads it
(:mod:`edgekit.camera.imx500`). A camera that stops delivering is therefore a backend whose camera
stopped: reading the same ``Picamera2`` again would wait on requests that never complete (a loose
cable is a new camera once it is back, and the network must be loaded into it again). So the
capture's reopen closes that backend, camera and all (:meth:`ModelSupervisor.camera_lost`); the
daemon's model reopen (its backoff, ``reconnects{component="model"}``) opens a new backend, which
opens the camera, and the capture's next try reads the new one. Opening and closing the model are
serialised, so a second ``Picamera2`` is never created while one is open.
"""

from __future__ import annotations

from typing import Any

from edgekit.errors import CameraUnavailable
from edgekit.serve.capture import open_source

WAIT_FIX = "the daemon reopens the model, which opens the camera, with backoff; check the cable and `dmesg`"


class SensorCamera:
    """The capture's camera factory for an ``imx500`` camera (``(uri, options) -> source``).

    Args:
        model: the daemon's :class:`~edgekit.serve.supervisor.ModelSupervisor` (``runtime``, ``camera_lost``).
        opener: ``(uri, options, runtime) -> source`` (default :func:`~edgekit.serve.capture.open_source`).

    The first source reads the running backend's camera; a later open on that same backend means
    its camera failed the source before: the backend is closed and the open raises
    CameraUnavailable, retried by the capture with its backoff until the model reopened.
    """

    def __init__(self, model: Any, opener: Any = open_source):
        self._model = model
        self._opener = opener
        self._last: Any = None  # the backend the previous source read (held: no id is reused)

    def __call__(self, uri: str, options: dict[str, Any]) -> Any:
        """A source on the running backend's camera, or CameraUnavailable while it reopens."""
        runtime = self._model.runtime
        if runtime is None:
            raise CameraUnavailable("imx500: the model is closed; its backend opens the camera", WAIT_FIX)
        if runtime is self._last:  # its Picamera2 stopped delivering: a new backend opens a new one
            self._last = None
            self._model.camera_lost(runtime, "imx500: the AI Camera stopped delivering")
            raise CameraUnavailable("imx500: the AI Camera stopped delivering; the model's backend reopens it",
                                    WAIT_FIX)
        self._last = runtime
        return self._opener(uri, options, runtime)
