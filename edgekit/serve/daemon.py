"""``edgekit serve``: the on-device service, camera -> model -> JSON lines / MQTT / Prometheus.

Two threads do the work. One thread reads the camera as fast as it delivers and keeps only
the newest frame in a one-slot mailbox (a live camera's own grabber thread puts its frames
straight there; files and clips are read by the capture thread, which also opens and reopens
every source and watches a live one for stalls); the inference loop (the main thread) takes
whatever frame is newest when it is free. When the camera outruns the model, frames are
overwritten in the mailbox and counted as skipped, so latency stays bounded by about one
frame interval plus one inference, however long the daemon runs. Capture and inference
overlap, so throughput approaches the slowest stage instead of the sum of both.

Several cameras (``[[camera]]``, ``--camera NAME=URI``) share the one model (an Edge TPU cannot
be opened twice): each camera has its own capture thread and mailbox, and the loop takes the
newest frame of each camera in turn (:mod:`edgekit.serve.cameras`), passing over a camera with
nothing new; every result, event, topic and per-camera metric names its camera. A camera with
``motion = true`` lets only frames with motion through to its mailbox (:mod:`edgekit.camera.motion`).

Faults are survived, counted and visible: a camera that fails to open or stops is reopened
with exponential backoff (``/healthz`` is 503 meanwhile); a model that keeps failing is
reopened; unusable frames are counted and skipped; a broker that is down only drops the
MQTT copy of results (JSON lines keep them). SIGTERM/SIGINT finish the current frame, flush
the outputs, publish ``offline`` and return within a few seconds.

>>> from edgekit.serve.config.load import ServeConfig, override        # doctest: +SKIP
>>> config = override(ServeConfig(), "model", path="dist/demo-cpu")
>>> with Daemon(config) as daemon:
...     daemon.run(max_frames=100)
"""


from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from edgekit.errors import UsageError
from edgekit.metrics import PipelineMetrics
from edgekit.serve.cameras import CameraFeed, CameraSet
from edgekit.serve.capture import check_reduced_decode, open_source
from edgekit.serve.config.load import ServeConfig, parse_address
from edgekit.serve.config.preflight import preflight
from edgekit.serve.config.sensor import check_opened, is_sensor_camera
from edgekit.serve.http.status import DETECT_STAGES, LATENCY_STAGES, DaemonStatus
from edgekit.serve.mqtt.control import Controls
from edgekit.serve.mqtt.from_config import count_labels, mqtt_from_config
from edgekit.serve.mqtt.publisher import MqttPublisher
from edgekit.serve.object_feed import ObjectFeed
from edgekit.serve.record import ResultRecord, record_from
from edgekit.serve.sensor import SensorCamera
from edgekit.serve.sink import JsonLinesSink
from edgekit.serve.stats import RATE_WINDOW_S, Counters, RateMeter
from edgekit.serve.supervisor import ModelSupervisor, model_options
from edgekit.serve.swap import BundleSwap
from edgekit.serve.systemd import Watchdog, resolve_output, sd_notify
from edgekit.util.finite_json import to_json

__all__ = ["Daemon", "RateMeter", "sd_notify", "model_options", "open_source", "RATE_WINDOW_S", "LATENCY_WINDOW",
           "LATENCY_STAGES", "DETECT_STAGES"]

log = logging.getLogger("edgekit.serve")

LATENCY_WINDOW = 1000  # recent frames behind the percentiles in /stats (bounded: the daemon runs for weeks)
STATS_LOG_INTERVAL_S = 60.0  # a stats line in the journal this often
POLL_S = 0.1  # how often an idle loop checks for stop: bounds the reaction to SIGTERM


class Daemon(DaemonStatus):
    """The service, usable from Python (tests, robot glue) as well as from ``edgekit serve``.

    Args:
        config: a validated :class:`~edgekit.serve.config.load.ServeConfig`.
        runtime_factory: ``() -> Runtime``; opens the model (default: ``[model]`` through
            :func:`edgekit.model.open_model`). Called again to reopen a model that keeps failing.
        camera_factory: ``(uri, options) -> FrameSource``; opens a camera (default:
            :func:`edgekit.camera.open_camera`). Called again after every camera loss, for every camera.
        labels: class names; default from the config (bundle or labels file).
        clock: nanosecond monotonic clock; must match the clock of ``Frame.t_capture_ns``.

    ``start()`` opens the model (errors raise: a model that cannot load is a configuration
    problem), the outputs, the HTTP endpoint and the capture threads. ``run()`` is the
    inference loop; it returns after ``stop()`` (thread- and signal-safe), ``max_frames`` or
    ``duration_s``, or when every source configured with ``on_end = "stop"`` has ended, and closes
    everything. Use the daemon as a context manager to be sure it closes.

    The parts: :class:`~edgekit.serve.cameras.CameraSet` (a :class:`~edgekit.serve.capture.Capture`
    thread per camera, their turns),
    :class:`~edgekit.serve.supervisor.ModelSupervisor` (model, Pipeline, reopen),
    :mod:`edgekit.serve.stats` (counters, rates), :class:`~edgekit.serve.http.status.DaemonStatus` (health,
    /stats), :mod:`edgekit.serve.systemd`.
    """

    def __init__(
        self,
        config: ServeConfig,
        runtime_factory: Callable[[], Any] | None = None,
        camera_factory: Callable[[str, dict], Any] | None = None,
        labels: list[str] | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ):
        config = resolve_output(config)  # [output] jsonl "auto": stdout, or a file under systemd
        self._stop = threading.Event()
        self._fleet: Any = None  # [model] source: the channel follower, whose versions folder is [model] path
        if config.model.source and runtime_factory is None:
            from edgekit.fleet.follower import ChannelFollower

            self._fleet = ChannelFollower(config, self._stop)
            config = self._fleet.configured(config)
        self.config = config
        self._clock = clock
        self._counters = Counters()
        # One bounded sink for the life of the daemon, shared by every Pipeline a model
        # reopen creates: /stats percentiles cover the newest LATENCY_WINDOW frames.
        self._frame_metrics = PipelineMetrics(warmup=0, window=LATENCY_WINDOW)
        self._model = ModelSupervisor(config, runtime_factory, labels, self._frame_metrics, self._counters, clock)
        # one capture per camera, one model for all: the loop gives each camera its turn
        self._cameras = CameraSet(config.camera_list, camera_factory or self._camera_factory(), self._counters,
                                  self._stop, clock)
        self._process_rate = RateMeter(clock=clock)
        # What start() checks before opening anything: only the parts this daemon opens itself.
        self._preflight = {"model": runtime_factory is None, "camera": camera_factory is None}
        self._swap: BundleSwap | None = None
        self._objects: dict[str, ObjectFeed] = {}  # a detector's objects -> new/update/end events, per camera
        self._controls: Controls | None = None  # [mqtt] commands: detect ON/OFF, reload, threshold
        self._started_ns: int | None = None
        self.sink: JsonLinesSink | None = None
        self.mqtt: MqttPublisher | None = None
        self.http: Any = None
        self.metrics: Any = None
        self._closed = False
        self._last_result: ResultRecord | None = None  # /stats: what the model saw last

    def _camera_factory(self) -> Callable[[str, dict], Any]:
        """The default camera factory: :func:`open_source`, or for the AI Camera (``imx500``) a source on
        the model's backend, which owns the camera (:class:`~edgekit.serve.sensor.SensorCamera`)."""
        if any(is_sensor_camera(c.uri) for c in self.config.camera_list):
            return SensorCamera(self._model)
        return open_source

    # ------------------------------------------------------------------ life cycle
    def start(self) -> Daemon:
        """Open the model and outputs and start capturing. Raises EdgekitError on a bad model."""
        cfg = self.config
        if self._fleet is not None:  # a version that verifies on disk, or the channel's fetched now
            self._fleet.prepare()
        preflight(cfg, **self._preflight)
        self._model.open()
        try:
            check_opened(cfg, self._model.runtime)  # a fleet's bundle, or a caller's runtime, is known only now
        except UsageError:
            self._model.close()  # the imx500 backend's camera is let go even by a caller that never closes
            raise
        for camera in cfg.camera_list:
            check_reduced_decode(camera.options, self._model.pipeline.preprocess.spec.crop)
        if cfg.events.enabled and (getattr(self._model, "_task", None) or ("classify",))[0] == "detect":
            self._objects = {c.name: ObjectFeed(cfg, lambda: self._model.identity, camera=c.name)
                             for c in cfg.camera_list}
        if self._preflight["model"]:  # hot-swap needs the daemon to open [model] path itself
            self._swap = BundleSwap(cfg, self._model.open_candidate, self._model, self._stop)
            self._swap.on_event = self._swap_event  # fleet follower and MQTT both hear each outcome
            self._swap.start()
            if self._fleet is not None:
                self._fleet.attach(self._swap, self._model)
        # the results file last: a port in use or a bad TLS file must not leave an empty file behind
        if cfg.http.listen:
            self._start_http(*parse_address(cfg.http.listen, 9100, "[http] listen"))
        if cfg.mqtt.host:
            self._start_mqtt()
        self.sink = JsonLinesSink(cfg.output.jsonl, cfg.output.max_bytes, cfg.output.backups)
        for feed in self._objects.values():
            feed.mqtt, feed.sink = self.mqtt, self.sink
        self._started_ns = self._clock()
        self._cameras.start()
        sd_notify("READY=1")
        return self

    def _start_mqtt(self) -> None:
        counted = count_labels(self.config, self._model.labels or [], bool(self._objects))
        self.mqtt = mqtt_from_config(self.config, model=self._model.identity.get("bundle", ""), count_labels=counted)
        if self.config.mqtt.commands:  # off by default: who may send them is the broker's ACL
            reload = self.request_reload if self._swap is not None else None
            self.mqtt.commands = self._controls = Controls(self.config.topic, self.config.mqtt.min_score, reload)
        self.mqtt.start()

    def _start_http(self, host: str, port: int) -> None:
        from edgekit.serve.http.endpoint import HttpEndpoint, ServeMetrics, latency_buckets

        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("HTTP metrics listen on %s: reachable from the network", host)
        self.metrics = ServeMetrics(self.stats, latency_buckets(self.config.http.latency_min_s))
        reload = self.request_reload if self.config.http.reload else None
        try:
            self.http = HttpEndpoint(host, port, self.metrics, self.health, self.stats, reload=reload)
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc}", "choose another [http] listen port") from exc
        self.http.start()
        log.info("metrics on http://%s:%d/metrics", *self.http.address)

    def _swap_event(self, event: dict[str, Any]) -> None:
        """A hot-swap outcome: to the channel follower, and as an MQTT event (fleet dashboards, alerts)."""
        if self._fleet is not None:
            self._fleet.on_swap_event(event)
            event = {**event, "source": str(self._fleet.location), "channel": self._fleet.channel}
        if self.mqtt is not None:  # "type" tells it from an object's new/update/end on the same topic
            self.mqtt.publish_event({"device": self.config.device, "type": "model_swap", **event})

    def stop(self) -> None:
        """Ask the daemon to stop after the current frame. Safe from signal handlers and threads."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def swaps(self) -> dict[str, Any]:
        """Hot-swap counts (ok, rolled_back, refused), cheap to poll (``stats()`` computes percentiles)."""
        return self._swap.stats() if self._swap is not None else {}

    def request_reload(self, why: str) -> dict[str, Any]:
        """Look at the bundle path again and hot-swap a new bundle (SIGHUP, POST /reload).

        Signal- and thread-safe; the work happens in the swap thread. Returns what the
        caller may show (the active bundle)."""
        if self._swap is None:
            log.info("%s: reload is not available (the model was not opened from [model] path); ignored", why)
            return {"requested": why, "available": False}
        return self._swap.request(why)

    def run(self, max_frames: int | None = None, duration_s: float | None = None) -> dict[str, Any]:
        """The inference loop; returns the final stats after closing everything."""
        if self._started_ns is None:
            self.start()
        try:
            self._loop(max_frames, duration_s)
        finally:
            self.close()
        if self._cameras.fatal is not None:
            raise self._cameras.fatal
        return self.stats()

    def close(self) -> None:
        """Stop capturing, flush outputs, publish ``offline`` and release everything (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        sd_notify("STOPPING=1")
        self._cameras.wake()
        self._cameras.join(timeout_s=1.0)
        if self._fleet is not None:
            self._fleet.close()
        if self._swap is not None:
            self._swap.close()
        for objects in self._objects.values():  # every object still in view ends with the daemon
            objects.close()
        for part in (self.sink, self.mqtt, self.http):
            if part is not None:
                part.close()
        self._model.close()
        self._model.close_stage()
        if self._started_ns is not None:  # a start that failed already said why, in one line
            log.info("stopped after %d frames", self._counters.get("frames", "processed"))

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ inference loop
    def _loop(self, max_frames: int | None, duration_s: float | None) -> None:
        deadline = None if duration_s is None else time.monotonic() + duration_s
        start = time.monotonic()
        self._next_stats = start + self.config.mqtt.stats_interval_s  # the broker is still connecting now
        self._next_log = start + STATS_LOG_INTERVAL_S
        self._watchdog = Watchdog()
        done = 0
        while not self._stop.is_set():
            now = time.monotonic()
            self._housekeeping(now)
            if deadline is not None and now >= deadline:
                break
            if self._model.pipeline is None:  # the model failed: reopen it without blocking housekeeping
                if not self._model.retry(now):
                    self._stop.wait(POLL_S)
                continue
            if self._swap is not None:
                self._swap.install_pending()  # between two frames: none is lost or run twice
            got = self._cameras.take(POLL_S)  # the next camera's newest frame, round robin
            if got is None:
                if self._cameras.ended:
                    break
                continue
            feed, frame = got
            if self._controls is not None and not self._controls.gate(self.mqtt, self._objects.values()):
                continue  # detection is off: the camera is read, the frame dropped
            if self._process(frame, feed):
                done += 1
                if max_frames is not None and done >= max_frames:
                    break

    def _housekeeping(self, now: float) -> None:
        """Periodic work of the loop: systemd watchdog, MQTT stats, a journal line."""
        # the loop is alive: a hung inference stops these; so does an HTTP endpoint that cannot answer /healthz
        self._watchdog.tick(now, self.http.io_problem() if self.http is not None else "")
        if now >= self._next_stats:
            self._next_stats = now + self.config.mqtt.stats_interval_s
            if self.mqtt is not None:
                self.mqtt.publish_stats(to_json(self.stats()))
        if now >= self._next_log:
            log.info("%s", self.stats_line())
            self._next_log = now + STATS_LOG_INTERVAL_S

    def _process(self, frame: Any, feed: CameraFeed) -> bool:
        """Run one frame of ``feed``'s camera through the pipeline and publish it; True when a
        result was produced."""
        pipeline = self._model.pipeline
        if pipeline is None:  # closed since the loop looked (the AI Camera's backend, when its camera went)
            return False
        try:
            result = pipeline.step(frame)
        except Exception as exc:  # any backend failure: count, keep serving, reopen if it persists
            if self._swap is not None and self._swap.frame_failed(exc):
                return self._process(frame, feed)  # rolled back: the previous model runs this frame
            self._model.failed(exc)
            return False
        if result is None:  # unusable frame: the pipeline logged why
            feed.count("frames", bad=1)
            return False
        ms = result.timings_ms
        feed.count("frames", processed=1)
        self._model.succeeded()
        if self._swap is not None:
            self._swap.frame_ok()
            self._swap.remember(frame, result)
        now = self._clock()
        self._process_rate.add(1, now)
        feed.process_rate.add(1, now)
        if self.metrics is not None:
            self.metrics.observe(ms["preprocess"] / 1e3, ms["inference"] / 1e3, ms["end_to_end"] / 1e3,
                                 ms.get("postprocess", 0.0) / 1e3,
                                 **{k: ms[k] / 1e3 for k in DETECT_STAGES if k in ms})
        # built once: results name the model, variant and bundle hash; every output reads this record
        record = record_from(result, self.config.device, self._model.identity, camera=feed.name)
        self._last_result = record
        self._publish(record, getattr(frame, "array", None))
        return True

    def _publish(self, record: ResultRecord, image: Any = None) -> None:
        objects = self._objects.get(record.camera)
        in_view = None
        if objects is not None and record.is_detector:
            in_view = objects.frame(record, image)
        elif objects is not None:  # no detector now (a hot-swap allowed to change the task)
            objects.close()  # what was in view ends; nothing new starts until a detector is back
        if self.sink is not None:
            errors = self.sink.errors
            self.sink.write(record)
            if self.sink.errors != errors:
                self._counters.add("errors", output=1)
        if self.mqtt is not None:
            # the [mqtt] publish mode decides whether it is sent; a tracked detector's state and counts
            # are its objects in view, so the state, label and count topics never disagree
            self.mqtt.publish_result(record, in_view=in_view)
