"""Model supervision for the daemon: open the model, count inference failures, reopen it.

An Edge TPU pulled out, a GPU reset, a driver that wedged: a runtime that fails
``reopen_after_errors`` inferences in a row is closed and reopened, with the camera's
exponential backoff between attempts, while the daemon keeps serving health and stats.
Every reopened runtime gets a new :class:`~edgekit.pipeline.Pipeline` recording into the
same bounded metrics sink, so /stats percentiles span the reopen.

A runtime may own the camera (the imx500 backend opens the AI Camera's one ``Picamera2``): its
camera's loss closes it (:meth:`ModelSupervisor.camera_lost`) and the usual reopen opens it again.
Opening and closing are serialised, so a new runtime is created only after the old one is closed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from edgekit.errors import UsageError, first_line
from edgekit.metrics import PipelineMetrics
from edgekit.pipeline import Pipeline
from edgekit.serve.config.load import ServeConfig
from edgekit.serve.stats import Counters
from edgekit.serve.swap import Loaded, identity

log = logging.getLogger("edgekit.serve")


def model_identity(path: str, variant: str | None, target: str | None) -> dict[str, Any]:
    """:func:`~edgekit.serve.swap.identity` named by the bundle's manifest: with the documented
    layout ``[model] path`` is a symlink called ``bundle``, which named every result "bundle"."""
    ident = identity(path, variant, target)
    ident["bundle"] = manifest_name(ident["path"]) or ident["bundle"]
    return ident


def manifest_name(directory: str) -> str:
    """The ``name`` in a bundle's ``edgekit.json`` ('' for a bare model or a name that is not a short
    printable string: the manifest is untrusted and the name goes into topics' payloads and metrics)."""
    from edgekit.bundle import MANIFEST

    try:
        with open(os.path.join(directory, MANIFEST), "rb") as f:
            name = json.loads(f.read(1 << 20)).get("name")
    except (OSError, ValueError, AttributeError):
        return ""
    return name if isinstance(name, str) and 0 < len(name) <= 100 and name.isprintable() else ""


def model_options(config: ServeConfig) -> dict[str, Any]:
    """Runtime options from ``[model]``; unset ones are left to the bundle/adapter."""
    m = config.model
    options = {"num_threads": m.threads or None, "delegate": m.delegate or None, "device": m.device or None,
               "providers": m.providers or None, "allow_fallback": m.allow_fallback or None,
               "backend": m.backend or None}
    return {k: v for k, v in options.items() if v is not None}


class ModelSupervisor:
    """Owns the daemon's runtime and the Pipeline around it.

    Args:
        config: the service configuration (``[model]`` and the backoff of ``[camera]``).
        factory: ``() -> Runtime``, or None to open ``[model]`` with :func:`edgekit.model.open_model`.
        labels: class names (None: the bundle's, once the default factory opened it).
        metrics: the bounded sink every Pipeline records into.
        counters: ``errors.inference`` and ``reconnects.model`` are counted here.
        clock: nanosecond monotonic clock of the frames.

    ``pipeline`` is None while the model is closed after failures; :meth:`retry` reopens it.
    Health (``ok``, ``error``) may be read from any thread.
    """

    def __init__(self, config: ServeConfig, factory: Callable[[], Any] | None, labels: list[str] | None,
                 metrics: PipelineMetrics, counters: Counters, clock: Callable[[], int]):
        self.config = config
        self._factory = factory or self._open_configured
        self.labels = labels
        self._metrics = metrics
        self._counters = counters
        self._clock = clock
        self._lock = threading.Lock()
        # open and close one at a time: the imx500 backend's Picamera2 is closed before the next opens
        self._opening = threading.Lock()
        self.pipeline: Pipeline | None = None
        self.runtime_info: dict[str, Any] = {}
        self.identity: dict[str, Any] = {}  # bundle, path, variant, sha256, target of what runs
        self.active_path = config.model.path  # what a reopen opens: the swapped-in bundle after a swap
        self.error = ""
        self._failing = 0
        self._retry_at = 0.0
        self._stage: Any = None  # [[stage]]: (its open model, its SecondStage), opened once, kept across reopens
        self._delay = 0.0

    @property
    def ok(self) -> bool:
        """The model is loaded and its latest inference (if any) succeeded."""
        with self._lock:
            return self.pipeline is not None and self._failing == 0

    def open(self) -> None:
        """Open the runtime and build its Pipeline; raises what the factory raises."""
        with self._opening:
            runtime = self._factory()
            try:
                loaded = self._loaded(runtime, self.labels or [], self.identity, getattr(self, "_task", None))
            except BaseException:
                _close_runtime(runtime)  # the camera the imx500 backend opened is free for the next try
                raise
            with self._lock:
                self.pipeline, self.runtime_info = loaded.pipeline, loaded.info
                self._failing, self.error = 0, ""

    @property
    def runtime(self) -> Any:
        """The open runtime (None while the model is closed)."""
        with self._lock:
            return None if self.pipeline is None else self.pipeline.runtime

    def camera_lost(self, runtime: Any, why: str) -> None:
        """The camera ``runtime`` owns stopped delivering (the imx500 backend's ``Picamera2``): close the
        runtime, camera and all, so :meth:`retry` opens both afresh; nothing when it is no longer the
        running one (a reopen came first)."""
        with self._opening:
            with self._lock:
                if self.pipeline is None or self.pipeline.runtime is not runtime:
                    return
                pipeline, self.pipeline = self.pipeline, None
                self.error = f"{why}: reopening the model, which opens the camera"
            log.warning("%s; reopening the model (its backend opens the camera)", why)
            _close_runtime(pipeline.runtime)

    def _loaded(self, runtime: Any, labels: list[str], identity: dict[str, Any],
                task: tuple[str, dict] | None = None) -> Loaded:
        # Unusable frames are counted and skipped, never fatal (max_corrupt=None): a daemon
        # outlives a camera's bad moments. Inference errors come back to the daemon.
        # task: the bundle's task head and its options (open_model); a bare factory's runtime: classify
        name, options = task or ("classify", {})
        pipeline = Pipeline(runtime, labels, top_k=self.config.model.top_k, max_corrupt=None,
                            clock=self._clock, metrics=self._metrics, task=name, task_options=options,
                            then=self._second_stage(name))
        try:
            info = dict(runtime.describe())
        except Exception as exc:  # describe() is informative only
            info = {"describe_error": str(exc)}
        return Loaded(pipeline, info, identity, labels)

    def open_candidate(self, path: str) -> Loaded:
        """Open a new bundle at ``path`` with the configured options, beside the running model."""
        from edgekit.model import open_model
        from edgekit.serve.config.sensor import is_sensor_camera

        if any(is_sensor_camera(c.uri) for c in self.config.camera_list):  # before anything opens
            raise UsageError("an imx500 network cannot be opened beside the running one (one sensor, one Picamera2)",
                             "replace the bundle and restart the service (systemctl restart edgekit)")
        m = self.config.model
        opened = open_model(path, variant=m.name or None, labels=m.labels or None, **model_options(self.config))
        try:
            return self._loaded(opened.runtime, opened.labels, model_identity(path, opened.variant, opened.target),
                                (opened.task, opened.task_options))
        except Exception:
            opened.close()
            raise

    def install(self, loaded: Loaded) -> Loaded:
        """Serve ``loaded`` from the next frame on; returns what was served until now (still open)."""
        with self._lock:
            previous = Loaded(self.pipeline, self.runtime_info, self.identity, self.labels or [])
            self.pipeline, self.runtime_info = loaded.pipeline, loaded.info
            self.identity, self.labels = loaded.identity, loaded.labels
            self.active_path = loaded.identity.get("path") or self.active_path
            self._failing, self.error = 0, ""
        return previous

    def succeeded(self) -> None:
        """An inference worked: the failure streak is over."""
        with self._lock:
            self._failing, self.error = 0, ""

    def failed(self, exc: Exception) -> None:
        """Count a failed inference; close the runtime after ``reopen_after_errors`` in a row."""
        self._counters.add("errors", inference=1)
        with self._lock:
            self._failing += 1
            self.error = first_line(f"{type(exc).__name__}: {exc}")
            failing = self._failing
        log.warning("inference failed (%d in a row): %s", failing, self.error)
        if failing >= self.config.model.reopen_after_errors:
            log.warning("reopening the model after %d failures", failing)
            self.close()  # retry() reopens it, with backoff

    def retry(self, now: float) -> bool:
        """Reopen a closed model when its backoff has passed (``now``: ``time.monotonic()``).

        Returns False when it is not yet time, so the caller can wait a little.
        """
        if now < self._retry_at:
            return False
        try:
            self.open()
        except Exception as exc:  # e.g. the Edge TPU is still unplugged
            # The camera's backoff settings serve the model too: both are local devices.
            cam = self.config.camera
            delay = min(max(self._delay, cam.reconnect_min_s), cam.reconnect_max_s)
            self._delay, self._retry_at = delay * 2, now + delay
            with self._lock:
                self.error = f"cannot reopen the model: {exc}"
            log.warning("%s; retrying in %.1f s", self.error, delay)
            return True
        self._delay = 0.0
        self._counters.add("reconnects", model=1)
        log.info("model reopened")
        return True

    def close(self) -> None:
        """Close the runtime (errors are only logged)."""
        with self._opening:
            with self._lock:
                pipeline, self.pipeline = self.pipeline, None
            if pipeline is not None:
                _close_runtime(pipeline.runtime)

    def _second_stage(self, task: str) -> Any:
        """The cascade's second stage (``[[stage]]``), opened on first use; None without one."""
        if not self.config.stages:
            return None
        if task != "detect":
            raise UsageError(f"[[stage]] needs a detector first; the model is a {task} model",
                             "serve a detect bundle, or remove [[stage]] / --then")
        if self._stage is None:
            from edgekit.serve.config.stages import open_stage

            shared = {k: v for k, v in model_options(self.config).items() if k in ("device", "num_threads")}
            self._stage = open_stage(self.config.stages[0], shared)
            log.info("cascade: each detection's region goes to %s (%s)", self._stage[0].name, self._stage[0].task)
        return self._stage[1]

    def close_stage(self) -> None:
        """Close the cascade's second model (at the daemon's stop; errors are only logged)."""
        stage, self._stage = self._stage, None
        if stage is not None:
            try:
                stage[0].close()
            except Exception as exc:
                log.warning("closing the second model failed: %s", exc)

    def _open_configured(self) -> Any:
        """The default factory: ``[model]`` through :func:`edgekit.model.open_model`."""
        from edgekit.model import open_model
        from edgekit.runtime.fit import check_backend_fits

        m = self.config.model
        if not m.path:
            raise UsageError("no model to serve",
                             "give the bundle first (edgekit serve BUNDLE[:VARIANT]) or set [model] path")
        path = self.active_path or m.path
        opened = open_model(path, variant=m.name or None, labels=m.labels or None, **model_options(self.config))
        try:
            check_backend_fits(m.backend or None, opened.runtime, "[model] backend")
        except UsageError:
            opened.close()
            raise
        if self.labels is None:
            self.labels = opened.labels
        self._task = (opened.task, opened.task_options)
        self.identity = model_identity(path, opened.variant, opened.target)
        return opened.runtime


def _close_runtime(runtime: Any) -> None:
    """Close ``runtime``; a failure is only logged (a model being given up must not stop the daemon)."""
    try:
        runtime.close()
    except Exception as exc:
        log.warning("closing the runtime failed: %s", exc)
