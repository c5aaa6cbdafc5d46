"""What the daemon says about itself: ``/healthz``'s readiness and the ``/stats`` document.

:class:`DaemonStatus` is the half of :class:`~edgekit.serve.daemon.Daemon` that only reads: the
HTTP thread, MQTT stats and the journal line call it while the inference loop and the capture
threads write. Health with several cameras: ready while the model runs, the results can be
written and **at least one** camera delivers (one camera down is a degraded device, not a dead
one: the others still need their results); ``/healthz`` names each camera that is down, and
``edgekit_camera_up{camera=...}`` shows it to Prometheus.
"""

from __future__ import annotations

from typing import Any

from edgekit.serve.stats import health_stats, percentiles
from edgekit.serve.stats import stats_line as format_stats_line

LATENCY_STAGES = ("preprocess", "inference", "end_to_end")
DETECT_STAGES = ("decode", "nms")  # a detector's postprocess, split: in /stats, MQTT and Prometheus when recorded


class _Total:
    """Several rate meters read as one (every camera's frames)."""

    def __init__(self, meters: list[Any]):
        self._meters = meters

    def rate(self) -> float:
        """The sum of the meters' rates."""
        return sum(m.rate() for m in self._meters)


class DaemonStatus:
    """``health()``, ``stats()`` and the journal line of a :class:`~edgekit.serve.daemon.Daemon`
    (a mixin: it reads the daemon's parts, never changes them)."""

    def health(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, details)``: ready when the model is loaded and its latest inference (if any)
        succeeded, results can be written, and a camera delivered a frame within its
        ``stall_timeout_s`` (with several cameras: at least one of them)."""
        camera_ok, camera = self._cameras.health()
        model_ok, model_error = self._model.ok, self._model.error
        details: dict[str, Any] = {
            "status": "ok" if camera_ok and model_ok else "unavailable",
            "camera": camera.pop("camera"),
            "model": "ok" if model_ok else "down",
        }
        if "camera_error" in camera:
            details["camera_error"] = camera.pop("camera_error")
        if not model_ok:
            details["model_error"] = model_error or "model not loaded"
        details.update(camera)  # named cameras: each one's state
        output_ok = self.sink is None or self.sink.healthy  # a full disk: results are being lost
        if not output_ok:
            details.update(status="unavailable", output="down", output_error=self.sink.last_error)
        http_problem = self.http.problem() if self.http is not None else ""  # e.g. workers stuck: no scrape answered
        if http_problem:
            details.update(status="unavailable", http="down", http_error=http_problem)
        if self._stop.is_set():
            details["status"] = "stopping"
            return False, details
        return camera_ok and model_ok and output_ok and not http_problem, details

    def stats(self) -> dict[str, Any]:
        """Counters, recent FPS and latency percentiles, health, MQTT state: JSON-ready."""
        ready, health = self.health()
        counts = self._counters.snapshot()
        feeds = self._cameras.feeds
        rates = {"camera": _Total([f.capture.rates["camera"] for f in feeds]), "process": self._process_rate,
                 "skipped": _Total([f.capture.rates["skipped"] for f in feeds])}
        info = self._model.runtime_info
        model = self._model.identity
        stats: dict[str, Any] = {
            "device": self.config.device,
            "uptime_s": round((self._clock() - self._started_ns) / 1e9, 3) if self._started_ns else 0.0,
            "frames": counts["frames"],
            "fps": {k: round(m.rate(), 3) for k, m in rates.items()},
            "latency_ms": {k: percentiles(v) for k, v in self.latency_samples().items()},
            "health": health_stats(ready, health),
            "errors": counts["errors"],
            "reconnects": counts["reconnects"],
            "info": {"device": self.config.device,
                     "camera": ",".join(f.name for f in feeds) if self._cameras.named else feeds[0].capture.name,
                     "model": model.get("bundle", ""),
                     "backend": info.get("backend", ""), "delegate": info.get("delegate_requested", ""),
                     "variant": model.get("variant", ""), "bundle_sha256": model.get("sha256", "")},
            "runtime": info,
            "model": dict(model),
        }
        if self._swap is not None:
            stats["swaps"] = self._swap.stats()
        fleet = getattr(self, "_fleet", None)
        if fleet is not None:  # which channel of which store this device follows, and how that goes
            stats["fleet"] = fleet.stats()
            stats["info"]["channel"] = fleet.channel
        if self._last_result is not None:
            stats["last_result"] = self._last_result.last_result()  # a detector's boxes, a classifier's top-k
        self._camera_stats(stats)
        if self._controls is not None:
            stats["control"] = self._controls.stats()
        if self.mqtt is not None:
            stats["mqtt"] = self.mqtt.stats()
            stats["reconnects"]["mqtt"] = self.mqtt.reconnects
        if self.sink is not None:
            stats["output"] = {**self.sink.state(), "errors": self.sink.failed}
        if self.http is not None:  # over MQTT too: the one place to read that the endpoint died
            stats["http"] = self.http.stats()
        return stats

    def _camera_stats(self, stats: dict[str, Any]) -> None:
        """Named cameras: ``cameras`` (name -> that camera's stats); the one unnamed camera: its
        source's own stats in ``camera`` and its gate's counts in ``motion``, as before."""
        if self._cameras.named:
            stats["cameras"] = {feed.name: feed.stats() for feed in self._cameras.feeds}
            return
        feed = self._cameras.feeds[0]
        camera = feed.capture.source_stats()
        if camera is not None:
            stats["camera"] = camera
        motion = feed.motion()
        if motion is not None:
            stats["motion"] = motion

    def stats_line(self) -> str:
        """One line for the journal."""
        return format_stats_line(self.stats())

    def latency_samples(self) -> dict[str, list[int]]:
        """The newest latency samples (ns) per stage behind /stats, at most LATENCY_WINDOW each."""
        stages = self._frame_metrics.stages
        return {k: stages[k].recent() for k in LATENCY_STAGES + DETECT_STAGES if k in stages}

    @property
    def http_address(self) -> tuple[str, int] | None:
        """Where the HTTP endpoint listens (None when disabled)."""
        return self.http.address if self.http is not None else None
