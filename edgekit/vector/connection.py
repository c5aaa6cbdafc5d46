"""Connecting to Vector through the SDK, with its errors turned into edgekit errors.

The SDK (``wirepod_vector_sdk``, import name ``anki_vector``) is imported on first use, so
``import edgekit.vector`` costs nothing on machines without it. Every failure the SDK can
report while connecting becomes a :class:`VectorError` whose ``reason`` says what went
wrong and whose hint says what to do (:mod:`edgekit.vector.diagnosis`); callers such as the
daemon use :attr:`VectorError.retryable` to decide whether reconnecting can help.
"""

from __future__ import annotations

import configparser
import contextlib
import logging
import os
import threading
import weakref
from pathlib import Path
from typing import Any

from edgekit.errors import BackendUnavailable, first_line

# The error type and the translation of SDK errors live in diagnosis; re-exported here, where
# callers (camera, speech, the daemon, tests) have always found them.
from edgekit.vector.diagnosis import CONFIGURE_HINT as CONFIGURE_HINT
from edgekit.vector.diagnosis import RETRYABLE as RETRYABLE
from edgekit.vector.diagnosis import VectorError as VectorError
from edgekit.vector.diagnosis import describe_error as describe_error
from edgekit.vector.diagnosis import diagnose_unreachable as diagnose_unreachable
from edgekit.vector.diagnosis import translate

_home_lock = threading.Lock()
_open_at_exit: weakref.WeakSet = weakref.WeakSet()
_hook_lock = threading.Lock()
_hook_installed = False


def import_sdk() -> Any:
    """Import and return ``anki_vector``, or raise BackendUnavailable with the install hint."""
    try:
        import anki_vector
        import anki_vector.camera  # noqa: F401 - the submodules used below, imported once here
        import anki_vector.events  # noqa: F401
        import anki_vector.exceptions  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(
            f"the Vector SDK is not installed ({exc.name or exc})", "pip install 'edgekit-vision[vector]'"
        ) from exc
    except SystemExit as exc:  # the SDK calls sys.exit() when Pillow or numpy is missing
        raise BackendUnavailable(f"the Vector SDK cannot load: {exc}", "pip install 'edgekit-vision[vector]'") from exc
    _quiet_aiogrpc()
    return anki_vector


def _quiet_aiogrpc() -> None:
    """aiogrpc logs a full traceback for every stream a vanished robot drops; we report the
    disconnect as one VectorError, so drop those records (and only those)."""
    logger = logging.getLogger("aiogrpc.utils")
    if not any(isinstance(f, _DropStreamTracebacks) for f in logger.filters):
        logger.addFilter(_DropStreamTracebacks())


class _DropStreamTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "__anext__ grpc exception" not in record.getMessage()


def config_path(config_home: str | Path | None = None) -> Path:
    """Where the SDK reads its configuration: ``<home>/.anki_vector/sdk_config.ini``."""
    home = Path(config_home) if config_home is not None else Path.home()
    return home / ".anki_vector" / "sdk_config.ini"


def read_config(serial: str, config_home: str | Path | None = None) -> dict[str, str]:
    """The sdk_config.ini section for ``serial`` (checked: name, ip, cert, guid present, port a
    port number, the certificate a readable PEM file). Raises VectorError(reason="config")
    with a fix hint."""
    path = config_path(config_home)
    parser = configparser.ConfigParser(strict=False)  # as the SDK reads it
    try:
        parser.read(path, encoding="utf-8")
        sections = {s.lower(): {k: v.strip() for k, v in parser[s].items()} for s in parser.sections()}
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise VectorError("config", f"{path} is not a valid SDK configuration: {first_line(exc)}",
                          CONFIGURE_HINT) from exc
    if not parser.sections():
        raise VectorError("config", f"no Vector SDK configuration at {path}", CONFIGURE_HINT)
    if serial.lower() not in sections:
        known = ", ".join(parser.sections())
        raise VectorError(
            "config",
            f"{path} has no robot with serial {serial}",
            f"use one of the configured serials ({known}) or {CONFIGURE_HINT}",
        )
    section = sections[serial.lower()]
    missing = [k for k in ("name", "ip", "cert", "guid") if not section.get(k)]
    if missing:
        raise VectorError("config", f"{path} [{serial}] lacks {', '.join(missing)}", CONFIGURE_HINT)
    port = section.get("port", "443")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise VectorError("config", f"{path} [{serial}] has port {port!r}, not a port number",
                          "give a number from 1 to 65535, or remove the line (the default is 443)")
    _check_certificate(Path(section["cert"]), path)
    return section


def _check_certificate(cert: Path, ini: Path) -> None:
    """Refuse a certificate file that is missing, unreadable or not PEM (grpc would only
    log "Could not load any root certificate" and the connect would time out)."""
    try:
        text = cert.read_bytes()[:1 << 20]
    except OSError as exc:
        what = "is missing" if not cert.exists() else f"cannot be read ({exc.strerror or exc})"
        raise VectorError("config", f"the certificate {cert} named in {ini} {what}", CONFIGURE_HINT) from exc
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise VectorError("config", f"the certificate {cert} named in {ini} is not a PEM certificate",
                          CONFIGURE_HINT)


@contextlib.contextmanager
def _sdk_home(config_home: str | Path | None):
    """Point the SDK at ``config_home`` while it reads its configuration.

    The SDK only looks at ``Path.home()``; it reads the file once, in ``Robot.__init__``,
    so HOME is swapped for that call only, under a lock.
    """
    if config_home is None:
        yield
        return
    with _home_lock:
        old = os.environ.get("HOME")
        os.environ["HOME"] = str(config_home)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = old


def connect(
    serial: str,
    config_home: str | Path | None = None,
    timeout_s: float = 10.0,
    behavior_control: bool = True,
) -> Any:
    """Connect to the Vector with ``serial`` and return the connected ``anki_vector.Robot``.

    Args:
        serial: the robot's serial (the section name in sdk_config.ini); never the name,
            which would make the SDK search the network with mDNS.
        config_home: directory holding ``.anki_vector/`` (default: the user's home).
        timeout_s: connection and behaviour-control timeout; an unreachable robot costs
            this long before the error.
        behavior_control: request behaviour control (needed to speak and use the face);
            False watches the camera without stopping Vector's own behaviours.

    Raises:
        VectorError: with ``reason`` config, not_found, certificate, unauthenticated,
            control, version or sdk.
        BackendUnavailable: the SDK is not installed.
    """
    sdk = import_sdk()
    section = read_config(serial, config_home)
    try:
        with _sdk_home(config_home):
            robot = sdk.Robot(
                serial=serial,
                default_logging=False,  # a library must not configure the application's logging
                behavior_activation_timeout=timeout_s,
                # control is requested below: when the SDK requests it inside connect() and
                # times out, it closes its loop under running tasks and leaks them
                behavior_control_level=None,
            )
    except (sdk.exceptions.VectorConfigurationException, ValueError, configparser.Error) as exc:
        raise VectorError("config", f"the Vector SDK rejects the configuration: {first_line(exc)}",
                          CONFIGURE_HINT) from exc
    try:
        robot.connect(timeout=timeout_s)
        if behavior_control:
            level = sdk.connection.ControlPriorityLevel.DEFAULT_PRIORITY
            # request_control returns a concurrent future when called off the SDK's thread
            robot.conn.request_control(level, timeout=timeout_s).result(timeout_s + 5)
    except BaseException as exc:
        disconnect(robot)
        if isinstance(exc, sdk.exceptions.VectorException):
            raise translate(exc, serial, section, timeout_s) from exc
        if isinstance(exc, TimeoutError):  # our wait on the control request outlived its own timeout
            raise translate(sdk.exceptions.VectorControlTimeoutException(), serial, section, timeout_s) from exc
        raise
    return robot


def disconnect(robot: Any, timeout_s: float = 3.0) -> None:
    """Disconnect without hanging, even from a robot that has vanished. Never raises.

    Works around four things in wirepod_vector_sdk 0.8.1: ``close_camera_feed`` polls the
    robot for up to 10 s because aiogrpc never cancels the CameraFeed call;
    ``Connection.close`` swallows the CancelledError of its own control task and returns
    before closing the channel, leaving its thread and three streams open; and
    ``EventHandler.close`` re-raises the stream's error when the robot is gone, leaving its
    thread running; without behaviour control, ``disconnect`` first waits 10 s for it.
    Whatever the SDK's own teardown leaves, this finishes.
    """
    conn = getattr(robot, "conn", None)
    events = getattr(robot, "_events", None)
    conn_parts = [getattr(conn, a, None) for a in ("_thread", "_loop", "_done_signal", "_channel")]
    event_parts = [getattr(events, a, None) for a in ("_thread", "_loop", "_done_signal")]
    control_task = getattr(conn, "_control_stream_task", None)
    stop_camera_feed(robot, timeout_s)
    with contextlib.suppress(Exception):
        if not conn._control_events.has_control:
            # without control, disconnect()'s vision.close() waits 10 s for a grant first
            conn._behavior_control_level = None
    with contextlib.suppress(Exception):
        robot.disconnect()
    if events is not None:
        events.listening_for_events = False
    _finish_loop_thread(*conn_parts, timeout_s=timeout_s)
    _finish_loop_thread(*event_parts, timeout_s=timeout_s)
    if control_task is not None and control_task.done() and not control_task.cancelled():
        control_task.exception()  # the robot's dropped stream, already reported; mark it seen
    channel = conn_parts[3]
    with contextlib.suppress(Exception):
        # a failed connect leaves the SDK's loop closed and the grpc channel (and its
        # connectivity thread) open; the sync channel underneath closes without a loop
        channel._channel.close()


def _finish_loop_thread(thread, loop, done_signal, channel=None, timeout_s: float = 3.0) -> None:
    """Cancel what still runs on an SDK loop, close its channel, and let its thread end."""
    if thread is None or not thread.is_alive() or loop is None or loop.is_closed():
        return
    import asyncio

    async def shutdown() -> None:
        # everything but the SDK's own "wait until done" task, which must end normally
        tasks = [
            t for t in asyncio.all_tasks()
            if t is not asyncio.current_task() and "wait_until_done" not in getattr(t.get_coro(), "__qualname__", "")
        ]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if channel is not None:
            await channel.close()
        if done_signal is not None:
            done_signal.set()

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout_s)
    thread.join(timeout_s)


def stop_camera_feed(robot: Any, timeout_s: float = 3.0) -> None:
    """Cancel the SDK's camera-feed task and drop it, which really ends the CameraFeed call
    (the SDK's own close_camera_feed leaves it open and then waits 10 s). Never raises."""
    camera = getattr(robot, "_camera", None)
    task = getattr(camera, "_camera_feed_task", None)
    if camera is None or task is None:
        return
    camera._enabled = False
    with contextlib.suppress(Exception):
        loop = robot.conn.loop
        if not loop.is_closed():
            import asyncio

            async def cancel_and_wait():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

            asyncio.run_coroutine_threadsafe(cancel_and_wait(), loop).result(timeout_s)
    # the aiogrpc iterator cancels its grpc call when garbage-collected with the task
    camera._camera_feed_task = None


def close_at_exit(obj: Any) -> None:
    """Call ``obj.close()`` when the interpreter shuts down, unless it was closed before
    (call :func:`forget_at_exit` from ``close``).

    An SDK connection left open keeps grpc streams waiting in executor threads that
    Python joins at exit, so a forgotten one hangs the process for ever. The hook runs
    before those joins (``threading._register_atexit``; plain ``atexit`` runs too late).
    """
    global _hook_installed
    with _hook_lock:
        _open_at_exit.add(obj)
        if not _hook_installed:
            register = getattr(threading, "_register_atexit", None)
            if register is not None:
                register(_close_all)
            else:  # pragma: no cover - every CPython from 3.9 has it
                import atexit

                atexit.register(_close_all)
            _hook_installed = True


def forget_at_exit(obj: Any) -> None:
    """Undo :func:`close_at_exit` (the object was closed)."""
    with _hook_lock:
        _open_at_exit.discard(obj)


def _close_all() -> None:
    with _hook_lock:
        objs = list(_open_at_exit)
    for obj in objs:
        with contextlib.suppress(Exception):
            obj.close()
