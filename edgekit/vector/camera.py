"""Vector's camera as an edgekit FrameSource (``--camera vector:SERIAL``).

The SDK streams 640x360 JPEG frames (about 15 fps on a real robot) and opens each one as a
lazy PIL image (its annotator then decodes it on the connection thread). This source keeps
only the newest image (in edgekit's one newest-frame mailbox,
:class:`~edgekit.camera.mailbox.FrameMailbox`): a slow consumer gets the latest frame and
the ones it missed are counted as skipped, never queued.

>>> with VectorSource("00e20100") as cam:                    # doctest: +SKIP
...     for frame in cam:                                  # Frame(array BGR uint8, t_capture_ns, index)
...         ...
...     cam.stats()                                        # camera fps, delivered, skipped
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import edgekit.vector.connection as connection  # not the package face: its lazy map names this module
from edgekit.camera.base import Frame
from edgekit.camera.mailbox import FrameMailbox
from edgekit.errors import first_line
from edgekit.metrics import fps, rate
from edgekit.vector.connection import VectorError
from edgekit.vector.frames import skip_undecodable, to_bgr, to_width

if TYPE_CHECKING:
    from edgekit.imaging.image import InputSpec


CAMERA_WIDTH = 640  # Vector's camera streams 640x360


class VectorSource:
    """Frames from a Vector robot's camera, newest first.

    Args:
        serial: the robot's serial (its section in sdk_config.ini).
        config_home: directory holding ``.anki_vector/sdk_config.ini`` (default: home).
        connect_timeout_s: how long connecting (and getting behaviour control) may take.
        frame_timeout_s: no new image for this long counts as a lost connection.
        behavior_control: hold behaviour control (needed by :meth:`say` and :meth:`show`).
        reconnect: on a lost connection, reconnect with exponential backoff instead of
            ending the iteration with a VectorError (the daemon uses this).
        max_reconnects: give up after this many failed attempts in a row (None: never).
        backoff_s: ``(first, longest)`` wait between reconnect attempts.
        prepare: a model's :class:`~edgekit.imaging.image.InputSpec`: hand over only its crop window,
            decoded from the JPEG straight to gray for a gray model
            (:func:`edgekit.vector.window.model_window`), instead of the whole BGR frame.
            The SDK's image annotator is switched off (nothing here draws on frames), so the
            SDK no longer decodes every full frame on its own thread.
        frame_width: deliver frames this wide (Vector's own 640): an image of another size (a
            stand-in robot, a high-resolution capture) is resized, aspect kept, before a model's
            crop is cut, so a crop given in pixels of Vector's 640x360 frames keeps its field
            of view. None: as sent.

    Iterating connects (if :meth:`open` was not called) and yields :class:`Frame` with
    ``array`` BGR uint8 (640x360 on a real robot; with ``prepare``, the model's window), ``t_capture_ns`` in the
    ``time.perf_counter_ns`` clock at the moment the SDK finished receiving the image, and
    ``index`` counting every image received (gaps are skipped frames).

    Thread safety: iterate from one thread; :meth:`close`, :meth:`stats`, :meth:`say` and
    :meth:`show` may be called from any thread. ``close()`` from another thread ends the
    iteration cleanly.
    """

    def __init__(
        self,
        serial: str,
        config_home: str | Path | None = None,
        connect_timeout_s: float = 10.0,
        frame_timeout_s: float = 5.0,
        behavior_control: bool = True,
        reconnect: bool = False,
        max_reconnects: int | None = None,
        backoff_s: tuple[float, float] = (0.5, 8.0),
        prepare: InputSpec | None = None,
        frame_width: int | None = CAMERA_WIDTH,
    ):
        self.serial = serial
        self.config_home = config_home
        self.connect_timeout_s = connect_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.behavior_control = behavior_control
        self.reconnect = reconnect
        self.max_reconnects = max_reconnects
        self.backoff_s = backoff_s
        self.prepare = prepare
        self.frame_width = frame_width
        self._robot: Any = None
        self._lock = threading.Lock()  # guards the counters and arrival times below
        self._closed = threading.Event()
        # holds (index, PIL image, t_capture_ns), or _CLOSED once close() was called
        self._mailbox = FrameMailbox()
        self._received = 0
        self._delivered = 0
        self._reconnects = 0
        self._bad = 0  # images that could not be decoded (skipped), in all
        self._bad_in_row = 0
        self._arrivals: deque[int] = deque(maxlen=300)
        self._first_arrival: int | None = None
        self._last_arrival: int | None = None
        self._last_activity: int | None = None
        self._sdk: Any = None
        self._control_request: Any = None  # a pending request for behaviour control (a Future)

    # ---- connection ------------------------------------------------------------------
    def open(self) -> VectorSource:
        """Connect and start the camera feed now (iterating does it when needed)."""
        if self._closed.is_set():
            raise VectorError("disconnected", f"VectorSource({self.serial}) is closed", "open a new source")
        if self._robot is None:
            self._robot = self._connect()
            connection.close_at_exit(self)
        return self

    def _connect(self) -> Any:
        self._sdk = connection.import_sdk()
        robot = connection.connect(
            self.serial, self.config_home, timeout_s=self.connect_timeout_s, behavior_control=self.behavior_control
        )
        try:
            # annotate_image() copies, i.e. fully decodes, every frame on the SDK's thread (and a
            # frame it cannot decode would end the feed); nothing here draws on the SDK's frames
            robot.camera.image_annotator.annotation_enabled = False
            skip_undecodable(robot.camera, self._bad_image)
            robot.events.subscribe(self._on_image, self._sdk.events.Events.new_camera_image)
            robot.camera.init_camera_feed()
            # init_camera_feed calls loop.create_task from this thread, which does not wake the
            # SDK's loop: the feed would start only at the loop's next event (up to 0.5 s)
            robot.conn.loop.call_soon_threadsafe(lambda: None)
        except Exception as exc:
            connection.disconnect(robot)
            raise connection.translate(exc, self.serial, connected=True) from exc
        with self._lock:
            self._last_activity = time.perf_counter_ns()  # the frame timeout runs from connect
        if self._closed.is_set():  # close() was called from another thread while connecting
            connection.disconnect(robot)
            raise VectorError("disconnected", f"VectorSource({self.serial}) was closed while connecting")
        return robot

    def _on_image(self, _robot: Any, _event_type: Any, event: Any) -> None:
        """SDK event callback (runs on the SDK's event thread): keep only the newest image."""
        image = event.image
        now_ns = time.perf_counter_ns()
        # CameraImage stamps time.time() when the SDK finished decoding; move it onto our clock
        age_ns = max(0, int((time.time() - image.image_recv_time) * 1e9))
        with self._lock:
            self._received += 1
            self._arrivals.append(now_ns)
            if self._first_arrival is None:
                self._first_arrival = now_ns
            self._last_arrival = self._last_activity = now_ns
            index = self._received
        # an untaken older image is replaced: skipped, counted as received - delivered
        self._mailbox.put((index, image.raw_image, now_ns - age_ns))

    def _bad_image(self, detail: str) -> None:
        """An image the SDK or we could not decode: skipped; too many in a row end the stream."""
        with self._lock:
            self._bad += 1
            self._bad_in_row += 1
            in_row = self._bad_in_row
            self._last_activity = time.perf_counter_ns()
        if in_row == MAX_BAD_IN_ROW:
            self._mailbox.put(VectorError(
                "image",
                f"Vector {self.serial} sent {in_row} camera images in a row that cannot be decoded ({detail})",
                "the SDK reads JPEG camera frames (image_encoding JPEG_COLOR or JPEG_GRAY): check the robot's "
                "firmware or the program standing in for it",
            ))

    @property
    def robot(self) -> Any:
        """The connected ``anki_vector.Robot`` (changes after a reconnect); connects if needed."""
        self.open()
        return self._robot

    # ---- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Frame]:
        self.open()
        while True:
            item = self._wait_newer()
            if item is None:
                return  # closed
            if isinstance(item, VectorError):
                if not self.reconnect or not item.retryable:
                    self.close()
                    raise item
                self._reconnect(item)
                continue
            index, image, t_ns = item
            try:
                array = self._decode(image)
            except (OSError, ValueError, SyntaxError) as exc:  # Pillow's errors for a broken JPEG
                self._bad_image(f"image {index}: {first_line(exc)}")
                continue
            with self._lock:
                self._delivered += 1
                self._bad_in_row = 0
            yield Frame(array=array, t_capture_ns=t_ns, index=index)

    def _decode(self, image: Any) -> np.ndarray:
        """One SDK image as delivered: BGR (gray stays 2-D) at ``frame_width``, or the model's window."""
        from edgekit.vector.window import model_window

        if self.frame_width and image.size[0] != self.frame_width:
            array = to_width(to_bgr(image), self.frame_width)
            return array if self.prepare is None else model_window(array, self.prepare)
        return to_bgr(image) if self.prepare is None else model_window(image, self.prepare)

    def _wait_newer(self) -> tuple[int, Any, int] | VectorError | None:
        """Block until an image not yet delivered arrives, the source is closed (None), or
        the connection is found dead (a VectorError)."""
        while not self._closed.is_set():
            # a short wait, so a dead feed is noticed while no image arrives
            item = self._mailbox.take(0.2)
            if item is _CLOSED or self._closed.is_set():
                break
            if item is not None:
                return item
            problem = self._health()
            if problem is not None:
                return problem
        return None

    def _health(self) -> VectorError | None:
        """Called while waiting for an image: why the feed is dead, or None."""
        task = getattr(getattr(self._robot, "_camera", None), "_camera_feed_task", None)
        # the SDK's feed task ends (with the grpc error) when the robot drops the stream
        if task is not None and task.done():
            error = None if task.cancelled() else task.exception()
            detail = f": {connection.describe_error(error)}" if error else ""
            return VectorError(
                "disconnected",
                f"Vector {self.serial} stopped streaming camera frames{detail}",
                "check the robot is on and on the network; reconnect=True retries automatically",
            )
        with self._lock:
            last_activity = self._last_activity
        if last_activity is not None and self.frame_timeout_s:
            idle_s = (time.perf_counter_ns() - last_activity) / 1e9
            if idle_s > self.frame_timeout_s:
                return VectorError(
                    "stalled",
                    f"no new camera image from Vector {self.serial} for {idle_s:.1f} s",
                    "check the robot is awake and on the network; reconnect=True retries automatically",
                )
        return None

    def _reconnect(self, cause: VectorError) -> None:
        """Drop the dead connection and connect again with exponential backoff."""
        old, self._robot = self._robot, None
        if old is not None:
            connection.disconnect(old, timeout_s=2.0)
        delay, longest = self.backoff_s
        failures = 0
        while not self._closed.is_set():
            if self._closed.wait(delay):
                return
            try:
                self._robot = self._connect()
            except VectorError as exc:
                failures += 1
                if not exc.retryable or (self.max_reconnects is not None and failures >= self.max_reconnects):
                    self.close()
                    raise VectorError(
                        exc.reason, f"{exc.message} (after losing the stream: {cause.message})", exc.hint
                    ) from exc
                delay = min(delay * 2, longest)
                continue
            with self._lock:
                self._reconnects += 1
            return

    # ---- speech and face (behaviour control required) --------------------------------
    def say(self, text: str, wait: bool = True) -> Any:
        """Make Vector say ``text``; see :func:`edgekit.vector.speech.say_text`."""
        from edgekit.vector.speech import say_text

        return say_text(self._in_control(), text, wait=wait)

    def show(self, image: np.ndarray | str, duration_s: float = 2.0, wait: bool = True) -> Any:
        """Show an RGB image or a text label on the face; see :func:`edgekit.vector.speech.show_face`."""
        from edgekit.vector.speech import show_face

        return show_face(self._in_control(), image, duration_s=duration_s, wait=wait)

    def _in_control(self) -> Any:
        """The robot, with behaviour control asked for again if Vector took it back.

        Vector takes control back when it is picked up, put on its charger or spoken to; the
        SDK then holds every command 10 s waiting for a grant it never asks for again
        (connection.on_connection_thread), so ask (once at a time) before the command.
        """
        robot = self.robot
        conn = getattr(robot, "conn", None)
        if not self.behavior_control or conn is None or conn.control_granted_event.is_set():
            return robot
        with self._lock:
            pending = self._control_request
            if pending is None or pending.done():
                with contextlib.suppress(Exception):  # the command's own wait reports a refusal
                    level = self._sdk.connection.ControlPriorityLevel.DEFAULT_PRIORITY
                    self._control_request = conn.request_control(level, timeout=self.connect_timeout_s)
        return robot

    # ---- bookkeeping -----------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Measured camera frame rate and what happened to the frames.

        ``camera_fps``: (n-1)/span over all images received; ``recent_fps``: the same over
        the last 300; ``received``, ``delivered``, ``skipped`` (received but superseded
        before the consumer asked, or not decodable), ``undecodable``, ``reconnects``.
        """
        with self._lock:
            arrivals = list(self._arrivals)
            received, delivered = self._received, self._delivered
            first, last = self._first_arrival, self._last_arrival
            reconnects, bad = self._reconnects, self._bad
        span_ns = last - first if first is not None and last is not None else 0
        # None, not 0.0, while there is no interval to measure yet
        return {
            "camera_fps": rate(received, span_ns) or None,
            "recent_fps": fps(arrivals) or None,
            "received": received,
            "delivered": delivered,
            "skipped": received - delivered,
            "undecodable": bad,
            "reconnects": reconnects,
        }

    def close(self) -> None:
        """Stop the feed, release behaviour control and disconnect; idempotent, never hangs."""
        self._closed.set()
        connection.forget_at_exit(self)
        # wakes a waiting iteration at once (a marker, so no wake-up can be missed)
        self._mailbox.put(_CLOSED)
        robot, self._robot = self._robot, None
        if robot is not None:
            connection.disconnect(robot)

    def __enter__(self) -> VectorSource:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


_CLOSED = object()  # put in the mailbox by close(): the iteration ends
MAX_BAD_IN_ROW = 10  # undecodable camera images in a row that end the stream (~0.7 s at 15 fps)


def open_vector(spec: str, **options: Any) -> VectorSource:
    """Open ``vector:SERIAL`` (the ``--camera`` syntax); options go to :class:`VectorSource`."""
    kind, _, serial = spec.partition(":")
    if kind != "vector" or not serial:
        raise VectorError("config", f"bad Vector camera {spec!r}", "use vector:SERIAL, e.g. vector:00e20100")
    return VectorSource(serial, **options)
