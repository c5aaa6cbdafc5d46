"""The daemon's HTTP endpoint: Prometheus ``/metrics``, ``/healthz`` and ``/stats``.

- ``/metrics``: Prometheus text format from the daemon's own ``CollectorRegistry`` (never the
  global one, so two daemons in one process, e.g. in tests, do not collide): latency
  histograms observed per frame, plus counters and gauges read from the daemon's stats at
  scrape time (one source of truth for ``/stats``, MQTT stats and Prometheus).
- ``/healthz``: ``200`` when the camera delivers frames and the model runs, else ``503``;
  the JSON body says which part is down. Use it for systemd/k8s-style probes and alerting.
- ``/stats``: the daemon's stats as JSON.

The server binds 127.0.0.1 unless the configuration says otherwise: metrics are not meant
to be exposed to a network by accident.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from edgekit.errors import BackendUnavailable

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, ProcessCollector, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError as exc:  # the daemon imports this module only when the HTTP endpoint is on
    raise BackendUnavailable("the metrics endpoint needs prometheus_client",
                             "pip install 'edgekit[serve]' (or --http off)") from exc

log = logging.getLogger("edgekit.serve")

# Inference on an Edge TPU takes ~1-10 ms, on a Pi CPU 10-200 ms: buckets span both.
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)

# (metric name, stats path, help) for counters and gauges exported from a stats snapshot.
_COUNTERS = (
    ("edgekit_frames_captured_total", ("frames", "captured"), "Frames the camera delivered (incl. its own drops)."),
    ("edgekit_frames_processed_total", ("frames", "processed"), "Frames run through the model."),
    ("edgekit_frames_skipped_total", ("frames", "skipped"), "Frames dropped because the model was busy."),
    ("edgekit_frames_bad_total", ("frames", "bad"), "Frames that were unusable (wrong type/shape, corrupt)."),
)
_GAUGES = (
    ("edgekit_camera_fps", ("fps", "camera"), "Frames per second delivered by the camera (recent window)."),
    ("edgekit_process_fps", ("fps", "process"), "Frames per second processed by the model (recent window)."),
    ("edgekit_skipped_fps", ("fps", "skipped"), "Frames per second skipped (recent window)."),
    ("edgekit_camera_up", ("health", "camera"), "1 when the camera delivers frames."),
    ("edgekit_model_up", ("health", "model"), "1 when the model runs."),
    ("edgekit_ready", ("health", "ready"), "1 when camera and model are both good (as /healthz)."),
    ("edgekit_mqtt_connected", ("mqtt", "connected"), "1 when connected to the MQTT broker."),
    ("edgekit_uptime_seconds", ("uptime_s",), "Seconds since the daemon started."),
)


def _get(stats: dict, path: tuple[str, ...]) -> Any:
    value: Any = stats
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


class _StatsCollector:
    """Turns a stats snapshot into Prometheus families at scrape time."""

    def __init__(self, snapshot: Callable[[], dict]):
        self._snapshot = snapshot

    def collect(self):
        stats = self._snapshot()
        for name, path, help_text in _COUNTERS:
            value = _get(stats, path)
            if value is not None:
                yield CounterMetricFamily(name.removesuffix("_total"), help_text, value=float(value))
        for name, path, help_text in _GAUGES:
            value = _get(stats, path)
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=float(value))
        errors = CounterMetricFamily("edgekit_errors", "Errors by kind.", labels=["kind"])
        for kind, value in sorted((stats.get("errors") or {}).items()):
            errors.add_metric([kind], float(value))
        yield errors
        reconnects = CounterMetricFamily(
            "edgekit_reconnects", "Successful reconnections after a loss, by component.", labels=["component"]
        )
        for component, value in sorted((stats.get("reconnects") or {}).items()):
            reconnects.add_metric([component], float(value))
        yield reconnects
        info = stats.get("info") or {}
        if info:
            keys = sorted(info)
            family = GaugeMetricFamily("edgekit_info", "What this daemon runs (value is always 1).", labels=keys)
            family.add_metric([str(info[k]) for k in keys], 1.0)
            yield family


class ServeMetrics:
    """The daemon's Prometheus registry.

    Call :meth:`observe` once per processed frame (thread-safe, a few microseconds);
    everything else is read from ``snapshot()`` (the daemon's stats dict) when scraped.
    """

    def __init__(self, snapshot: Callable[[], dict]):
        self.registry = CollectorRegistry()
        self.preprocess = Histogram(
            "edgekit_preprocess_seconds", "Frame to input tensor.", buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.inference = Histogram(
            "edgekit_inference_seconds", "Model inference (runtime.infer).", buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.end_to_end = Histogram(
            "edgekit_end_to_end_seconds", "Frame capture to decoded result (includes waiting for the model).",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.registry.register(_StatsCollector(snapshot))
        ProcessCollector(registry=self.registry)  # RSS, CPU seconds, open fds: what a soak watches

    def observe(self, preprocess_s: float, inference_s: float, end_to_end_s: float) -> None:
        """Record one processed frame's latencies, in seconds."""
        self.preprocess.observe(preprocess_s)
        self.inference.observe(inference_s)
        self.end_to_end.observe(end_to_end_s)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class HttpEndpoint:
    """A small threaded HTTP server for ``/metrics``, ``/healthz`` and ``/stats``.

    Args:
        host, port: where to listen; port 0 picks a free port (see :attr:`address`).
        metrics: the registry to expose.
        health: returns ``(ready, details)``; ``/healthz`` answers 200 when ready, else 503.
        stats: returns the stats dict for ``/stats``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: ServeMetrics,
        health: Callable[[], tuple[bool, dict]],
        stats: Callable[[], dict],
    ):
        self.metrics = metrics
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "edgekit"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                endpoint._handle(self)

            def do_HEAD(self) -> None:  # noqa: N802
                endpoint._handle(self, body=False)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http %s " + fmt, self.client_address[0], *args)

        self._health, self._stats = health, stats
        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        self._server = server_class((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server really listens on."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def _handle(self, req: BaseHTTPRequestHandler, body: bool = True) -> None:
        path = req.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                status, ctype, payload = 200, CONTENT_TYPE_LATEST, self.metrics.exposition()
            elif path == "/healthz":
                ready, details = self._health()
                status, ctype = (200 if ready else 503), "application/json"
                payload = json.dumps(details).encode()
            elif path == "/stats":
                status, ctype, payload = 200, "application/json", json.dumps(self._stats(), default=str).encode()
            elif path == "/":
                status, ctype, payload = 200, "text/plain; charset=utf-8", b"edgekit serve: /metrics /healthz /stats\n"
            else:
                status, ctype, payload = 404, "text/plain; charset=utf-8", b"not found\n"
        except Exception as exc:  # a bug in a stats callback must not kill the endpoint
            log.exception("http %s failed", path)
            status, ctype, payload = 500, "text/plain; charset=utf-8", f"error: {exc}\n".encode()
        req.send_response(status)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(payload)))
        req.send_header("Cache-Control", "no-store")
        req.end_headers()
        if body:
            req.wfile.write(payload)

    def start(self) -> None:
        """Serve in a background (daemon) thread."""
        # A short poll interval keeps shutdown() (which waits for one poll) fast on SIGTERM.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="edgekit-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=2)
        self._server.server_close()
