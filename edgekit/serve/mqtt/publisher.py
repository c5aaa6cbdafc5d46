"""The MQTT output of ``edgekit serve`` (paho-mqtt 2.x): results, state, stats, availability.

Topics, under ``topic`` (e.g. ``edgekit/pi-kitchen``; a named camera's result, state, label, sensors,
count and snapshot topics under ``<topic>/<camera>`` instead, :mod:`edgekit.serve.mqtt.channel`):

- ``<topic>/availability``: ``online`` / ``offline``, retained, QoS 1; the broker publishes
  ``offline`` itself (last will) when the device vanishes without saying goodbye.
- ``<topic>/result``: results chosen by the :class:`~edgekit.serve.mqtt.policy.PublishPolicy`
  (every one, on change, or at most every N s), QoS ``qos``, each with its ``state``.
- ``<topic>/state``: the current state (a label, or ``none``), retained, on every change.
- ``<topic>/label/<slug>``: ``ON``/``OFF`` per label of interest, retained (Home Assistant
  binary sensors; see :mod:`edgekit.serve.mqtt.discovery`).
- ``<topic>/sensors``: score, count and counts as JSON, retained, on change and at least every
  ``sensor_interval_s`` (what Home Assistant's sensors read; :mod:`edgekit.serve.mqtt.sensors`).
- ``<topic>/count/<slug>``: a detector's confirmed objects per label, retained, on change.
- ``<topic>/snapshot/<slug>``: with ``[events] snapshots``, the best frame of the latest object
  of that label as a JPEG, retained, QoS 0 (never queued: images are large).
- ``<topic>/stats``: the daemon's stats JSON every ``stats_interval_s``.
- ``<topic>/events``: one JSON per event, QoS 1 whatever ``qos`` is, queued while disconnected:
  a detector's objects (``type`` new / update / end, :mod:`edgekit.serve.objects`) and model
  hot-swaps (``type`` model_swap: ok / rolled_back / refused, with the reason, bundle and sha256).
- ``<topic>/instance``: this daemon's presence (QoS 0, not retained) on connect and with each
  stats message; another daemon's there is named in one line (:mod:`edgekit.serve.mqtt.presence`).

The client id is per install (``edgekit-<device>-<install id>``, :mod:`edgekit.serve.node`), so
two daemons of one device name do not knock each other off the broker.

A clean stop publishes ``offline`` and then clears the retained state, label, count and sensor
topics (an empty retained message), so nobody reads the last label of a device that is gone; a
device that vanishes is marked by its last will (``offline``) alone.

Never silent: where it connects is logged at INFO, each failed attempt at WARNING with the
reason. While disconnected, QoS >= 1 results wait in a bounded queue (``queue_size``,
``queue_policy``, ``queue_file``: :mod:`edgekit.serve.mqtt.queue`), replayed in order on
reconnect after what paho still held (:mod:`edgekit.serve.mqtt.paho`) and before anything newer.
QoS 0 results are dropped and counted, except the newest: it is sent on reconnect with the
retained state (``change`` mode may not publish for hours), counted as published. The password
is in no log line and no stats. With ``[mqtt] commands`` it subscribes to ``<topic>/set/+``
(:mod:`edgekit.serve.mqtt.control`).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from typing import Any

from edgekit.errors import BackendUnavailable
from edgekit.serve.mqtt.channel import Channel, channels
from edgekit.serve.mqtt.discovery import announcements
from edgekit.serve.mqtt.extras import MqttExtras
from edgekit.serve.mqtt.options import QUEUE_POLICIES, MqttOptions
from edgekit.serve.mqtt.paho import InFlight, QuietLogger, configure
from edgekit.serve.mqtt.policy import PublishPolicy, state_text
from edgekit.serve.mqtt.presence import Presence
from edgekit.serve.mqtt.queue import MessageQueue
from edgekit.serve.node import NodeIdentity
from edgekit.serve.record import ResultRecord, as_record

log = logging.getLogger("edgekit.serve")


class MqttPublisher(MqttExtras):
    """Publish results, state, stats and availability; ``publish_*`` are thread-safe."""

    def __init__(self, host: str, port: int = 1883, topic: str = "edgekit/device", client_id: str = "",
                 password: str | None = None, options: MqttOptions | None = None,
                 policy: PublishPolicy | None = None, node: NodeIdentity | None = None, **option_values: Any):
        try:
            import paho.mqtt.client as mqtt
        except ImportError as exc:
            raise BackendUnavailable("MQTT needs paho-mqtt",
                                     "pip install 'edgekit-vision[serve]' (or --mqtt off)") from exc
        self.options = options or MqttOptions(**option_values)
        o = self.options
        if o.queue_policy not in QUEUE_POLICIES:
            raise ValueError(f"queue_policy {o.queue_policy!r} is not one of {', '.join(QUEUE_POLICIES)}")
        self.host, self.port, self.topic, self.qos = host, port, topic, o.qos
        self.address = f"{'mqtts' if o.tls else 'mqtt'}://{host}:{port}"
        self.policy = policy or PublishPolicy(mode="every")  # the first camera's; each other one has a copy
        self.availability_topic = f"{topic}/availability"
        self.node = node  # this install's ids (edgekit.serve.node): the client id, the queue records' node
        self.client_id = client_id or (node.client_id if node else f"edgekit-{os.getpid()}")
        self.presence = Presence(topic, o.device or topic.rsplit("/", 1)[-1], self.client_id,
                                 node.node_id if node else "", node.instance if node else secrets.token_hex(6))
        self._connected_at = 0.0
        # a camera's topics and publish state: <topic>/... for the one unnamed camera, <topic>/<name>/... each
        self._channels = channels(topic, tuple(o.cameras), o, self.policy)
        self._first = next(iter(self._channels.values()))
        self._result_topics = {c.result_topic for c in self._channels.values()}
        self.connected = threading.Event()
        self.connects = self.disconnects = self.failures = 0
        self.published = self.dropped = self.replayed = 0
        self.last_error = ""
        self._closing = False
        self._lock = threading.Lock()  # orders publishes against the replay of the queue
        self.commands: Any = None  # a control.Controls: <topic>/set/+ is subscribed and answered
        self._inflight = InFlight()  # paho's unacknowledged QoS >= 1 messages: older than a replay
        self._generation = 0  # connections lost: a replay waiting on an old one is not done
        self._no_conn = mqtt.MQTT_ERR_NO_CONN
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, clean_session=True)
        self._client.enable_logger(QuietLogger(logging.getLogger("edgekit.serve.mqtt.publisher")))
        configure(self._client, o, password, self.address, self.availability_topic)
        c = self._client
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_connect_fail = self._on_connect_fail
        c.on_publish = self._on_publish
        c.on_message = self._on_message
        # last: it locks a file
        self._queue = MessageQueue(o.queue_size, o.queue_policy, o.queue_file, node=node.node_id if node else "",
                                   foreign=o.foreign_queue)

    # ------------------------------------------------------------------ paho's network thread
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.failures += 1
            self.last_error = f"broker refused the connection: {reason_code}"
            log.warning("MQTT %s: %s; retrying", self.address, self.last_error)
            return
        older = self._inflight.pending()  # paho sends these again once this callback returns
        self._connected_at = time.monotonic()
        self._send(self.availability_topic, "online", 1, retain=True)
        client.subscribe(self.presence.topic, qos=0)  # a second daemon of this name says so there
        self._send(*self.presence.message(), 0)
        if self.options.discovery:
            self._announce()
        if self.commands is not None:
            client.subscribe(self.commands.subscription, qos=1)
            for topic, payload in self.commands.states():
                self._send(topic, payload, 1, retain=True)
        if not older:
            self._ready(self._generation)
            return
        # Replaying here would put the queue's newer results before paho's older ones.
        threading.Thread(target=self._ready_after, args=(older, self._generation), daemon=True).start()

    def _ready_after(self, older: frozenset[int], generation: int) -> None:
        """Replay once the broker has acknowledged what paho held from before this connection."""
        if not self._inflight.wait(older):
            log.warning("MQTT %s: older messages not acknowledged; replaying the queue anyway", self.address)
        self._ready(generation)

    def _ready(self, generation: int) -> None:
        """Replay the queue, then the current state and the newest unsent result: connected."""
        with self._lock:
            if generation != self._generation or self._closing:  # lost again: the next connection replays
                return
            waiting = self.queued
            self._replay()
            self._republish_state()
            for channel in [c for c in self._channels.values() if c.missed is not None]:
                info = self._send(channel.result_topic, channel.missed, self.qos)
                if info.rc == 0 or (self.qos and info.rc == self._no_conn):
                    channel.missed, self.published = None, self.published + 1  # else held for the next connect
            self.connects += 1
            self.last_error = ""  # /stats must not keep saying "cannot reach the broker"
            self.connected.set()
            if generation != self._generation:  # lost meanwhile (paho's thread does not take self._lock)
                self.connected.clear()
        log.info("MQTT connected to %s (connection %d)%s", self.address, self.connects,
                 f"; replayed {waiting} queued results" if waiting else "")

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        self._inflight.acknowledged(mid)
        self._queue.acknowledged(mid)

    def _send(self, topic: str, payload: Any, qos: int, retain: bool = False) -> Any:
        """``client.publish``, noting a QoS >= 1 message until the broker acknowledges it."""
        info = self._client.publish(topic, payload, qos=qos, retain=retain)
        self._inflight.track(info, qos, self._no_conn)
        return info

    def _announce(self) -> None:
        """Home Assistant discovery configs (on every connect: a broker without persistence
        forgets retained messages when it restarts)."""

        o = self.options
        device = o.device or self.topic.rsplit("/", 1)[-1]
        cameras = [(channel.camera, channel.topic) for channel in self._channels.values()]
        messages = announcements(self.topic, device, o, cameras, self.commands is not None)
        for config_topic, payload in messages:
            self._send(config_topic, payload, 1, retain=True)

    def _republish_state(self) -> None:
        """The current retained state, after the replay (called with the lock held): at QoS 0 a
        change made while disconnected was dropped, and a broker without persistence forgets
        retained messages when it restarts; either way the state topic would be stale."""
        for channel in self._channels.values():
            for topic, payload, qos in channel.current():
                self._send(topic, payload, qos, retain=True)

    def _replay(self) -> None:
        """Send what waited in the queue, oldest first (called with the lock held)."""
        while self._queue:
            topic, payload, qos, retain = self._queue.peek()
            info = self._send(topic, payload, qos, retain)
            if info.rc not in (0, self._no_conn):  # paho keeps QoS>=1 messages on NO_CONN
                break
            self._queue.sent(info.mid)  # on disk until the broker acknowledges it
            if topic in self._result_topics:
                self.replayed += 1
                self.published += 1

    def _on_message(self, client, userdata, message) -> None:
        if message.topic == self.presence.topic:
            line, answer = self.presence.heard(bytes(message.payload), self.address)
            if line:
                log.warning("%s", line)
            if answer:  # so the other daemon learns of this one at once, too
                self._send(*self.presence.message(), 0)
            return
        if self.commands is None or not message.topic.startswith(f"{self.topic}/set/"):
            return
        for topic, payload in self.commands.handle(message.topic, bytes(message.payload), bool(message.retain)):
            self._send(topic, payload, 1, retain=True)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        # Not under self._lock: paho may call this holding its message lock, which publishes wait for.
        self._generation += 1  # before the clear: _ready sets connected, then compares generations
        was = self.connected.is_set()
        self.connected.clear()
        if was:
            self.disconnects += 1
            if not self._closing:
                self.last_error = f"disconnected: {reason_code}"
                log.warning("MQTT %s %s; reconnecting (QoS %d results %s meanwhile)", self.address,
                            self.last_error, self.qos,
                            "queue" if self.qos and self.options.queue_size else "are dropped")
                hint = self.presence.dropped(time.monotonic() - self._connected_at)
                if hint:
                    log.warning("MQTT %s: %s", self.address, hint)

    def _on_connect_fail(self, client, userdata) -> None:
        # paho calls this inside its `except OSError` (loop_forever): the exception is the reason.
        exc = sys.exc_info()[1]
        self.failures += 1
        self.last_error = f"cannot reach the broker: {exc}" if exc else "cannot reach the broker"
        log.warning("MQTT %s: %s (attempt %d); retrying", self.address, self.last_error, self.failures)

    # ------------------------------------------------------------------ API
    @property
    def reconnects(self) -> int:
        """Successful connections after the first one."""
        return max(0, self.connects - 1)

    @property
    def queued(self) -> int:
        """Results waiting for the broker (not the state, count and event messages queued beside them)."""
        return sum(self._queue.count(topic) for topic in self._result_topics)

    def start(self) -> None:
        """Start connecting in the background; returns at once even if the broker is down."""
        o = self.options
        log.info("MQTT: connecting to %s as %s, topic %s/#, results QoS %d, publish %s%s%s", self.address,
                 self.client_id, self.topic, self.qos, self.policy.mode,
                 f", queue {o.queue_size} ({o.queue_policy})" if self.qos else "",
                 ", Home Assistant discovery" if o.discovery else "")
        self._client.connect_async(self.host, self.port, keepalive=o.keepalive_s)
        self._client.loop_start()

    def _publish(self, topic: str, payload: str, qos: int, retain: bool = False, queue: bool = True,
                 result: Channel | None = None) -> str:
        """Send, queue or drop one message (``result``: the channel of a result): returns ``"sent"``,
        ``"queued"`` or ``"dropped"``."""
        with self._lock:
            if self.connected.is_set() and not self._queue:
                info = self._send(topic, payload, qos, retain)
                if info.rc == 0 or (qos and info.rc == self._no_conn):  # NO_CONN: paho keeps and resends it
                    if result is not None:
                        self.published += 1
                        self._forget_missed(result)
                    return "sent"
            if not queue or qos == 0 or self.options.queue_size == 0:
                if result is not None:  # counted as dropped once a newer one replaces it, as sent if it is sent
                    self._forget_missed(result)
                    result.missed = payload
                return "dropped"
            results = self.queued + (result is not None)
            full = self._queue.append((topic, payload, qos, retain))
            self.dropped += results - self.queued  # results only, not state
            return "dropped" if full and self.options.queue_policy == "drop_newest" else "queued"

    def _forget_missed(self, channel: Channel) -> None:
        """The camera's newest unsent result will not be sent now (a newer one replaces it): dropped."""
        if channel.missed is not None:
            self.dropped += 1
            channel.missed = None

    def _channel(self, camera: str) -> Channel:
        """The channel of ``camera`` (the first one for a name it does not know, e.g. "")."""
        return self._channels.get(camera) or self._first

    def publish_result(self, record: ResultRecord | dict[str, Any] | str,
                       in_view: dict[str, int] | None = None) -> bool:
        """Offer one result (a dict is read into a :class:`~edgekit.serve.record.ResultRecord` once) to
        its camera's publish policy; True when it was sent or queued. A result dropped while disconnected
        counts in ``dropped``; one the policy holds back (``change``/``interval`` modes) in ``suppressed``.
        A ``str`` is an already-encoded line and is published as it is (the first camera's topic), without
        the policy. ``in_view``: a tracked detector's objects in view per label (:mod:`edgekit.serve.objects`):
        its state is then the labels in view and its ``count`` their number, as its count topics say."""
        if isinstance(record, str):
            return self._publish(self._first.result_topic, record, self.qos, result=self._first) != "dropped"
        record = as_record(record)
        channel = self._channel(record.camera)
        previous = channel.policy.state
        given = None if in_view is None else frozenset(label for label, n in in_view.items() if n > 0)
        publish, state = channel.policy.decide(record, given)
        if state != previous:
            for topic, payload in channel.state_messages(state, previous):
                self._publish(topic, payload, 1, retain=True)
        count = None if in_view is None else sum(in_view.values())
        with self._lock:
            sensors = channel.sensors.offer(record, state_text(state), state != previous, count)
        if sensors is not None:  # QoS 0, not queued: the newest is sent again on connect
            self._publish(channel.sensors.topic, sensors, 0, retain=True, queue=False)
        if not publish:
            return False
        payload = record.to_json(state=state_text(state))
        return self._publish(channel.result_topic, payload, self.qos, result=channel) != "dropped"

    def _retained_topics(self) -> list[str]:
        """The retained topics that describe what the device sees (cleared on a clean stop)."""
        commands = self.commands.topics() if self.commands else ()
        return [t for c in self._channels.values() for t in c.retained_topics()] + list(commands)

    def stats(self) -> dict[str, Any]:
        """The /stats ``mqtt`` entry (no credentials in it)."""
        policies = [channel.policy for channel in self._channels.values()]
        return {"broker": self.address, "connected": int(self.connected.is_set()), "published": self.published,
                "dropped": self.dropped, "queued": self.queued, "replayed": self.replayed,
                "suppressed": sum(p.suppressed for p in policies), "state_changes": sum(p.changes for p in policies),
                "publish": self.policy.mode,
                "connect_failures": self.failures, "last_error": self.last_error, **self.presence.stats(),
                **(self._queue_stats() if self.options.queue_file else {})}

    def _queue_stats(self) -> dict[str, Any]:
        """What ``queue_file`` holds: results on disk, results only in memory (a full disk), write errors."""
        on_disk, in_memory = self._queue.where(self._result_topics)
        return {"queue_on_disk": on_disk, "queue_in_memory": in_memory, "queue_write_errors": self._queue.write_errors}

    def close(self, timeout_s: float = 2.0) -> None:
        """Publish ``offline`` (retained), disconnect and stop the network thread, bounded by
        about ``timeout_s`` even when the broker is unreachable (a SIGTERM never waits on it)."""
        self._closing = True
        deadline = time.monotonic() + timeout_s
        with self._lock:
            for channel in self._channels.values():
                self._forget_missed(channel)  # never sent: the counts add up to the results offered
        if self.connected.is_set():
            info = self._send(self.availability_topic, "offline", 1, retain=True)
            for topic in self._retained_topics():  # after offline: Home Assistant shows unavailable, not empty
                info = self._send(topic, b"", 1, retain=True)
            try:
                info.wait_for_publish(timeout=max(0.1, timeout_s / 2))
            except (RuntimeError, ValueError) as exc:  # raised when the connection went away meanwhile
                log.debug("MQTT offline message not confirmed: %s", exc)
        if self._queue and not self.options.queue_file:
            log.warning("MQTT %s: %d queued results not sent before shutdown", self.address, len(self._queue))
        self._client.disconnect()
        # loop_stop joins paho's thread, which may sit in a connect attempt: wait in a helper
        # thread so the daemon's shutdown stays bounded (paho's thread is a daemon thread).
        stopper = threading.Thread(target=self._client.loop_stop, name="mqtt-stop", daemon=True)
        stopper.start()
        stopper.join(max(0.1, deadline - time.monotonic()))
        self._queue.close(self._result_topics)  # with queue_file: what is queued or unacknowledged waits on disk
        if self.node is not None:
            self.node.close()
