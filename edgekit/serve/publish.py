"""Where ``edgekit serve`` sends results: JSON lines (stdout or a size-bounded file) and MQTT.

Both outputs are best-effort by design: a full disk or a broker that is down is counted and
logged, never allowed to stop inference. JSON lines are the record of truth (every result is
written there even while MQTT is down); MQTT is the live feed.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from edgekit.errors import BackendUnavailable

log = logging.getLogger("edgekit.serve")


def to_json(record: dict[str, Any]) -> str:
    """One compact JSON line (no newline), the payload of every output."""
    return json.dumps(record, separators=(",", ":"), default=_default)


def _default(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy scalars
    if callable(item):
        return item()
    return str(obj)


class _QuietLogger(logging.LoggerAdapter):
    """Every paho log record at DEBUG."""

    def log(self, level, msg, *args, **kwargs):  # paho calls .log(level, ...)
        super().log(logging.DEBUG, msg, *args, **kwargs)


class JsonLinesSink:
    """Append JSON lines to stdout (``"-"``) or to a file rotated at ``max_bytes``.

    Rotation keeps ``backups`` older files (``file.1`` is the newest); with ``backups=0`` the
    file is truncated instead, so the disk use is bounded by ``max_bytes * (backups + 1)``.
    Lines are flushed as they are written so ``tail -f`` and journald see results at once.
    A file moved or removed under us is noticed (device/inode check) and recreated on the next
    write. Write errors (disk full, directory gone) are counted in ``errors``, logged once, and the
    file is reopened on the next write. Thread-safe.
    """

    def __init__(self, target: str = "-", max_bytes: int = 10_000_000, backups: int = 3):
        self.target = target
        self.max_bytes = max_bytes
        self.backups = backups
        self.lines = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._size = 0
        self._warned = False
        if target not in ("-", ""):
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            self._open()

    def _open(self) -> None:
        self._file = open(self.target, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the daemon's life
        self._size = self._file.tell()
        st = os.fstat(self._file.fileno())
        self._identity = (st.st_dev, st.st_ino)

    def _still_ours(self) -> bool:
        """Whether the path still names the open file (logrotate or a user may have moved or
        removed it; writes would then vanish into an unlinked file without any error)."""
        try:
            st = os.stat(self.target)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        if self.backups == 0:
            self._file = open(self.target, "w", encoding="utf-8")  # noqa: SIM115
            self._size = 0
            return
        for i in range(self.backups - 1, 0, -1):
            older = Path(f"{self.target}.{i}")
            if older.exists():
                os.replace(older, f"{self.target}.{i + 1}")
        if Path(self.target).exists():
            os.replace(self.target, f"{self.target}.1")
        self._open()

    def write(self, record: dict[str, Any]) -> None:
        """Write one record as a line; never raises for I/O errors."""
        if self.target == "":
            return
        line = to_json(record) + "\n"
        with self._lock:
            try:
                if self.target == "-":
                    sys.stdout.write(line)
                    sys.stdout.flush()
                else:
                    if self._file is not None and not self._still_ours():
                        log.warning("results file %s was moved or removed; reopening it", self.target)
                        self._file.close()
                        self._file = None
                    if self._file is None:
                        self._open()
                    size = len(line.encode("utf-8"))
                    if self._size and self._size + size > self.max_bytes:
                        self._rotate()
                    self._file.write(line)
                    self._file.flush()
                    self._size += size
                self.lines += 1
            except (OSError, ValueError) as exc:  # ValueError: write to a closed stdout
                self.errors += 1
                if not self._warned:
                    log.warning("cannot write results to %s: %s (counting further errors)", self.target, exc)
                    self._warned = True
                self._file = None

    def close(self) -> None:
        """Flush and close the file (stdout is left open)."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    self.errors += 1
                self._file = None


class MqttPublisher:
    """Publish results, stats and availability to an MQTT broker with paho-mqtt 2.x.

    Topics, under ``topic`` (e.g. ``edgekit/pi-kitchen``):

    - ``<topic>/availability``: ``online`` / ``offline``, retained, QoS 1. The broker publishes
      ``offline`` itself (last will) when the device vanishes without saying goodbye.
    - ``<topic>/result``: one JSON object per processed frame (QoS ``qos``, not retained).
    - ``<topic>/stats``: the daemon's stats JSON, every ``stats_interval_s`` (not retained:
      availability, not a stale stats message, tells whether a device is alive).

    The network runs in paho's own thread (``loop_start``), which reconnects with exponential
    backoff between ``reconnect_min_s`` and ``reconnect_max_s``; a broker that is down at
    start is retried the same way. While disconnected, QoS 0 results are dropped and counted
    (the JSON-lines output still has them). ``publish_*`` methods are thread-safe.
    """

    def __init__(
        self,
        host: str,
        port: int = 1883,
        topic: str = "edgekit/device",
        client_id: str = "",
        qos: int = 0,
        keepalive_s: int = 30,
        reconnect_min_s: float = 1.0,
        reconnect_max_s: float = 30.0,
        username: str = "",
        password: str | None = None,
    ):
        try:
            import paho.mqtt.client as mqtt
        except ImportError as exc:
            raise BackendUnavailable("MQTT needs paho-mqtt", "pip install 'edgekit[serve]' (or --mqtt off)") from exc

        self.host, self.port, self.topic, self.qos = host, port, topic, qos
        self.keepalive_s = keepalive_s
        self.availability_topic = f"{topic}/availability"
        self.connected = threading.Event()
        self.connects = 0
        self.disconnects = 0
        self.published = 0
        self.dropped = 0
        self.last_error = ""
        self._closing = False
        self._client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"edgekit-{os.getpid()}", clean_session=True
        )
        # paho logs routine events (a disconnect on shutdown, each failed retry) at ERROR; our
        # own callbacks report what matters, so its chatter goes to DEBUG only.
        self._client.enable_logger(_QuietLogger(logging.getLogger("edgekit.serve.mqtt")))
        if username:
            self._client.username_pw_set(username, password)
        # The broker publishes this for us if the connection drops without a DISCONNECT.
        self._client.will_set(self.availability_topic, "offline", qos=1, retain=True)
        # paho takes whole seconds; a sub-second minimum would become 0 (a busy loop).
        self._client.reconnect_delay_set(max(1, round(reconnect_min_s)), max(1, round(reconnect_max_s)))
        self._client.connect_timeout = 5.0
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_connect_fail = self._on_connect_fail

    # paho calls these from its network thread.
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.last_error = f"broker refused the connection: {reason_code}"
            log.warning("MQTT %s:%s: %s", self.host, self.port, self.last_error)
            return
        self.connects += 1
        self.connected.set()
        # Retained, so a dashboard that subscribes later still sees the device as online.
        client.publish(self.availability_topic, "online", qos=1, retain=True)
        log.info("MQTT connected to %s:%s (connection %d)", self.host, self.port, self.connects)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        was = self.connected.is_set()
        self.connected.clear()
        if was:
            self.disconnects += 1
            if not self._closing:
                self.last_error = f"disconnected: {reason_code}"
                log.warning("MQTT %s:%s %s; reconnecting", self.host, self.port, self.last_error)

    def _on_connect_fail(self, client, userdata) -> None:
        self.last_error = "cannot reach the broker"
        log.debug("MQTT %s:%s unreachable; retrying", self.host, self.port)

    @property
    def reconnects(self) -> int:
        """Successful connections after the first one."""
        return max(0, self.connects - 1)

    def start(self) -> None:
        """Start connecting in the background; returns at once even if the broker is down."""
        self._client.connect_async(self.host, self.port, keepalive=self.keepalive_s)
        self._client.loop_start()

    def _publish(self, subtopic: str, payload: str, qos: int) -> bool:
        if not self.connected.is_set():
            self.dropped += 1
            return False
        info = self._client.publish(f"{self.topic}/{subtopic}", payload, qos=qos)
        if info.rc != 0:  # lost the connection between the check and the send
            self.dropped += 1
            return False
        self.published += 1
        return True

    def publish_result(self, payload: str) -> bool:
        """Publish one result line; False (and counted as dropped) while disconnected."""
        return self._publish("result", payload, self.qos)

    def publish_stats(self, payload: str) -> bool:
        """Publish a stats JSON; False while disconnected."""
        return self._publish("stats", payload, 0)

    def close(self, timeout_s: float = 2.0) -> None:
        """Publish ``offline`` (retained), disconnect cleanly and stop the network thread.

        Bounded by about ``timeout_s`` even when the broker is unreachable, so a SIGTERM
        never waits on the network.
        """
        self._closing = True
        deadline = time.monotonic() + timeout_s
        if self.connected.is_set():
            info = self._client.publish(self.availability_topic, "offline", qos=1, retain=True)
            try:
                info.wait_for_publish(timeout=max(0.1, timeout_s / 2))
            except (RuntimeError, ValueError) as exc:  # raised when the connection went away meanwhile
                log.debug("MQTT offline message not confirmed: %s", exc)
        self._client.disconnect()
        # loop_stop joins paho's thread, which may sit in a connect attempt: wait in a helper
        # thread so the daemon's shutdown stays bounded (paho's thread is a daemon thread).
        stopper = threading.Thread(target=self._client.loop_stop, name="mqtt-stop", daemon=True)
        stopper.start()
        stopper.join(max(0.1, deadline - time.monotonic()))
