"""Where the MQTT publisher works around paho's own behaviour: its log levels and its resend;
and :func:`configure`, the client's settings (credentials, TLS, last will, backoff).

:class:`QuietLogger`: paho logs routine events (a disconnect on shutdown, each retry) at ERROR.

:class:`InFlight`: paho's QoS >= 1 messages that the broker has not acknowledged yet. Why: paho
keeps such messages across a lost connection and sends them again once the next CONNACK has been
handled, that is after ``on_connect`` returns. Whatever ``on_connect``
publishes therefore overtakes them, so replaying the MQTT publisher's queue there would put
older results (the ones paho had in flight when the broker went away) after newer ones. The
publisher notes which messages were unacknowledged when it connects and replays its queue only
once the broker has acknowledged those (bounded by ``REPLAY_WAIT_S``).

Only paho's public API is used: the ``MQTTMessageInfo`` a publish returns and ``on_publish``.
An acknowledgement can arrive on paho's thread before the publishing thread has noted the
message id; such early acknowledgements are kept for a moment (``EARLY_ACK_S``) so the id is
not then waited for in vain.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections import OrderedDict
from typing import Any

REPLAY_WAIT_S = 10.0  # a broker that never acknowledges the old messages does not hold the queue forever
EARLY_ACK_S = 1.0  # message ids advance per publish: a second is far from a wrap at 65535


class QuietLogger(logging.LoggerAdapter):
    """Every paho log record at DEBUG: paho reports routine events (a disconnect on shutdown,
    each retry) at ERROR; our callbacks log what matters, with the broker address."""

    def log(self, level, msg, *args, **kwargs):  # paho calls .log(level, ...)
        super().log(logging.DEBUG, msg, *args, **kwargs)


class InFlight:
    """Message ids paho was given at QoS >= 1 and the broker has not acknowledged (thread-safe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._mids: set[int] = set()
        self._early: OrderedDict[int, float] = OrderedDict()  # acknowledged before noted

    def track(self, info: Any, qos: int, no_conn: int) -> None:
        """Note a message paho keeps until acknowledged (``info`` from ``client.publish``): QoS >= 1,
        accepted or held for the next connection (``no_conn``)."""
        if qos == 0 or info.rc not in (0, no_conn):
            return
        with self._cond:
            if self._early.pop(info.mid, None) is None:
                self._mids.add(info.mid)

    def acknowledged(self, mid: int) -> None:
        """paho's ``on_publish`` for ``mid`` (QoS 0 messages too: those were never noted)."""
        with self._cond:
            if mid in self._mids:
                self._mids.discard(mid)
                self._cond.notify_all()
                return
            now = time.monotonic()
            self._early[mid] = now
            while self._early and now - next(iter(self._early.values())) > EARLY_ACK_S:
                self._early.popitem(last=False)

    def pending(self) -> frozenset[int]:
        """The ids not acknowledged yet."""
        with self._cond:
            return frozenset(self._mids)

    def wait(self, mids: frozenset[int], timeout_s: float = REPLAY_WAIT_S) -> bool:
        """Block until every one of ``mids`` is acknowledged (True) or ``timeout_s`` passed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: not (mids & self._mids), timeout_s)


def configure(client: Any, options: Any, password: str | None, address: str, will_topic: str) -> None:
    """Credentials, TLS, the last will (``offline`` on ``will_topic``) and reconnect backoff of a
    paho client from :class:`~edgekit.serve.mqtt.options.MqttOptions`; a bad TLS file is one line."""
    o, c = options, client
    if o.username:
        c.username_pw_set(o.username, password)
    if o.tls:
        try:
            c.tls_set(ca_certs=o.ca_file or None, certfile=o.cert_file or None, keyfile=o.key_file or None,
                      cert_reqs=ssl.CERT_REQUIRED)
        except (OSError, ValueError, ssl.SSLError) as exc:
            from edgekit.errors import UsageError

            raise UsageError(f"MQTT TLS settings for {address}: {exc}",
                             "check [mqtt] ca_file, cert_file and key_file") from exc
    c.will_set(will_topic, "offline", qos=1, retain=True)
    # paho takes whole seconds; a sub-second minimum would become 0 (a busy loop).
    c.reconnect_delay_set(max(1, round(o.reconnect_min_s)), max(1, round(o.reconnect_max_s)))
    c.connect_timeout = 5.0
