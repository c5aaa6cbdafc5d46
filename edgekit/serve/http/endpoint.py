"""The daemon's HTTP endpoint: Prometheus ``/metrics``, ``/healthz`` and ``/stats``.

- ``/metrics``: Prometheus text format from the daemon's own ``CollectorRegistry`` (never the
  global one, so two daemons in one process, e.g. in tests, do not collide): latency
  histograms observed per frame, plus counters and gauges read from the daemon's stats at
  scrape time (one source of truth for ``/stats``, MQTT stats and Prometheus).
- ``/healthz``: ``200`` when the camera delivers frames and the model runs, else ``503``;
  the JSON body says which part is down. With several cameras: while at least one delivers
  (the body names each camera that is down). Use it for systemd/k8s-style probes and alerting.
  The endpoint's own health is part of it (:mod:`edgekit.serve.http.health`): workers stuck on a
  request make it 503; an I/O thread that stopped cannot answer at all, so it stops the watchdog.
- ``/stats``: the daemon's stats as JSON.
- ``POST /reload`` (off unless ``[http] reload = true``, and only from a loopback address):
  look at the bundle again and hot-swap it (:mod:`edgekit.serve.swap`), as SIGHUP does.

The server binds 127.0.0.1 unless the configuration says otherwise: metrics are not meant
to be exposed to a network by accident. It is :class:`~edgekit.serve.http.server.BoundedHTTPServer`:
a fixed number of threads that only ever see whole requests, deadlines for a whole request and
a whole answer, a cap per client address, and ``/healthz`` answered ahead of other paths,
whatever the clients do.

Rates are not exported as gauges: ``rate(edgekit_frames_processed_total[1m])`` gives the
processing rate (and the camera's, the skipped one) without a second source of truth.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from edgekit.errors import BackendUnavailable
from edgekit.serve.http.health import ERROR_KINDS
from edgekit.serve.http.server import BoundedHTTPServer
from edgekit.util.finite_json import strict_dumps

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, ProcessCollector, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError as exc:  # the daemon imports this module only when the HTTP endpoint is on
    raise BackendUnavailable("the metrics endpoint needs prometheus_client",
                             "pip install 'edgekit-vision[serve]' (or --http off)") from exc

log = logging.getLogger("edgekit.serve")

# A Coral or XNNPACK int8 model takes 0.2-1 ms, a Pi CPU 10-200 ms: buckets from 100 us to 5 s,
# 1-2-5 per decade, so a sub-millisecond model spreads over several buckets, not the first one.
LATENCY_MIN_S = 0.0001
LATENCY_MAX_S = 5.0


def latency_buckets(smallest_s: float = LATENCY_MIN_S, largest_s: float = LATENCY_MAX_S) -> tuple[float, ...]:
    """Histogram bounds (s) in a 1-2-5 series from ``smallest_s`` up to at least ``largest_s``."""
    bounds, value = [], smallest_s
    while not bounds or bounds[-1] < largest_s * (1 - 1e-9):
        bounds.append(float(f"{value * (1, 2, 5)[len(bounds) % 3]:.3g}"))
        if len(bounds) % 3 == 0:
            value *= 10
    return tuple(bounds)


LATENCY_BUCKETS = latency_buckets()
STAGES = ("preprocess", "inference", "postprocess", "decode", "nms", "end_to_end")
_STAGE_HELP = {
    "preprocess": "Frame to input tensor.",
    "inference": "Model inference (runtime.infer).",
    "postprocess": "Decoding the outputs (top-k; box decoding and NMS for detection).",
    "decode": "Detectors: candidate boxes from the outputs (part of postprocess).",
    "nms": "Detectors: non-maximum suppression and the map to frame pixels (part of postprocess).",
    "end_to_end": "Frame capture to decoded result (includes waiting for the model).",
}

# (metric name, stats path, help) for counters and gauges exported from a stats snapshot.
_COUNTERS = (
    ("edgekit_frames_captured_total", ("frames", "captured"), "Frames the camera delivered (incl. its own drops)."),
    ("edgekit_frames_processed_total", ("frames", "processed"), "Frames run through the model."),
    ("edgekit_frames_skipped_total", ("frames", "skipped"), "Frames dropped because the model was busy."),
    ("edgekit_frames_bad_total", ("frames", "bad"), "Frames that were unusable (wrong type/shape, corrupt)."),
    ("edgekit_frames_gated_total", ("frames", "gated"), "Frames the motion gate kept from the model (a still scene)."),
    ("edgekit_results_written_total", ("output", "lines"), "Results written to the JSON-lines output."),
    ("edgekit_results_failed_total", ("output", "failed"), "Results that could not be written (disk full)."),
    ("edgekit_mqtt_published_total", ("mqtt", "published"), "Results sent to the MQTT broker (incl. replayed)."),
    ("edgekit_mqtt_dropped_total", ("mqtt", "dropped"), "Results lost for MQTT (disconnected at QoS 0, queue full)."),
    ("edgekit_mqtt_replayed_total", ("mqtt", "replayed"), "Results queued while disconnected, sent on reconnect."),
    ("edgekit_mqtt_suppressed_total", ("mqtt", "suppressed"), "Results not published by the publish mode."),
    ("edgekit_mqtt_connect_failures_total", ("mqtt", "connect_failures"), "Failed attempts to reach the broker."),
    ("edgekit_fleet_fetch_errors_total", ("fleet", "fetch_errors"),
     "Fleet: failed looks at the channel or downloads (store down or slow, disk full)."),
    ("edgekit_fleet_downloaded_bytes_total", ("fleet", "downloaded_bytes"), "Fleet: bytes of versions downloaded."),
)
_GAUGES = (
    ("edgekit_camera_up", ("health", "camera"), "1 when the camera delivers frames."),
    ("edgekit_model_up", ("health", "model"), "1 when the model runs."),
    ("edgekit_ready", ("health", "ready"), "1 when camera and model are both good (as /healthz)."),
    ("edgekit_mqtt_connected", ("mqtt", "connected"), "1 when connected to the MQTT broker."),
    ("edgekit_mqtt_queued", ("mqtt", "queued"), "Results waiting for the broker to come back."),
    ("edgekit_output_up", ("output", "healthy"), "1 when results can be written (0: disk full, folder gone)."),
    ("edgekit_uptime_seconds", ("uptime_s",), "Seconds since the daemon started."),
    ("edgekit_fleet_store_up", ("fleet", "store_up"), "Fleet: 1 when the latest look at the channel worked."),
)


def _get(stats: dict, path: tuple[str, ...]) -> Any:
    value: Any = stats
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


# named cameras: these are per camera, with a camera label (the path into each camera's /stats entry)
_PER_CAMERA = {"edgekit_frames_captured_total": ("frames", "captured"),
               "edgekit_frames_processed_total": ("frames", "processed"),
               "edgekit_frames_skipped_total": ("frames", "skipped"), "edgekit_frames_bad_total": ("frames", "bad"),
               "edgekit_frames_gated_total": ("frames", "gated"), "edgekit_camera_up": ("up",)}


def _per_camera(family: type, name: str, help_text: str, cameras: dict[str, dict]) -> Any:
    """``name`` with one sample per camera that has it, labelled ``camera``; None when none has it."""
    values = [(camera, _get(stats, _PER_CAMERA[name])) for camera, stats in cameras.items()]
    if all(value is None for _, value in values):
        return None
    metric = family(name.removesuffix("_total") if family is CounterMetricFamily else name, help_text,
                    labels=["camera"])
    for camera, value in values:
        if value is not None:
            metric.add_metric([camera], float(value))
    return metric


class _StatsCollector:
    """Turns a stats snapshot into Prometheus families at scrape time. With named cameras the
    frame counters and ``edgekit_camera_up`` carry a ``camera`` label (one sample per camera, no
    unlabelled total: ``sum without (camera)`` adds them up)."""

    def __init__(self, snapshot: Callable[[], dict]):
        self._snapshot = snapshot

    def collect(self):
        stats = self._snapshot()
        cameras = stats.get("cameras") or {}
        for family, table in ((CounterMetricFamily, _COUNTERS), (GaugeMetricFamily, _GAUGES)):
            for name, path, help_text in table:
                if cameras and name in _PER_CAMERA:
                    metric = _per_camera(family, name, help_text, cameras)
                else:
                    value = _get(stats, path)
                    metric = None if value is None else family(
                        name.removesuffix("_total") if family is CounterMetricFamily else name, help_text,
                        value=float(value))
                if metric is not None:
                    yield metric
        errors = CounterMetricFamily("edgekit_errors", "Errors by kind.", labels=["kind"])
        for kind, value in sorted((stats.get("errors") or {}).items()):
            errors.add_metric([kind], float(value))
        yield errors
        http_errors = CounterMetricFamily("edgekit_http_errors", "HTTP requests refused or failed, by kind "
                                          "(malformed, too_large, timed_out, refused, evicted, internal, handler).",
                                          labels=["kind"])
        for kind, value in sorted(((stats.get("http") or {}).get("errors") or {}).items()):
            http_errors.add_metric([kind], float(value))
        yield http_errors
        reconnects = CounterMetricFamily(
            "edgekit_reconnects", "Successful reconnections after a loss, by component.", labels=["component"]
        )
        for component, value in sorted((stats.get("reconnects") or {}).items()):
            reconnects.add_metric([component], float(value))
        yield reconnects
        swaps = CounterMetricFamily("edgekit_model_swaps", "Bundle hot-swaps by result.", labels=["result"])
        for result, value in sorted((stats.get("swaps") or {}).items()):
            if result in ("ok", "rolled_back", "refused"):
                swaps.add_metric([result], float(value))
        yield swaps
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

    def __init__(self, snapshot: Callable[[], dict], buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.registry = CollectorRegistry()
        self.histograms = {
            stage: Histogram(f"edgekit_{stage}_seconds", _STAGE_HELP[stage], buckets=buckets, registry=self.registry)
            for stage in STAGES
        }
        self.registry.register(_StatsCollector(snapshot))
        ProcessCollector(registry=self.registry)  # RSS, CPU seconds, open fds: what a soak watches

    def observe(self, preprocess_s: float, inference_s: float, end_to_end_s: float,
                postprocess_s: float | None = None, **stages_s: float) -> None:
        """Record one processed frame's latencies, in seconds (``stages_s``: a detector's decode, nms)."""
        h = self.histograms
        h["preprocess"].observe(preprocess_s)
        h["inference"].observe(inference_s)
        if postprocess_s is not None:
            h["postprocess"].observe(postprocess_s)
        for stage, seconds in stages_s.items():
            if stage in h:
                h[stage].observe(seconds)
        h["end_to_end"].observe(end_to_end_s)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


class HttpEndpoint:
    """A small HTTP server for ``/metrics``, ``/healthz``, ``/stats`` (and ``POST /reload``).

    Args:
        host, port: where to listen; port 0 picks a free port (see :attr:`address`).
        metrics: the registry to expose.
        health: returns ``(ready, details)``; ``/healthz`` answers 200 when ready, else 503.
            It runs on the server's I/O thread (so a probe never waits behind scrapes): it must
            return at once, never wait for a lock or the network.
        stats: returns the stats dict for ``/stats``.
        reload: called by ``POST /reload`` from a loopback address; None turns the route off.
        server_options: keyword arguments of :class:`BoundedHTTPServer` (workers, deadlines, caps).
    """

    def __init__(
        self,
        host: str,
        port: int,
        metrics: ServeMetrics,
        health: Callable[[], tuple[bool, dict]],
        stats: Callable[[], dict],
        reload: Callable[[str], Any] | None = None,
        **server_options: Any,
    ):
        self.metrics = metrics
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "edgekit"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                endpoint._handle(self)

            def do_HEAD(self) -> None:  # noqa: N802
                endpoint._handle(self, body=False)

            def do_POST(self) -> None:  # noqa: N802
                endpoint._post(self)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http %s " + fmt, self.client_address[0], *args)

        self._health, self._stats, self._reload = health, stats, reload
        self._exposition_lock = threading.Lock()
        self._exposition: tuple[float, bytes] = (float("-inf"), b"")  # (generation started, text)
        server_options.setdefault("quick_answers", {"/healthz": self._healthz})
        self._server = BoundedHTTPServer((host, port), Handler, **server_options)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server really listens on."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def connection_counts(self) -> dict[str, int]:
        """Connections accepted, answered, refused, evicted, timed out (see BoundedHTTPServer)."""
        return dict(self._server.counts)

    def problem(self) -> str:
        """Why the endpoint does not serve, in one line (``""`` when it does): its I/O thread
        stopped or stalled, or its workers stuck (see :mod:`edgekit.serve.http.health`)."""
        return self._server.health.problem(time.monotonic())

    def io_problem(self) -> str:
        """Why not even ``/healthz`` can be answered (``""`` when it can): what stops the watchdog."""
        return self._server.health.io_problem(time.monotonic())

    def stats(self) -> dict[str, Any]:
        """The /stats ``http`` entry: requests answered, errors by kind, and whether it serves."""
        counts = self._server.counts.copy()
        problem = self.problem()
        return {"up": int(not problem), "accepted": counts["accepted"], "answered": counts["answered"],
                "errors": {kind: counts[kind] for kind in ERROR_KINDS}, **({"problem": problem} if problem else {})}

    def _handle(self, req: BaseHTTPRequestHandler, body: bool = True) -> None:
        path = req.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                status, ctype = 200, CONTENT_TYPE_LATEST
                payload = self._fresh_exposition(getattr(req, "received_at", time.monotonic()))
            elif path == "/healthz":
                status, ctype, payload = self._healthz()
            elif path == "/stats":
                status, ctype, payload = 200, "application/json", strict_dumps(self._stats(), default=str).encode()
            elif path == "/":
                status, ctype, payload = 200, "text/plain; charset=utf-8", b"edgekit serve: /metrics /healthz /stats\n"
            else:
                status, ctype, payload = 404, "text/plain; charset=utf-8", b"not found\n"
        except Exception as exc:  # a bug in a stats callback must not kill the endpoint: one line, counted
            self._server.counts["handler"] += 1
            log.warning("http %s failed: %s: %s", path, type(exc).__name__, exc)
            log.debug("http %s failed", path, exc_info=True)
            status, ctype, payload = 500, "text/plain; charset=utf-8", f"error: {exc}\n".encode()
        _answer(req, status, ctype, payload, body)

    def _healthz(self) -> tuple[int, str, bytes]:
        """``/healthz``: 200 when ready, else 503, with the details as JSON."""
        ready, details = self._health()
        return (200 if ready else 503), "application/json", strict_dumps(details).encode()

    def _fresh_exposition(self, received_at: float) -> bytes:
        """The metrics text generated after ``received_at`` (a request's arrival): scrapes that
        queued while one generation ran share the next (200 at once cost a few generations, not
        200 of about 4 ms each), and none gets numbers older than its request."""
        with self._exposition_lock:
            started, text = self._exposition
            if started < received_at:
                started = time.monotonic()
                text = self.metrics.exposition()
                self._exposition = (started, text)
            return text

    def _post(self, req: BaseHTTPRequestHandler) -> None:
        """``POST /reload``: only when enabled, only from this machine (a reload costs a model load)."""
        path = req.path.split("?", 1)[0]
        if path != "/reload" or self._reload is None:
            _answer(req, 404, "text/plain; charset=utf-8", b"not found\n")
            return
        if not ipaddress.ip_address(req.client_address[0].removeprefix("::ffff:")).is_loopback:
            _answer(req, 403, "text/plain; charset=utf-8", b"reload is allowed from this machine only\n")
            return
        answer = self._reload("POST /reload")
        _answer(req, 202, "application/json", strict_dumps(answer, default=str).encode())

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


def _answer(req: BaseHTTPRequestHandler, status: int, ctype: str, payload: bytes, body: bool = True) -> None:
    req.send_response(status)
    req.send_header("Content-Type", ctype)
    req.send_header("Content-Length", str(len(payload)))
    req.send_header("Cache-Control", "no-store")
    req.end_headers()
    if body:
        req.wfile.write(payload)
