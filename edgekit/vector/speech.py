"""Make Vector speak and show things on its face (thin glue over the SDK).

Both need behaviour control (connect with ``behavior_control=True``, the default). With
``wait=False`` the call returns a ``concurrent.futures.Future`` at once, so a camera loop
is not held up for the seconds a sentence takes; its ``result()`` raises VectorError.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import numpy as np

import edgekit.vector.connection as connection  # not the package face: its lazy map names this module
from edgekit.vector.face import encode_rgb565, fit_to_screen, render_label


def say_text(robot: Any, text: str, wait: bool = True, timeout_s: float = 30.0) -> Any:
    """Make Vector say ``text`` with its own voice.

    Returns the SDK's SayTextResponse (``wait=True``) or a Future of it. Raises VectorError.
    """
    return _call(robot, lambda **kw: robot.behavior.say_text(text, **kw), wait, timeout_s)


def show_face(
    robot: Any, image: np.ndarray | str, duration_s: float = 2.0, wait: bool = True, timeout_s: float = 10.0
) -> Any:
    """Show an image or a text label on Vector's 184x96 face screen for ``duration_s``.

    Args:
        image: a uint8 RGB (or gray) array of any size, letterboxed to the screen, or a
            string drawn with :func:`edgekit.vector.face.render_label`.
    """
    rgb = render_label(image) if isinstance(image, str) else fit_to_screen(image)
    data = encode_rgb565(rgb)
    return _call(robot, lambda **kw: robot.screen.set_screen_with_image_data(data, duration_s, **kw),
                 wait, timeout_s)


def _refusal(response: Any) -> str | None:
    """The error status of an SDK response (FORBIDDEN, NOT_FOUND, ERROR_UPDATE_IN_PROGRESS), or None.

    The SDK hands back whatever the robot answered; a status code of 100 and up is a refusal
    (codes below are OK or progress, and a response without a status is taken as done).
    """
    status = getattr(response, "status", None)
    code = getattr(status, "code", 0)
    if not isinstance(code, int) or code < 100:
        return None
    try:
        return type(status).StatusCode.Name(code)
    except (AttributeError, ValueError):
        return f"status {code}"


def _call(robot: Any, fn, wait: bool, timeout_s: float) -> Any:
    sdk = connection.import_sdk()
    # the SDK's Robot keeps the configured name and address, not the serial
    serial = "?"
    section = {"name": getattr(robot, "_name", None) or "?", "ip": getattr(robot, "_ip", None) or "?",
               "port": getattr(robot, "_port", None) or "443"}
    try:
        sdk_future = fn(_return_future=True)
    except sdk.exceptions.VectorException as exc:
        raise connection.translate(exc, serial, section, connected=True) from exc
    future: concurrent.futures.Future = concurrent.futures.Future()

    def relay(done: concurrent.futures.Future) -> None:
        if done.cancelled():
            # the SDK cancels pending commands when behaviour control is lost
            future.set_exception(connection.VectorError("control", "Vector cancelled the command (control lost)"))
            return
        exc = done.exception()
        refused = _refusal(done.result()) if exc is None else None
        if refused:
            future.set_exception(connection.VectorError("sdk", f"Vector refused the command: {refused}",
                                                        "check the robot is awake and not updating"))
        elif exc is None:
            future.set_result(done.result())
        elif isinstance(exc, sdk.exceptions.VectorException):
            future.set_exception(connection.translate(exc, serial, section, connected=True))
        else:
            future.set_exception(exc)

    sdk_future.add_done_callback(relay)
    if not wait:
        return future
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError as exc:
        raise connection.VectorError("sdk", f"Vector did not answer within {timeout_s} s",
                                     "check the robot is awake and connected") from exc
