"""Configuration of ``edgekit serve``: one TOML file, validated, and flags that override it.

The file has one table per part of the daemon; every key is optional except ``[model] path``
(which a flag may give instead). ``deploy/serve.example.toml`` documents each key. Unknown
keys, wrong types and out-of-range values are errors that name the file, the table and the
key, so a typo never silently falls back to a default on a device nobody is watching.

Relative paths in the file are relative to the file itself (``/etc/edgekit/serve.toml`` can
say ``path = "bundles/demo"``); relative paths given as flags are relative to the working
directory, as usual on a command line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.runtime import BACKENDS
from edgekit.runtime.backends import MAX_THREADS
from edgekit.serve.config.address import camera_uri_relative_to, parse_address
from edgekit.serve.config.cameras import CameraConfig, check_names, motion_option
from edgekit.serve.config.model import MODEL_MINIMUM, MODEL_PATH_KEYS, ModelConfig, check_model
from edgekit.serve.config.stages import parse_stages
from edgekit.serve.mqtt.discovery import BINARY_DEVICE_CLASSES
from edgekit.serve.mqtt.options import check_mqtt
from edgekit.util.optionspec import Option, OptionValueError, close_match
from edgekit.util.safe_open import NotARegularFile, read_regular

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 devices
    import tomli as tomllib


@dataclass(frozen=True)
class OutputConfig:
    """``[output]``: results as JSON lines."""

    jsonl: str = "auto"  # "auto": stdout, or off under systemd; "-" = stdout, "" = off, else a file (rotated)
    max_bytes: int = 10_000_000
    backups: int = 3  # rotated files kept (file.1 ... file.N); 0 = truncate instead


@dataclass(frozen=True)
class MqttConfig:
    """``[mqtt]``: results, availability and stats on a broker (off when host is empty)."""

    host: str = ""
    port: int = 1883
    topic: str = "edgekit/{device}"  # prefix: <topic>/result, <topic>/availability, <topic>/stats
    device: str = ""  # "" = this machine's host name
    qos: int = 0  # for results; availability always uses QoS 1
    keepalive_s: int = 30
    stats_interval_s: float = 10.0
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 30.0
    username: str = ""
    password_file: str = ""  # a file holding the password (keep secrets out of this file)
    tls: bool = False  # mqtts: verify the broker against ca_file ("" = the system's CAs)
    ca_file: str = ""
    cert_file: str = ""  # client certificate and key for brokers that require one
    key_file: str = ""
    publish: str = "change"  # results: "every" frame, on a "change" of the top label, or at most every "interval"
    min_interval_s: float = 1.0  # "interval": seconds between results
    min_score: float = 0.5  # a label counts as seen from this score ("change", state, binary sensors)
    hysteresis: float = 0.1  # a seen label stays until its score drops below min_score - hysteresis
    confirm_frames: int = 2  # "change": a new state must hold for this many results in a row
    queue_size: int = 1000  # QoS >= 1 results kept while disconnected, replayed on reconnect (0 = none)
    queue_policy: str = "drop_oldest"  # when the queue is full: "drop_oldest" or "drop_newest"
    queue_file: str = ""  # keep that queue in this file across restarts, replayed first ("" = memory only)
    foreign_queue: str = "refuse"  # a queue_file another node wrote (a cloned card): "refuse" (set aside) or "replay"
    commands: bool = False  # obey <topic>/set/<command> (detect ON/OFF, reload, threshold); see control.py
    discovery: bool = False  # Home Assistant MQTT discovery (sensors, binary sensors, availability)
    discovery_prefix: str = "homeassistant"
    labels_of_interest: tuple = ()  # a binary sensor (ON/OFF topic) for each of these labels
    device_class: str = "occupancy"  # Home Assistant device class of those binary sensors ("" = none)
    sensor_interval_s: float = 10.0  # <topic>/sensors (score, counts) at least this often while results flow


@dataclass(frozen=True)
class EventsConfig:
    """``[events]``: a detector's objects as new/update/end events on <topic>/events."""

    enabled: bool = True  # detectors only (a classifier has no objects)
    labels: tuple = ()  # only these labels (empty = all)
    min_score: float = 0.5  # a box is an object from this score
    min_frames: int = 2  # seen in this many frames before "new" (one-frame flickers are no event)
    max_missing: int = 5  # missing from this many frames in a row: "end"
    iou: float = 0.3  # the least overlap that links a box to the same object in the next frame
    update_interval_s: float = 5.0  # "update" at most this often while an object stays (0 = never)
    jsonl: bool = False  # the events in the [output] JSON lines too
    counts: bool = True  # <topic>/count/<label>: objects in view per label (retained, on change)
    snapshots: bool = False  # <topic>/snapshot/<label>: the object's best frame as a JPEG (retained)
    snapshot_width: int = 640  # snapshots are scaled down to at most this width (px)


@dataclass(frozen=True)
class HttpConfig:
    """``[http]``: /metrics, /healthz and /stats (off when listen is empty)."""

    listen: str = "127.0.0.1:9100"
    reload: bool = False  # POST /reload from this machine hot-swaps the bundle, as SIGHUP does
    latency_min_s: float = 0.0001  # smallest latency histogram bucket (1-2-5 series up to 5 s)


@dataclass(frozen=True)
class LogConfig:
    """``[log]``: diagnostics on stderr (results go to [output])."""

    level: str = "info"


@dataclass(frozen=True)
class ServeConfig:
    """The whole validated configuration. Build it with :func:`load_config`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    camera: CameraConfig = field(default_factory=CameraConfig)  # the first (or only) camera
    cameras: tuple = ()  # every camera when they are named ([[camera]], --camera NAME=URI); () = `camera` alone
    output: OutputConfig = field(default_factory=OutputConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    log: LogConfig = field(default_factory=LogConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    stages: tuple = ()  # [[stage]]: a second model on each detection's region (stage_config.py)
    source: str = "defaults"  # where the values came from, for error messages

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every table (what ``edgekit serve --print-config`` shows)."""
        d = dataclasses.asdict(self)
        d.pop("source")
        stages = d.pop("stages")
        if stages:
            d["stage"] = list(stages)
        cameras = d.pop("cameras")
        if cameras:  # named cameras show as the [[camera]] array they came from
            d["camera"] = list(cameras)
        return d

    @property
    def camera_list(self) -> tuple[CameraConfig, ...]:
        """The cameras the daemon reads: the named ones, else the one ``[camera]``."""
        return self.cameras or (self.camera,)

    @property
    def device(self) -> str:
        """The device name used in MQTT topics and metrics."""
        return self.mqtt.device or socket.gethostname()

    @property
    def topic(self) -> str:
        """The MQTT topic prefix with ``{device}`` filled in."""
        return self.mqtt.topic.replace("{device}", self.device)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "camera": CameraConfig,
    "output": OutputConfig,
    "mqtt": MqttConfig,
    "http": HttpConfig,
    "log": LogConfig,
    "events": EventsConfig,
}
_PATH_KEYS = {*(("model", k) for k in MODEL_PATH_KEYS), ("output", "jsonl"), ("mqtt", "password_file"),
              ("mqtt", "ca_file"), ("mqtt", "cert_file"), ("mqtt", "key_file"), ("mqtt", "queue_file")}
_CHOICES = {
    ("model", "delegate"): ("", "xnnpack", "none", "edgetpu"),
    ("model", "backend"): ("", *BACKENDS),
    ("camera", "on_end"): ("reconnect", "stop"),
    ("log", "level"): ("debug", "info", "warning", "error"),
    ("mqtt", "qos"): (0, 1, 2),
    ("mqtt", "publish"): ("every", "change", "interval"),
    ("mqtt", "queue_policy"): ("drop_oldest", "drop_newest"),
    ("mqtt", "foreign_queue"): ("refuse", "replay"),
    ("mqtt", "device_class"): BINARY_DEVICE_CLASSES,
}
_MINIMUM = {  # (table, key) -> smallest allowed value
    **{("model", k): v for k, v in MODEL_MINIMUM.items()},
    ("http", "latency_min_s"): 1e-6,
    **{("camera", k): v for k, v in (("reconnect_min_s", 0.01), ("reconnect_max_s", 0.01), ("stall_timeout_s", 0.1))},
    **{("output", k): v for k, v in (("max_bytes", 1024), ("backups", 0))},
    **{("mqtt", k): v for k, v in (("port", 1), ("keepalive_s", 5), ("stats_interval_s", 0.1),
        ("reconnect_min_s", 1), ("reconnect_max_s", 1), ("min_interval_s", 0.0), ("min_score", 0.0),
        ("hysteresis", 0.0), ("confirm_frames", 1), ("queue_size", 0), ("sensor_interval_s", 1.0))},
    **{("events", k): v for k, v in (("min_score", 0.0), ("min_frames", 1), ("max_missing", 1), ("iou", 0.01),
        ("update_interval_s", 0.0), ("snapshot_width", 64))},
}


MAX_SECONDS = 365 * 86400
MAX_CONFIG_BYTES = 1 << 20


_MAXIMUM = {  # (table, key) -> largest allowed value, what is wrong above it, the fix
    # 16 bits in CONNECT: paho's thread died on a larger keepalive
    ("mqtt", "keepalive_s"): (65535, "is more than MQTT allows", "use 5-65535 s"),
    ("mqtt", "port"): (65535, "is not a TCP port", "use 1-65535 (1883 is usual)"),
    ("model", "threads"): (MAX_THREADS, f"is more than {MAX_THREADS} (4 per CPU core)",  # the runtime refuses it
                           "use 0 (the runtime's default) or at most the number of cores"),
}
_TYPES = {bool: ("bool", "true/false"), int: ("int", "an integer"), float: ("float", "a number"),
          str: ("str", "a string"), dict: ("table", "a table"), tuple: ("strings", "a list of strings")}


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(value)
    return tuple(value)


@functools.cache
def option(table: str, key: str) -> Option:
    """The spec of ``[table] key``: its type and default from the dataclass, its choices and range
    from the tables above (a key ending in ``_s`` is at most a year: threading's waits overflow);
    ``[camera] motion_*`` keys are the motion gate's own options."""
    motion = motion_option(key) if table == "camera" else None
    if motion is not None:
        return motion
    default = getattr(SECTIONS[table](), key)
    high = _MAXIMUM.get((table, key), (MAX_SECONDS if key.endswith("_s") else None,))[0]
    kind = _TYPES[type(default)][0]
    return Option(key, kind, default, choices=_CHOICES.get((table, key), ()), ge=_MINIMUM.get((table, key)),
                  le=high, parse=_strings if kind == "strings" else None)


def _check_value(where: str, table: str, key: str, value: Any, default: Any) -> Any:
    """Type- and range-check one value against :func:`option`; returns it converted (an int where a
    float is expected, a list of strings as a tuple)."""
    spec, at = option(table, key), f"{where}: [{table}] {key}"
    if spec.type == "float" and isinstance(value, float) and not math.isfinite(value):
        # nan slips through every "< minimum" check (and would make a backoff loop spin)
        raise UsageError(f"{at} = {value!r} is not a finite number", "give a real number")
    try:
        if value is None:  # a dict from code may hold None; to an Option it means "the default"
            raise OptionValueError(spec, value, spec.takes(), wrong_type=True)
        return spec.coerce(value, text=False)
    except OptionValueError as exc:
        if exc.wrong_type:
            raise UsageError(f"{at} must be {_TYPES[type(default)][1]}, got {value!r}",
                             f"see `edgekit serve --write-example-config -` for the [{table}] table") from None
        if key.startswith("motion_"):  # the gate's range, in its words
            raise UsageError(f"{at} = {value!r} must be {exc.what}",
                             f"e.g. {key} = {spec.default}: {spec.help}") from None
        if spec.choices:
            raise UsageError(f"{at} = {value!r} is not one of {', '.join(repr(c) for c in spec.choices)}",
                             f"set [{table}] {key} to one of those") from None
        if spec.ge is not None and value < spec.ge:
            raise UsageError(f"{at} = {value!r} is below the minimum {spec.ge}", "raise it") from None
        what, fix = _MAXIMUM.get((table, key), (0, "is more than a year", f"use at most {MAX_SECONDS}"))[1:]
        raise UsageError(f"{at} = {value!r} {what}", fix) from None


def _section(where: str, table: str, raw: Any, base_dir: Path | None) -> Any:
    cls = SECTIONS[table]
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: [{table}] must be a table, got {raw!r}", f"write it as [{table}] key = value")
    defaults = cls()
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in raw.items():
        if key not in names:
            close = close_match(key, names)
            hint = f"did you mean {close!r}?" if close else f"known keys: {', '.join(names)}"
            raise UsageError(f"{where}: unknown key {key!r} in [{table}]", hint)
        value = _check_value(where, table, key, value, getattr(defaults, key))
        if base_dir is not None and (table, key) in _PATH_KEYS and value not in ("", "-", "auto"):
            value = _relative_to(base_dir, value)
        if base_dir is not None and (table, key) == ("camera", "uri"):
            value = camera_uri_relative_to(base_dir, value)
        values[key] = value
    return cls(**values)


def _relative_to(base_dir: Path, value: Any) -> Any:
    """A path (or a list of paths) of the file, relative to the file's folder unless absolute."""
    if isinstance(value, tuple):
        return tuple(_relative_to(base_dir, v) for v in value)
    return str(base_dir / value) if not Path(value).is_absolute() else value


def from_dict(raw: dict[str, Any], where: str = "config", base_dir: Path | None = None) -> ServeConfig:
    """Validate a parsed TOML document (a dict of tables) into a :class:`ServeConfig`."""
    tables = {}
    for table, value in raw.items():
        if table == "stage":  # [[stage]]: an array of tables, checked on its own
            tables["stages"] = parse_stages(value, where, base_dir)
            continue
        if table not in SECTIONS:
            close = close_match(table, SECTIONS)
            hint = f"did you mean [{close}]?" if close else f"known tables: {', '.join(SECTIONS)}"
            raise UsageError(f"{where}: unknown table [{table}]", hint)
        if table == "camera" and isinstance(value, list):  # [[camera]]: several cameras, each named
            if not value:
                raise UsageError(f"{where}: [[camera]] holds no camera", "write [[camera]] name = ... uri = ...")
            tables["cameras"] = tuple(_section(f"{where} (camera {n})", table, item, base_dir)
                                      for n, item in enumerate(value, 1))
            continue
        tables[table] = _section(where, table, value, base_dir)
    config = ServeConfig(**tables, source=where)
    return check(with_cameras(config, config.camera_list))


def with_cameras(config: ServeConfig, cameras: tuple[CameraConfig, ...]) -> ServeConfig:
    """``config`` reading ``cameras``: the first is ``camera`` too (its backoff also paces model
    reopens); several cameras, or a named one, are ``cameras`` (one unnamed camera: ``()``)."""
    named = len(cameras) > 1 or bool(cameras[0].name)
    return dataclasses.replace(config, camera=cameras[0], cameras=tuple(cameras) if named else ())


def load_config(path: str | Path | None) -> ServeConfig:
    """Read and validate a TOML file; ``None`` gives the defaults (flags then fill in the rest).

    Raises UsageError (with the file, table and key in the message) for a missing or
    unreadable file, a TOML syntax error, an unknown table or key, or a bad value.
    """
    if path is None:
        return ServeConfig()
    path = Path(path)
    try:
        # bounded (--config /dev/zero read until memory ran out) and never blocking (a FIFO refused)
        data = read_regular(path, MAX_CONFIG_BYTES)
        if len(data) > MAX_CONFIG_BYTES:
            raise UsageError(f"config file {path} is over {MAX_CONFIG_BYTES >> 20} MiB: not a serve configuration",
                             "give the TOML file (edgekit serve --write-example-config PATH writes one)")
        text = data.decode("utf-8")
    except FileNotFoundError as exc:
        raise UsageError(f"config file {path} does not exist",
                         "write a documented one: edgekit serve --write-example-config PATH") from exc
    except (OSError, UnicodeDecodeError) as exc:
        fix = "give the TOML file itself" if isinstance(exc, NotARegularFile) else "check its permissions and encoding"
        raise UsageError(f"cannot read config file {path}: {exc}", fix) from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}", "fix the line named above") from exc
    return from_dict(raw, where=str(path), base_dir=path.resolve().parent)


def check(config: ServeConfig) -> ServeConfig:
    """Checks that involve several keys; returns ``config`` unchanged when it is consistent."""
    where = config.source
    m = config.mqtt
    for c in config.camera_list:
        if c.reconnect_max_s < c.reconnect_min_s:
            raise UsageError(f"{where}: [camera] reconnect_max_s is below reconnect_min_s", "swap or raise them")
    check_names(config.camera_list, where)
    if m.reconnect_max_s < m.reconnect_min_s:
        raise UsageError(f"{where}: [mqtt] reconnect_max_s is below reconnect_min_s", "swap or raise them")
    check_model(where, config.model)
    if config.http.latency_min_s >= 5:
        raise UsageError(f"{where}: [http] latency_min_s must be below 5 s", "e.g. 0.0001 (100 us)")
    check_mqtt(where, m, config.events)
    topic = config.topic
    if not topic or any(ch in topic for ch in "+#\0") or topic.startswith("/") or topic.endswith("/"):
        raise UsageError(f"{where}: [mqtt] topic {m.topic!r} gives {topic!r}, not a valid topic prefix",
                         "use letters, digits, '-', '_' and '/' between levels, e.g. edgekit/{device}")
    if config.http.listen:
        parse_address(config.http.listen, 9100, what="[http] listen", where=where)
    return config


def override(config: ServeConfig, table: str, **values: Any) -> ServeConfig:
    """A copy of ``config`` with keys of one table replaced (``None`` values are ignored).

    Values are checked like values read from a file, so a bad flag gets the same message.
    """
    values = {k: v for k, v in values.items() if v is not None}
    if not values:
        return config
    section = getattr(config, table)
    for key, value in values.items():
        _check_value("command line", table, key, value, getattr(SECTIONS[table](), key))
    updated = dataclasses.replace(config, **{table: dataclasses.replace(section, **values)})
    if table == "camera":  # a [camera] flag holds for every camera (a name makes the one camera named)
        updated = with_cameras(updated, tuple(dataclasses.replace(c, **values) for c in config.camera_list))
    return check(updated)
