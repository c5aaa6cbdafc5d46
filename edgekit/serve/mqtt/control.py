"""Commands over MQTT (``[mqtt] commands = true``, off by default): pause detection, reload the
bundle, change the score threshold.

A command is a message on ``<topic>/set/<command>``; every one is answered on the retained
``<topic>/set/<command>/state`` (QoS 1) and logged (INFO when done, WARNING when refused):

==============  =====================  ==============================================================
command         payload                effect
==============  =====================  ==============================================================
``detect``      ``ON`` / ``OFF``       ``OFF`` pauses inference: the camera keeps being read (so
                                       ``ON`` resumes at once and ``/healthz`` still sees a camera
                                       that dies), frames are dropped unprocessed (``/stats``
                                       ``control.paused_frames``), objects in view end, the
                                       state becomes ``none``; ``ON`` resumes.
``reload``      empty or ``PRESS``     the same as ``POST /reload`` and SIGHUP: look at ``[model]
                                       path`` again and hot-swap a new bundle (the outcome is a
                                       ``model_swap`` event on ``<topic>/events``).
``threshold``   ``0`` .. ``1``         the score from which a label or a box counts as seen:
                (e.g. ``0.65``)        ``[mqtt] min_score`` (state, binary sensors, ``count``)
                                       and ``[events] min_score`` (objects) of the running daemon.
==============  =====================  ==============================================================

The answer: ``{"command", "ok", "requested", "state", "error", "time"}``; ``state`` is the
command's state after it (``ON``/``OFF``, the threshold, ``idle``/``requested``) whether it was
obeyed or refused, so a Home Assistant switch can read ``{{ value_json.state }}``. Every state
is published again on each connect (the daemon's own values: commands do not outlive a
restart) and cleared by a clean stop.

Payloads are untrusted: at most ``MAX_PAYLOAD_BYTES`` of ASCII, matched exactly (no case
folding, no whitespace, no exponent, no ``nan``). A refusal (an unknown command, a bad payload,
a command the broker hands over as *retained* when the daemon subscribes: it would run again
at every connect) is one WARNING
line and a ``"ok": false`` answer; unknown commands are answered on ``<topic>/set/unknown/state``
(one topic, whatever the name: nobody can make the device retain topics of their choosing).
More than ``RATE_BURST`` commands at once, ``RATE_PER_S`` a second after that, are ignored
without an answer (counted, logged once in ``RATE_LOG_S``). Who may publish commands is the
broker's business: see docs/serve.md (mosquitto users and ACLs).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("edgekit.serve")

COMMANDS = ("detect", "reload", "threshold")
MAX_PAYLOAD_BYTES = 32
RATE_PER_S, RATE_BURST, RATE_LOG_S = 5.0, 10.0, 10.0
_THRESHOLD = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")


class CommandRefused(ValueError):
    """A command that is not obeyed; the message says why."""


def shown(text: str | bytes, limit: int = 40) -> str:
    """An untrusted name or payload for a log line or an answer: ASCII, one line, bounded."""
    if isinstance(text, bytes):
        text = text[:limit].decode("ascii", "replace")
    return ascii(text[:limit])[1:-1] + ("..." if len(text) > limit else "")


def parse_command(name: str, payload: bytes, retained: bool = False) -> Any:
    """The value of one command: ``True``/``False`` (detect), ``None`` (reload), a float
    (threshold). Raises :class:`CommandRefused` saying what is wrong and what is expected."""
    if name not in COMMANDS:
        raise CommandRefused(f"unknown command; the commands are {', '.join(COMMANDS)}")
    if retained:
        raise CommandRefused("a retained command is not obeyed (the broker would repeat it on every "
                             "connect): publish it without retain")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise CommandRefused(f"payload of {len(payload)} bytes; at most {MAX_PAYLOAD_BYTES}")
    try:
        text = payload.decode("ascii")
    except UnicodeDecodeError:
        raise CommandRefused("payload is not ASCII") from None
    if name == "detect":
        if text not in ("ON", "OFF"):
            raise CommandRefused("detect takes ON or OFF")
        return text == "ON"
    if name == "reload":
        if text not in ("", "PRESS"):
            raise CommandRefused("reload takes an empty payload or PRESS")
        return None
    if not _THRESHOLD.fullmatch(text):
        raise CommandRefused("threshold takes a decimal number from 0 to 1, e.g. 0.65")
    value = float(text)
    if value > 1:
        raise CommandRefused(f"threshold {text} is above 1: scores are 0..1")
    return value


class Controls:
    """What commands set, for the daemon: MQTT's thread calls :meth:`handle`, the inference loop
    :meth:`gate` before each frame (which applies the changes on its own thread).

    Args:
        topic: the device's topic prefix.
        threshold: the starting threshold (``[mqtt] min_score``).
        reload: the daemon's ``request_reload(why)``; None when the model was not opened from
            ``[model] path`` (a reload is then refused).
    """

    def __init__(self, topic: str, threshold: float, reload: Callable[[str], Any] | None,
                 clock: Callable[[], float] = time.monotonic):
        self.topic = topic
        self.subscription = f"{topic}/set/+"
        self._reload = reload
        self._clock = clock
        self._lock = threading.Lock()
        self.detect = True
        self.threshold = threshold
        self.reload_state = "idle"
        self._version = self._applied = 0
        self._paused = False
        self.counts = {"accepted": 0, "refused": 0, "ignored": 0, "paused_frames": 0}
        self._tokens, self._refill, self._next_log = RATE_BURST, clock(), 0.0

    def state_topic(self, name: str) -> str:
        """Where the answers to ``name`` go (unknown names share one topic)."""
        return f"{self.topic}/set/{name if name in COMMANDS else 'unknown'}/state"

    def _state(self, name: str) -> str:
        if name == "detect":
            return "ON" if self.detect else "OFF"
        if name == "threshold":
            return f"{self.threshold:g}"
        return self.reload_state if name == "reload" else ""

    def _answer(self, name: str, ok: bool, requested: str | None, error: str = "") -> tuple[str, str]:
        body = {"command": name if name in COMMANDS else "unknown", "ok": ok, "requested": requested,
                "state": self._state(name), "error": error, "time": round(time.time(), 3)}
        return self.state_topic(name), json.dumps(body, separators=(",", ":"))

    def states(self) -> list[tuple[str, str]]:
        """Each command's state topic with its current state (retained again on every connect)."""
        with self._lock:
            return [self._answer(name, True, None) for name in COMMANDS]

    def topics(self) -> list[str]:
        """The retained topics this feature writes (cleared on a clean stop)."""
        return [self.state_topic(name) for name in (*COMMANDS, "unknown")]

    def handle(self, topic: str, payload: bytes, retained: bool = False) -> list[tuple[str, str]]:
        """One message received on :attr:`subscription`: obey or refuse it; returns the answer
        ``[(state topic, JSON)]`` to publish retained (none for a message over the rate)."""
        if not self._take_token():
            return []
        name = topic[len(self.topic) + len("/set/"):]
        try:
            value = parse_command(name, payload, retained)
        except CommandRefused as exc:
            self.counts["refused"] += 1
            log.warning("MQTT command %s refused: %s (payload %r)", shown(name), exc, shown(payload))
            with self._lock:
                return [self._answer(name, False, shown(payload), str(exc))]
        error = self._obey(name, value)
        if error:
            self.counts["refused"] += 1
            log.warning("MQTT command %s refused: %s", name, error)
        else:
            self.counts["accepted"] += 1
            log.info("MQTT command %s %s obeyed", name, shown(payload))
        with self._lock:
            return [self._answer(name, not error, payload.decode("ascii"), error)]

    def _obey(self, name: str, value: Any) -> str:
        """Apply a parsed command; returns why it could not be ('' when it was)."""
        if name == "reload":
            if self._reload is None:
                return "reload is not available: the model was not opened from [model] path"
            self._reload("MQTT set/reload")
            self.reload_state = "requested"
            return ""
        with self._lock:
            if name == "detect":
                self.detect = value
            else:
                self.threshold, self._version = value, self._version + 1
        return ""

    def _take_token(self) -> bool:
        now = self._clock()
        self._tokens = min(RATE_BURST, self._tokens + (now - self._refill) * RATE_PER_S)
        self._refill = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.counts["ignored"] += 1
        if now >= self._next_log:
            self._next_log = now + RATE_LOG_S
            log.warning("MQTT commands arrive faster than %g a second: ignored without an answer (%d so far)",
                        RATE_PER_S, self.counts["ignored"])
        return False

    # ------------------------------------------------------------------ the inference loop's side
    def gate(self, mqtt: Any, objects: Any) -> bool:
        """Apply what commands changed (the inference loop, between frames); False while
        detection is off, when the loop drops the frame. ``objects``: the object feeds (one per
        camera), or None."""
        with self._lock:
            detect, threshold, version = self.detect, self.threshold, self._version
        if version != self._applied:
            self._applied = version
            mqtt.set_min_score(threshold)
            for feed in objects or ():
                feed.tracker.min_score = feed.bar = threshold  # one bar for objects and what MQTT shows
            log.info("score threshold %g from now on", threshold)
        if not detect and not self._paused:
            self._paused = True
            for feed in objects or ():
                feed.close()  # what was in view ends: a paused camera sees nothing
            mqtt.publish_idle()
            log.info("detection paused (MQTT set/detect OFF): frames are read and dropped")
        elif detect and self._paused:
            self._paused = False
            log.info("detection resumed (MQTT set/detect ON)")
        if not detect:
            self.counts["paused_frames"] += 1
        return detect

    def stats(self) -> dict[str, Any]:
        """The /stats ``control`` entry."""
        return {"detect": "ON" if self.detect else "OFF", "threshold": self.threshold,
                "reload": self.reload_state, **self.counts}
