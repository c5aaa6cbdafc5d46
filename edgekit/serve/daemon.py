"""``edgekit serve``: the on-device service, camera -> model -> JSON lines / MQTT / Prometheus.

Two threads do the work. A capture thread reads the camera as fast as it delivers and keeps
only the newest frame in a one-slot mailbox; the inference loop (the main thread) takes
whatever frame is newest when it is free. When the camera outruns the model, frames are
overwritten in the mailbox and counted as skipped, so latency stays bounded by about one
frame interval plus one inference, however long the daemon runs. Capture and inference
overlap, so throughput approaches the slowest stage instead of the sum of both.

Faults are survived, counted and visible: a camera that fails to open or stops is reopened
with exponential backoff (``/healthz`` is 503 meanwhile); a model that keeps failing is
reopened; unusable frames are counted and skipped; a broker that is down only drops the
MQTT copy of results (JSON lines keep them). SIGTERM/SIGINT finish the current frame, flush
the outputs, publish ``offline`` and return within a few seconds.

>>> from edgekit.serve.config import ServeConfig, override        # doctest: +SKIP
>>> config = override(ServeConfig(), "model", path="dist/demo-cpu")
>>> with Daemon(config) as daemon:
...     daemon.run(max_frames=100)
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekit.camera import redact_uri
from edgekit.camera.mailbox import FrameMailbox
from edgekit.errors import BackendUnavailable, CameraError, UsageError
from edgekit.metrics import PipelineMetrics, rate, summarize
from edgekit.pipeline import Pipeline, frame_problem  # noqa: F401 - frame_problem: re-exported, it lived here
from edgekit.serve.config import ServeConfig, parse_address
from edgekit.serve.publish import JsonLinesSink, MqttPublisher, to_json

log = logging.getLogger("edgekit.serve")

LATENCY_WINDOW = 1000  # recent frames behind the percentiles in /stats (bounded: the daemon runs for weeks)
RATE_WINDOW_S = 5.0  # FPS gauges average over this many seconds
STATS_LOG_INTERVAL_S = 60.0  # a stats line in the journal this often
POLL_S = 0.1  # how often an idle loop checks for stop: bounds the reaction to SIGTERM


class RateMeter:
    """Events per second over a sliding window, as ``(n - 1) / span`` of the events in it.

    Thread-safe. A meter whose last event is older than the window reads 0 (a stalled
    camera shows 0 fps, not its last rate).
    """

    def __init__(self, window_s: float = RATE_WINDOW_S, clock: Callable[[], int] = time.perf_counter_ns):
        self.window_ns = int(window_s * 1e9)
        self._clock = clock
        self._events: deque[int] = deque(maxlen=100_000)
        self._lock = threading.Lock()

    def add(self, count: int = 1, t_ns: int | None = None) -> None:
        """Record ``count`` events at ``t_ns`` (now by default)."""
        t = self._clock() if t_ns is None else t_ns
        with self._lock:
            self._events.extend([t] * count)

    def rate(self) -> float:
        """Events per second within the window ending now."""
        horizon = self._clock() - self.window_ns
        with self._lock:
            while self._events and self._events[0] < horizon:
                self._events.popleft()
            if not self._events:
                return 0.0
            return rate(len(self._events), self._events[-1] - self._events[0])


def sd_notify(message: str) -> bool:
    """Send a systemd notification (``READY=1``, ``WATCHDOG=1``...) when run by systemd.

    Speaks the documented datagram protocol on ``$NOTIFY_SOCKET`` directly, so the daemon
    needs no systemd Python binding. Returns False when not under systemd.
    """
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError as exc:
        log.debug("sd_notify(%s) failed: %s", message, exc)
        return False


def model_options(config: ServeConfig) -> dict[str, Any]:
    """Runtime options from ``[model]``; unset ones are left to the bundle/adapter."""
    m = config.model
    options = {"num_threads": m.threads or None, "delegate": m.delegate or None, "device": m.device or None,
               "providers": m.providers or None, "allow_fallback": m.allow_fallback or None,
               "backend": m.backend or None}
    return {k: v for k, v in options.items() if v is not None}


def open_source(uri: str, options: dict[str, Any]):
    """Open a camera with :func:`edgekit.camera.open_camera`."""
    try:
        from edgekit.camera import open_camera
    except ImportError as exc:  # camera sources not shipped in this build
        raise CameraError(f"cannot open camera {uri}: edgekit.camera has no open_camera", str(exc)) from exc
    return open_camera(uri, **options)


class Daemon:
    """The service, usable from Python (tests, robot glue) as well as from ``edgekit serve``.

    Args:
        config: a validated :class:`~edgekit.serve.config.ServeConfig`.
        runtime_factory: ``() -> Runtime``; opens the model (default: ``[model]`` through
            :func:`edgekit.model.open_model`). Called again to reopen a model that keeps failing.
        camera_factory: ``(uri, options) -> FrameSource``; opens the camera (default:
            :func:`edgekit.camera.open_camera`). Called again after every camera loss.
        labels: class names; default from the config (bundle or labels file).
        clock: nanosecond monotonic clock; must match the clock of ``Frame.t_capture_ns``.

    ``start()`` opens the model (errors raise: a model that cannot load is a configuration
    problem), the outputs, the HTTP endpoint and the capture thread. ``run()`` is the
    inference loop; it returns after ``stop()`` (thread- and signal-safe), ``max_frames`` or
    ``duration_s``, or when a source configured with ``on_end = "stop"`` ends, and closes
    everything. Use the daemon as a context manager to be sure it closes.
    """

    def __init__(
        self,
        config: ServeConfig,
        runtime_factory: Callable[[], Any] | None = None,
        camera_factory: Callable[[str, dict], Any] | None = None,
        labels: list[str] | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ):
        self.config = config
        self._camera_name = redact_uri(config.camera.uri)  # never publish camera credentials
        self._fatal: BaseException | None = None
        self._runtime_factory = runtime_factory or self._open_configured_model
        self._camera_factory = camera_factory or open_source
        self._labels = labels
        self._clock = clock
        self._stop = threading.Event()
        self._source_ended = threading.Event()
        self._slot = FrameMailbox()
        self._lock = threading.Lock()
        self._counts = {"captured": 0, "processed": 0, "skipped": 0, "bad": 0}
        self._errors = {"camera": 0, "inference": 0, "output": 0}
        self._reconnects = {"camera": 0, "model": 0}
        # One bounded sink for the life of the daemon, shared by every Pipeline a model
        # reopen creates: /stats percentiles cover the newest LATENCY_WINDOW frames.
        self._frame_metrics = PipelineMetrics(warmup=0, window=LATENCY_WINDOW)
        self._pipeline: Pipeline | None = None
        self._rates = {k: RateMeter(clock=clock) for k in ("camera", "process", "skipped")}
        self._camera_open = False
        self._camera_error = ""
        self._last_frame_ns: int | None = None
        self._source: Any = None
        self._runtime: Any = None
        self._model_error = ""
        self._consecutive_errors = 0
        self._model_retry_at = 0.0
        self._model_delay = 0.0
        self._started_ns: int | None = None
        self._capture_thread: threading.Thread | None = None
        self.sink: JsonLinesSink | None = None
        self.mqtt: MqttPublisher | None = None
        self.http: Any = None
        self.metrics: Any = None
        self._closed = False
        self._runtime_info: dict[str, Any] = {}

    # ------------------------------------------------------------------ life cycle
    def start(self) -> Daemon:
        """Open the model and outputs and start capturing. Raises EdgekitError on a bad model."""
        cfg = self.config
        self._open_runtime()
        self.sink = JsonLinesSink(cfg.output.jsonl, cfg.output.max_bytes, cfg.output.backups)
        if cfg.mqtt.host:
            password = None
            if cfg.mqtt.password_file:
                try:
                    password = Path(cfg.mqtt.password_file).read_text(encoding="utf-8").strip()
                except OSError as exc:
                    raise UsageError(f"cannot read [mqtt] password_file: {exc}", "fix the path or permissions") from exc
            self.mqtt = MqttPublisher(
                cfg.mqtt.host, cfg.mqtt.port, topic=cfg.topic, client_id=f"edgekit-{cfg.device}",
                qos=cfg.mqtt.qos, keepalive_s=cfg.mqtt.keepalive_s, reconnect_min_s=cfg.mqtt.reconnect_min_s,
                reconnect_max_s=cfg.mqtt.reconnect_max_s, username=cfg.mqtt.username, password=password,
            )
            self.mqtt.start()
        if cfg.http.listen:
            self._start_http(*parse_address(cfg.http.listen, 9100, "[http] listen"))
        self._started_ns = self._clock()
        self._capture_thread = threading.Thread(target=self._capture_loop, name="edgekit-capture", daemon=True)
        self._capture_thread.start()
        sd_notify("READY=1")
        return self

    def _start_http(self, host: str, port: int) -> None:
        from edgekit.serve.http import HttpEndpoint, ServeMetrics

        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("HTTP metrics listen on %s: reachable from the network", host)
        self.metrics = ServeMetrics(self.stats)
        try:
            self.http = HttpEndpoint(host, port, self.metrics, self.health, self.stats)
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc}", "choose another [http] listen port") from exc
        self.http.start()
        log.info("metrics on http://%s:%d/metrics", *self.http.address)

    def _open_configured_model(self) -> Any:
        """The default runtime factory: ``[model]`` through :func:`edgekit.model.open_model`."""
        from edgekit.model import open_model

        m = self.config.model
        if not m.path:
            raise UsageError("no model to serve", "give --bundle DIR (or --model FILE) or set [model] path")
        opened = open_model(m.path, variant=m.name or None, labels=m.labels or None, **model_options(self.config))
        if self._labels is None:
            self._labels = opened.labels
        return opened.runtime

    def _open_runtime(self) -> None:
        runtime = self._runtime_factory()
        self._runtime = runtime
        # Unusable frames are counted and skipped, never fatal (max_corrupt=None): a daemon
        # outlives a camera's bad moments. Inference errors come back here (_process).
        self._pipeline = Pipeline(runtime, self._labels or [], top_k=self.config.model.top_k, max_corrupt=None,
                                  clock=self._clock, metrics=self._frame_metrics)
        try:
            self._runtime_info = dict(runtime.describe())
        except Exception as exc:  # describe() is informative only
            self._runtime_info = {"describe_error": str(exc)}
        self._consecutive_errors = 0
        self._model_error = ""

    def stop(self) -> None:
        """Ask the daemon to stop after the current frame. Safe from signal handlers and threads."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, max_frames: int | None = None, duration_s: float | None = None) -> dict[str, Any]:
        """The inference loop; returns the final stats after closing everything."""
        if self._started_ns is None:
            self.start()
        try:
            self._loop(max_frames, duration_s)
        finally:
            self.close()
        if self._fatal is not None:
            raise self._fatal
        return self.stats()

    def close(self) -> None:
        """Stop capturing, flush outputs, publish ``offline`` and release everything (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        sd_notify("STOPPING=1")
        self._slot.wake()
        thread = self._capture_thread
        if thread is not None:
            thread.join(timeout=1.0)
            if thread.is_alive():
                # The source is blocked in a read: closing it from here is the only way to
                # unblock it; the thread is a daemon thread, so it cannot hold up the exit.
                self._close_source()
                thread.join(timeout=1.0)
        if self.sink is not None:
            self.sink.close()
        if self.mqtt is not None:
            self.mqtt.close()
        if self.http is not None:
            self.http.close()
        if self._runtime is not None:
            try:
                self._runtime.close()
            except Exception as exc:
                log.warning("closing the runtime failed: %s", exc)
        log.info("stopped after %d frames", self._counts["processed"])

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ capture thread
    def _close_source(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            try:
                source.close()
            except Exception as exc:
                log.debug("closing the camera failed: %s", exc)

    def _capture_loop(self) -> None:
        cfg = self.config.camera
        delay = cfg.reconnect_min_s
        opened = 0
        while not self._stop.is_set():
            try:
                source = self._camera_factory(cfg.uri, dict(cfg.options))
            except (UsageError, BackendUnavailable) as exc:
                # A wrong option or a missing library will not fix itself: retrying forever
                # would hide it (and keep systemd from ever seeing the failure).
                self._fatal = exc
                self._camera_down(f"cannot open camera {self._camera_name}: {exc}")
                self._stop.set()
                self._slot.wake()
                return
            except Exception as exc:  # CameraError, or anything a driver throws
                if getattr(exc, "retryable", True) is False:  # e.g. a Vector with no SDK configuration
                    self._fatal = exc
                    self._camera_down(f"cannot open camera {self._camera_name}: {exc}")
                    self._stop.set()
                    self._slot.wake()
                    return
                self._camera_down(f"cannot open camera {self._camera_name}: {exc}")
                self._stop.wait(delay)
                delay = min(delay * 2, cfg.reconnect_max_s)
                continue
            opened += 1
            if opened > 1:
                with self._lock:
                    self._reconnects["camera"] += 1
                log.info("camera %s reopened (reconnect %d)", self._camera_name, opened - 1)
            self._source = source
            self._camera_open = True
            ended = False
            try:
                ended = self._pump(source)
                if ended and not self._stop.is_set():
                    if cfg.on_end == "stop":
                        log.info("camera %s ended; stopping after the last frame", self._camera_name)
                        self._source_ended.set()
                        return
                    self._camera_down(f"camera {self._camera_name} stopped delivering frames")
            except Exception as exc:  # CameraError or a driver error: reconnect
                self._camera_down(f"camera {self._camera_name} lost: {exc}")
            finally:
                self._camera_open = False
                self._close_source()
            if self._last_frame_ns is not None and self._clock() - self._last_frame_ns < 1e9 * delay:
                delay = cfg.reconnect_min_s  # it delivered recently: start the backoff over
            self._stop.wait(delay)
            delay = min(delay * 2, cfg.reconnect_max_s)

    def _pump(self, source: Any) -> bool:
        """Move frames from the source into the mailbox; True when the source ended by itself."""
        previous: int | None = None
        for frame in source:
            if self._stop.is_set():
                return False
            now = self._clock()
            # Gaps in Frame.index are frames the source itself dropped (newest-frame sources).
            gap = frame.index - previous - 1 if previous is not None and frame.index > previous + 1 else 0
            previous = frame.index
            dropped = self._slot.put(frame)
            with self._lock:
                self._last_frame_ns = now
                self._counts["captured"] += 1 + gap
                self._counts["skipped"] += gap + int(dropped)
            self._rates["camera"].add(1 + gap, now)
            if gap or dropped:
                self._rates["skipped"].add(gap + int(dropped), now)
        return True

    def _camera_down(self, message: str) -> None:
        with self._lock:
            self._errors["camera"] += 1
            self._camera_error = message
        log.warning("%s; retrying", message)

    # ------------------------------------------------------------------ inference loop
    def _loop(self, max_frames: int | None, duration_s: float | None) -> None:
        deadline = None if duration_s is None else time.monotonic() + duration_s
        start = time.monotonic()
        self._next_stats = start + self.config.mqtt.stats_interval_s  # the broker is still connecting now
        self._next_log = start + STATS_LOG_INTERVAL_S
        self._watchdog_s = int(os.environ.get("WATCHDOG_USEC", "0")) / 2e6
        self._next_watchdog = 0.0
        done = 0
        while not self._stop.is_set():
            now = time.monotonic()
            self._housekeeping(now)
            if deadline is not None and now >= deadline:
                break
            if self._runtime is None:  # the model failed: reopen it without blocking housekeeping
                if now >= self._model_retry_at:
                    self._try_reopen_runtime(now)
                else:
                    self._stop.wait(POLL_S)
                continue
            frame = self._slot.take(POLL_S)
            if frame is None:
                if self._source_ended.is_set():
                    break
                continue
            if self._process(frame):
                done += 1
                if max_frames is not None and done >= max_frames:
                    break

    def _housekeeping(self, now: float) -> None:
        """Periodic work of the loop: systemd watchdog, MQTT stats, a journal line."""
        if self._watchdog_s and now >= self._next_watchdog:
            sd_notify("WATCHDOG=1")  # the loop is alive: a hung inference stops these and systemd restarts us
            self._next_watchdog = now + self._watchdog_s
        if now >= self._next_stats:
            self._next_stats = now + self.config.mqtt.stats_interval_s
            if self.mqtt is not None:
                self.mqtt.publish_stats(to_json(self.stats()))
        if now >= self._next_log:
            log.info("%s", self.stats_line())
            self._next_log = now + STATS_LOG_INTERVAL_S

    def _process(self, frame: Any) -> bool:
        """Run one frame through the pipeline and publish it; True when a result was produced."""
        try:
            result = self._pipeline.step(frame)
        except Exception as exc:  # any backend failure: count, keep serving, reopen if it persists
            self._inference_failed(exc)
            return False
        if result is None:  # unusable frame: the pipeline logged why
            with self._lock:
                self._counts["bad"] += 1
            return False
        ms = result.timings_ms
        with self._lock:
            self._counts["processed"] += 1
            self._consecutive_errors = 0
            self._model_error = ""
        self._rates["process"].add(1, self._clock())
        if self.metrics is not None:
            self.metrics.observe(ms["preprocess"] / 1e3, ms["inference"] / 1e3, ms["end_to_end"] / 1e3)
        record = {
            "device": self.config.device,
            "time": round(time.time(), 3),
            **result.to_dict(),
            "ms": {k: round(ms[k], 3) for k in ("preprocess", "inference", "end_to_end")},
        }
        self._publish(record)
        return True

    def _publish(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            errors = self.sink.errors
            self.sink.write(record)
            if self.sink.errors != errors:
                with self._lock:
                    self._errors["output"] += 1
        if self.mqtt is not None:
            self.mqtt.publish_result(to_json(record))

    def _inference_failed(self, exc: Exception) -> None:
        with self._lock:
            self._errors["inference"] += 1
            self._consecutive_errors += 1
            self._model_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            failing = self._consecutive_errors
        log.warning("inference failed (%d in a row): %s", failing, self._model_error)
        if failing >= self.config.model.reopen_after_errors:
            log.warning("reopening the model after %d failures", failing)
            try:
                self._runtime.close()
            except Exception as close_exc:
                log.debug("closing the failing runtime: %s", close_exc)
            self._runtime = None  # the loop reopens it, with backoff

    def _try_reopen_runtime(self, now: float) -> None:
        try:
            self._open_runtime()
        except Exception as exc:  # e.g. the Edge TPU is still unplugged
            # The camera's backoff settings serve the model too: both are local devices.
            delay = min(max(self._model_delay, self.config.camera.reconnect_min_s), self.config.camera.reconnect_max_s)
            self._model_delay = delay * 2
            self._model_retry_at = now + delay
            with self._lock:
                self._model_error = f"cannot reopen the model: {exc}"
            log.warning("%s; retrying in %.1f s", self._model_error, delay)
            return
        self._model_delay = 0.0
        with self._lock:
            self._reconnects["model"] += 1
        log.info("model reopened")

    # ------------------------------------------------------------------ health and stats
    def health(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, details)``: ready when a frame arrived within ``stall_timeout_s`` and the
        model is loaded and its latest inference (if any) succeeded."""
        now = self._clock()
        with self._lock:
            last = self._last_frame_ns
            camera_error, model_error = self._camera_error, self._model_error
            model_ok = self._runtime is not None and self._consecutive_errors == 0
        stall_ns = self.config.camera.stall_timeout_s * 1e9
        camera_ok = self._camera_open and last is not None and now - last < stall_ns
        details: dict[str, Any] = {
            "status": "ok" if camera_ok and model_ok else "unavailable",
            "camera": "ok" if camera_ok else "down",
            "model": "ok" if model_ok else "down",
        }
        if not camera_ok:
            if not self._camera_open and camera_error:
                details["camera_error"] = camera_error
            elif last is None:
                details["camera_error"] = "no frame yet"
            else:
                details["camera_error"] = f"no frame for {(now - last) / 1e9:.1f} s"
        if not model_ok:
            details["model_error"] = model_error or "model not loaded"
        if self._stop.is_set():
            details["status"] = "stopping"
            return False, details
        return camera_ok and model_ok, details

    def stats(self) -> dict[str, Any]:
        """Counters, recent FPS and latency percentiles, health, MQTT state: JSON-ready."""
        ready, health = self.health()
        with self._lock:
            counts, errors = dict(self._counts), dict(self._errors)
            reconnects = dict(self._reconnects)
        latency = self.latency_samples()
        stats: dict[str, Any] = {
            "device": self.config.device,
            "uptime_s": round((self._clock() - self._started_ns) / 1e9, 3) if self._started_ns else 0.0,
            "frames": counts,
            "fps": {k: round(m.rate(), 3) for k, m in self._rates.items()},
            "latency_ms": {k: _percentiles(v) for k, v in latency.items()},
            "health": {"ready": int(ready), "camera": int(health["camera"] == "ok"),
                       "model": int(health["model"] == "ok"), **{k: v for k, v in health.items() if "error" in k}},
            "errors": errors,
            "reconnects": reconnects,
            "info": {"device": self.config.device, "camera": self._camera_name,
                     "model": Path(self.config.model.path).name if self.config.model.path else "",
                     "backend": self._runtime_info.get("backend", ""),
                     "delegate": self._runtime_info.get("delegate_requested", "")},
            "runtime": self._runtime_info,
        }
        source_stats = getattr(self._source, "stats", None)
        if callable(source_stats):
            try:
                stats["camera"] = source_stats()
            except Exception as exc:
                stats["camera"] = {"error": str(exc)}
        if self.mqtt is not None:
            m = self.mqtt
            stats["mqtt"] = {"connected": int(m.connected.is_set()), "published": m.published,
                             "dropped": m.dropped, "last_error": m.last_error}
            stats["reconnects"]["mqtt"] = m.reconnects
        if self.sink is not None:
            stats["output"] = {"lines": self.sink.lines, "errors": self.sink.errors}
        return stats

    def stats_line(self) -> str:
        """One line for the journal."""
        s = self.stats()
        f, r, lat = s["frames"], s["fps"], s["latency_ms"]
        return (
            f"frames {f['processed']} processed, {f['skipped']} skipped, {f['bad']} bad; "
            f"fps camera {r['camera']:.1f} process {r['process']:.1f}; "
            f"inference p50 {lat['inference'].get('p50', 0):.2f} ms; end-to-end p99 "
            f"{lat['end_to_end'].get('p99', 0):.2f} ms; ready {bool(s['health']['ready'])}"
        )

    def latency_samples(self) -> dict[str, list[int]]:
        """The newest latency samples (ns) per stage behind /stats, at most LATENCY_WINDOW each."""
        stages = self._frame_metrics.stages
        return {k: stages[k].recent() for k in ("preprocess", "inference", "end_to_end")}

    @property
    def http_address(self) -> tuple[str, int] | None:
        """Where the HTTP endpoint listens (None when disabled)."""
        return self.http.address if self.http is not None else None


def _percentiles(samples_ns: list[int]) -> dict[str, float]:
    if not samples_ns:
        return {"count": 0}
    s = summarize(samples_ns)
    return {"count": s.count, "p50": round(s.p50_ms, 3), "p90": round(s.p90_ms, 3),
            "p99": round(s.p99_ms, 3), "max": round(s.max_ms, 3)}


# ---------------------------------------------------------------------- command line


