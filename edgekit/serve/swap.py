"""Bundle hot-swap with a health check and rollback.

How a new bundle arrives: the operator (or a fleet tool) writes it beside the running one
and moves it into place atomically (``mv new.tmp bundle`` on the same file system, or a
symlink flip ``ln -sfn bundles/v2 bundle.tmp && mv -T bundle.tmp bundle``). The daemon
then looks at ``[model] path`` again when:

- ``[model] watch = true``: every ``watch_interval_s`` it compares a fingerprint of the
  directory (where the path resolves to, each file's size and mtime): polling works on
  every file system, symlink flips included, and costs a few stat calls;
- it gets SIGHUP (the Unix convention for "reload", ``systemctl reload edgekit``);
- ``POST /reload`` arrives from this machine, when ``[http] reload = true``.

A candidate is checked beside the running model, in this module's thread, while the
running model keeps serving: it must load (``load_bundle`` checks every sha256 and refuses
a bundle rejected at build time), be built for the running bundle's target, give finite
outputs of the right width on the last ``warmup_frames`` frames the daemon saw (a test
pattern during a camera outage) and, with ``min_agreement``, agree with the running model's
top-1 on them. Then the inference loop switches over between two frames
(:meth:`BundleSwap.install_pending`), so no frame is lost or processed twice. The previous
model stays open for ``probation_frames``: an inference error in that time rolls back to it
(and the frame that failed is run again on it). Files still being copied (a hash mismatch
or a missing file within ``SETTLE_S`` of the last change) are waited for, not refused.

Every outcome is one log line, a count (``ok``, ``rolled_back``, ``refused``) and an event
handed to ``on_event`` (the daemon publishes it on ``<topic>/events`` over MQTT): which
outcome, why, and the bundle's name and sha256 beside the one now serving. A refused bundle
is not tried again until its files change.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import EdgekitError
from edgekit.pipeline import Pipeline
from edgekit.results import Decoder

log = logging.getLogger("edgekit.serve")

SETTLE_S = 10.0  # a bundle whose files changed this recently and do not match yet is still being copied
RESULTS = ("ok", "rolled_back", "refused")


@dataclass
class Loaded:
    """A model ready to serve: its Pipeline, what the runtime says about itself, where it came from."""

    pipeline: Pipeline
    info: dict[str, Any]
    identity: dict[str, Any] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)

    def close(self) -> None:
        try:
            self.pipeline.runtime.close()
        except Exception as exc:  # closing is best effort
            log.warning("closing the runtime of %s failed: %s", self.identity.get("bundle", "?"), exc)


def fingerprint(path: str | Path) -> tuple | None:
    """Where ``path`` resolves to and (name, size, mtime) of every file under it; None if absent."""
    real = os.path.realpath(path)
    try:
        if os.path.isfile(real):
            st = os.stat(real)
            return real, (("", st.st_size, st.st_mtime_ns),)
        entries = []
        for root, _dirs, files in os.walk(real):
            for name in files:
                st = os.stat(os.path.join(root, name))
                entries.append((os.path.relpath(os.path.join(root, name), real), st.st_size, st.st_mtime_ns))
    except OSError:
        return None
    return (real, tuple(sorted(entries))) if entries else None


def identity(path: str | Path, variant: str | None = None, target: str | None = None) -> dict[str, Any]:
    """Name, sha256 and target of a model path: a bundle's hash is its manifest's (which lists the
    sha256 of every file), a bare model's is the file's own."""
    from edgekit.bundle import MANIFEST, sha256_file

    real = Path(os.path.realpath(path))
    hashed = real / MANIFEST if real.is_dir() else real
    try:
        digest = sha256_file(hashed)
    except OSError:
        digest = ""
    return {"bundle": Path(path).name, "path": str(real), "variant": variant or "", "sha256": digest,
            "target": target or ""}


def newest_mtime(print_: tuple | None) -> float:
    """The newest file modification time in a fingerprint (0 when there is none)."""
    if not print_:
        return 0.0
    return max((m for _name, _size, m in print_[1]), default=0) / 1e9


def _top1(result: Any) -> int | None:
    """The top-1 class index of a FrameResult, a Classification or Detections (the best box's
    class; None when nothing was detected or for other task heads)."""
    top = getattr(getattr(result, "result", result), "top", None)
    return getattr(top, "index", None)


def warm_up(candidate: Loaded, recent: list[tuple[Any, int | None]], min_agreement: float) -> str:
    """Run ``candidate`` on recent ``(frame, running top-1)`` pairs; '' when healthy, else why not."""
    pipeline, labels = candidate.pipeline, candidate.labels
    agree = compared = 0
    for frame, running_top in recent:
        outputs = pipeline.runtime.infer(pipeline.preprocess(frame.array))
        for out in outputs:
            out = np.asarray(out)
            if np.issubdtype(out.dtype, np.floating) and not np.all(np.isfinite(out)):
                return "it gives non-finite outputs (NaN/inf)"
        width = np.asarray(outputs[0]).shape[-1]
        # a class-score vector must have one value per label (a detector's head checked its
        # class count against the labels when it chose the output layout)
        if isinstance(pipeline.decode, Decoder) and labels and len(outputs) == 1 and width != len(labels):
            return f"its output has {width} classes for {len(labels)} labels"
        top = _top1(pipeline.decode_outputs(outputs, frame.array.shape))
        if running_top is not None and top is not None:
            compared += 1
            agree += int(top == running_top)
    if min_agreement and compared and agree / compared < min_agreement:
        return f"it agrees with the running model on {agree / compared:.0%} of {compared} frames " \
               f"(min {min_agreement:.0%})"
    return ""


class BundleSwap:
    """Watches for a new bundle, checks it, hands it to the inference loop, rolls it back.

    Args:
        config: the service configuration (``[model]``: path, watch, warm-up, probation).
        open_candidate: ``(path) -> Loaded``; opens a model with the daemon's options.
        supervisor: the :class:`~edgekit.serve.supervisor.ModelSupervisor` to swap in.
        stop: the daemon's stop event.

    Thread use: :meth:`request` from anywhere (signal handlers, HTTP); :meth:`remember`,
    :meth:`install_pending`, :meth:`frame_ok` and :meth:`frame_failed` from the inference loop.
    """

    def __init__(self, config: Any, open_candidate: Callable[[str], Loaded], supervisor: Any,
                 stop: threading.Event):
        m = config.model
        self.path = m.path
        self._watch, self._interval = m.watch, m.watch_interval_s
        self._warmup, self._probation_frames, self._min_agreement = m.warmup_frames, m.probation_frames, m.min_agreement
        self.opener = open_candidate  # (path) -> Loaded; tests wrap it to inject device faults
        self._supervisor = supervisor
        self._stop = stop
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._recent: deque[tuple[Any, int | None]] = deque(maxlen=max(1, m.warmup_frames))
        self._pending: Loaded | None = None
        self._previous: Loaded | None = None  # kept open while the new model is on probation
        self._probation = 0
        self._seen = fingerprint(self.path)
        self._refused: set[tuple] = set()
        self._reasons: deque[str] = deque(maxlen=8)
        self.counts = dict.fromkeys(RESULTS, 0)
        self.last = ""  # the latest outcome, for /stats
        self._thread: threading.Thread | None = None
        self.on_event: Callable[[dict[str, Any]], None] | None = None  # (event) -> None, after each outcome

    # ------------------------------------------------------------------ any thread
    def request(self, why: str) -> dict[str, Any]:
        """Look at the bundle path now (SIGHUP, POST /reload). Signal-safe: only sets an event."""
        self._reasons.append(why)
        self._wake.set()
        return {"requested": why, "active": self._supervisor.identity}

    def stats(self) -> dict[str, Any]:
        """The /stats ``swaps`` entry."""
        return {**self.counts, "last": self.last, "probation": self._probation}

    def start(self) -> None:
        """Start the watcher thread."""
        self._thread = threading.Thread(target=self._run, name="edgekit-swap", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the watcher; close a candidate that was never installed and a kept previous model."""
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            leftovers, self._pending, self._previous = [self._pending, self._previous], None, None
        for loaded in leftovers:
            if loaded is not None:
                loaded.close()

    # ------------------------------------------------------------------ the watcher thread
    def _run(self) -> None:
        while not self._stop.is_set():
            requested = self._wake.wait(self._interval if self._watch else None)
            self._wake.clear()
            if self._stop.is_set():
                return
            why = ", ".join(dict.fromkeys(self._reasons)) or "the bundle changed"
            self._reasons.clear()
            try:
                self._consider(why, explicit=requested)
            except Exception:  # a bug here must not end hot-swapping, nor the daemon
                log.exception("hot-swap check failed")

    def _consider(self, why: str, explicit: bool) -> None:
        """One look at the bundle path: prepare a candidate when it changed."""
        current = fingerprint(self.path)
        if current == self._seen and not explicit:
            return
        if current is None:  # mid-rename, or removed: keep serving what is loaded
            if current != self._seen or explicit:
                log.warning("%s: %s does not exist now; still serving sha256 %s", why, self.path,
                            self._supervisor.identity.get("sha256", "")[:12])
            self._seen = current
            return
        if current in self._refused:
            if explicit:
                log.info("%s: %s was refused before and has not changed; still serving %s", why, self.path,
                         self._supervisor.identity.get("sha256", "")[:12])
            return
        if self._pending is not None or self._probation:
            log.info("%s: a swap is already under way; look again afterwards", why)
            return
        self._prepare(why, current)

    def _prepare(self, why: str, current: tuple) -> None:
        new_id = identity(self.path)
        active = self._supervisor.identity
        if new_id["sha256"] and new_id["sha256"] == active.get("sha256"):
            self._seen = current
            log.info("%s: bundle %s unchanged (sha256 %s); nothing to do", why, self.path, new_id["sha256"][:12])
            return
        try:
            candidate = self.opener(self.path)
        except EdgekitError as exc:
            if _still_copying(exc, current):
                log.info("%s: %s is still being written (%s); waiting", why, self.path, exc.message)
                return  # _seen stays old: the next poll (or request) tries again
            self._refuse(current, f"cannot load it: {exc}")
            return
        except Exception as exc:  # a runtime that throws on open: refused, never fatal
            self._refuse(current, f"cannot open it: {type(exc).__name__}: {exc}".splitlines()[0])
            return
        problem = self._check(candidate, active)
        if problem:
            candidate.close()
            self._refuse(current, problem)
            return
        self._seen = current
        with self._lock:
            self._pending = candidate
        log.info("%s: bundle %s (sha256 %s) passed its checks; swapping it in", why, self.path,
                 candidate.identity.get("sha256", "")[:12])

    def _check(self, candidate: Loaded, active: dict[str, Any]) -> str:
        target, running = candidate.identity.get("target"), active.get("target")
        if target and running and target != running:
            return f"it is built for target {target!r}, this device runs {running!r} (restart the service to change)"
        with self._lock:
            recent = list(self._recent)
        if not recent:  # no frame yet (a camera outage): a test pattern still proves the model runs
            from edgekit.camera import Frame, synthetic_frame

            recent = [(Frame(synthetic_frame(i), time.perf_counter_ns(), i), None) for i in range(self._warmup)]
        try:
            return warm_up(candidate, recent, self._min_agreement)
        except Exception as exc:
            return f"its warm-up failed: {type(exc).__name__}: {exc}".splitlines()[0]

    def _refuse(self, current: tuple, reason: str) -> None:
        self._refused.add(current)
        self._seen = current
        log.warning("hot-swap refused %s: %s; still serving sha256 %s", self.path, reason,
                    self._supervisor.identity.get("sha256", "")[:12])
        self.last = f"refused: {reason}"
        self.counts["refused"] += 1  # counted after the line: a reader that sees the count finds it logged
        self._event("refused", reason, identity(self.path))

    # ------------------------------------------------------------------ the inference loop
    def remember(self, frame: Any, result: Any) -> None:
        """Keep the newest frames (and the running model's top-1) for a candidate's warm-up."""
        with self._lock:
            self._recent.append((frame, _top1(result)))

    def install_pending(self) -> None:
        """Between two frames: switch to a checked candidate, keeping the previous model for rollback."""
        if self._pending is None:
            return
        with self._lock:
            candidate, self._pending = self._pending, None
        self._previous = self._supervisor.install(candidate)
        self._probation = self._probation_frames
        if not self._probation:
            self._commit()

    def frame_ok(self) -> None:
        """A frame worked: count down the probation."""
        if self._probation:
            self._probation -= 1
            if not self._probation:
                self._commit()

    def frame_failed(self, exc: Exception) -> bool:
        """An inference failed; during probation roll back (True: run the frame again)."""
        if not self._probation or self._previous is None:
            return False
        failed = self._supervisor.install(self._previous)
        sha = failed.identity.get("sha256", "")[:12]
        self._previous, self._probation = None, 0
        failed.close()
        if self._seen is not None:
            self._refused.add(self._seen)
        log.warning("hot-swap: bundle sha256 %s failed on probation (%s); rolled back to sha256 %s", sha,
                    f"{type(exc).__name__}: {exc}".splitlines()[0], self._supervisor.identity.get("sha256", "")[:12])
        reason = f"failed on probation: {type(exc).__name__}: {exc}".splitlines()[0]
        self.last = f"rolled back {sha}: {type(exc).__name__}: {exc}".splitlines()[0]
        self.counts["rolled_back"] += 1
        self._event("rolled_back", reason, failed.identity)
        return True

    def _commit(self) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            previous.close()
        new = self._supervisor.identity
        log.info("hot-swap done: serving %s (sha256 %s)", new.get("path", ""), new.get("sha256", "")[:12])
        self.last = f"ok: {new.get('bundle', '')} sha256 {new.get('sha256', '')[:12]}"
        self.counts["ok"] += 1
        self._event("ok", "", new)

    def _event(self, result: str, reason: str, bundle: dict[str, Any]) -> None:
        """Hand one outcome to ``on_event``; a failing listener is logged, never fatal."""
        if self.on_event is None:
            return
        active = self._supervisor.identity
        event = {"event": "model_swap", "result": result, "reason": reason, "time": round(time.time(), 3),
                 "bundle": bundle.get("bundle", ""), "path": bundle.get("path", ""),
                 "sha256": bundle.get("sha256", ""), "variant": bundle.get("variant", ""),
                 "active_bundle": active.get("bundle", ""), "active_sha256": active.get("sha256", "")}
        try:
            self.on_event(event)
        except Exception as exc:  # an output that fails must not stop swapping
            log.warning("hot-swap event not delivered: %s", exc)


def _still_copying(exc: EdgekitError, current: tuple) -> bool:
    """A hash mismatch or a missing file in a bundle whose files changed within SETTLE_S."""
    text = exc.message
    partial = "does not match its sha256" in text or " is missing " in text or "no edgekit.json" in text
    return partial and time.time() - newest_mtime(current) < SETTLE_S

