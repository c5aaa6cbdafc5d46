"""Bundle hot-swap with a health check and rollback.

How a new bundle arrives: the operator (or a fleet tool) writes it beside the running one
and moves it into place atomically (``mv new.tmp bundle`` on the same file system, or a
symlink flip ``ln -sfn bundles/v2 bundle.tmp && mv -T bundle.tmp bundle``). The daemon
then looks at ``[model] path`` again when:

- ``[model] watch = true``: every ``watch_interval_s`` it compares a fingerprint of the
  directory (where the path resolves to, each file's size and mtime): polling works on
  every file system, symlink flips included, and costs a few stat calls
  (:mod:`edgekit.serve.watch`);
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

The manifest alone proves nothing: when the files changed under the running bundle's own
``edgekit.json``, those whose size or mtime changed are hashed, and a mismatch is refused in
the words a restart uses. A path that became a directory without a manifest is refused as
not a bundle. A candidate that decodes another task, or names other labels, is refused
unless ``[model] allow_task_change`` (what consumers of the results receive would change
under them). Each check runs in a thread of its own with a deadline (``CHECK_DEADLINE_S``):
files are opened only as regular files, so a FIFO is refused at once, and whatever still
hangs (a dead mount, a device) is abandoned as a counted, logged refusal while the watcher
goes on.

Every outcome is one log line, a count (``ok``, ``rolled_back``, ``refused``) and an event
handed to ``on_event`` (the daemon publishes it on ``<topic>/events`` over MQTT): which
outcome, why, and the bundle's name and sha256 beside the one now serving. A refused bundle
is not tried again until its files change. A fleet's channel follower (``edgekit.fleet.follower``)
flips the path and asks, and counts what it refuses before that here (:meth:`BundleSwap.refuse`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgekit.errors import EdgekitError, first_line
from edgekit.pipeline import Pipeline
from edgekit.serve.watch import (
    CHECK_DEADLINE_S,
    content_problem,
    drop_decision,
    fingerprint,
    first_difference,
    identity,
    still_copying,
    task_of,
    top1,
    warm_up,
    with_deadline,
)

__all__ = ["BundleSwap", "Loaded", "fingerprint", "identity", "warm_up"]

log = logging.getLogger("edgekit.serve")

RESULTS = ("ok", "rolled_back", "refused")
MAX_ABANDONED = 8  # checks stuck past their deadline (each a blocked thread) before no new one starts


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
        self._active_print = self._seen  # what the serving bundle's files were when it was loaded
        self._pending_print: tuple | None = None
        self._previous_print: tuple | None = None
        self._looking_at: tuple | None = None  # the fingerprint the running check looks at
        self._generation = 0  # bumped per check: a check abandoned at its deadline is not acted on
        self._abandoned = 0
        self._deadline = float(getattr(m, "check_deadline_s", CHECK_DEADLINE_S))
        self._allow_task_change = bool(getattr(m, "allow_task_change", False))
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
                self._look(why, explicit=requested)
            except Exception:  # a bug here must not end hot-swapping, nor the daemon
                log.exception("hot-swap check failed")

    def _look(self, why: str, explicit: bool) -> None:
        """One look at the bundle path, in a thread of its own with a deadline: whatever a file
        does (a hung mount, a device that never answers), the watcher comes back to watch."""
        if self._abandoned >= MAX_ABANDONED:
            log.warning("%s: %d hot-swap checks of %s are still stuck; not starting another", why,
                        self._abandoned, self.path)
            return
        box: dict[str, Any] = {}
        with self._lock:
            self._generation += 1
            generation, self._looking_at = self._generation, None

        def work() -> None:
            try:
                decision = self._consider(why, explicit)
            except Exception:
                log.exception("hot-swap check failed")
                decision = None
            with self._lock:
                if generation == self._generation:
                    box["decision"] = decision
                    return
                self._abandoned -= 1
            drop_decision(decision)  # abandoned at its deadline: nobody will install what it opened

        finished = with_deadline(work, self._deadline, self._stop)
        with self._lock:
            if not finished and "decision" not in box:
                self._generation += 1  # a late result is dropped by work() itself
                self._abandoned += 1
        if finished or "decision" in box:
            self._apply(box.get("decision"), why)
            return
        if self._stop.is_set():  # shutting down: the late check is dropped, not a refusal
            return
        self._refuse(self._looking_at or (str(self.path), ("stuck",)),
                     f"its check did not finish within {self._deadline:g} s (a file that blocks reads, or a "
                     "device that does not answer); fix the bundle's files or its storage")

    def _apply(self, decision: tuple | None, why: str) -> None:
        """Act on what :meth:`_consider` decided (in the watcher thread, so state has one writer)."""
        if decision is None:
            return
        kind, current, detail = decision
        if kind == "refuse":
            self._refuse(current, detail)
            return
        self._seen = current
        if kind == "install":
            with self._lock:
                self._pending, self._pending_print = detail, current
            log.info("%s: bundle %s (sha256 %s) passed its checks; swapping it in", why, self.path,
                     detail.identity.get("sha256", "")[:12])

    def _consider(self, why: str, explicit: bool) -> tuple | None:
        """What to do about the bundle path now: ``(kind, fingerprint, detail)`` with kind ``seen``
        (remember it, nothing to do), ``refuse`` (detail: why) or ``install`` (detail: the checked
        candidate); None to look again later."""
        current = fingerprint(self.path)
        self._looking_at = current
        if current == self._seen and not explicit:
            return None
        if current is None:  # mid-rename, or removed: keep serving what is loaded
            if current != self._seen or explicit:
                log.warning("%s: %s does not exist now; still serving sha256 %s", why, self.path,
                            self._supervisor.identity.get("sha256", "")[:12])
            return "seen", current, None
        if current in self._refused:
            if explicit:
                log.info("%s: %s was refused before and has not changed; still serving %s", why, self.path,
                         self._supervisor.identity.get("sha256", "")[:12])
            return None
        if self._pending is not None or self._probation:
            log.info("%s: a swap is already under way; look again afterwards", why)
            return None
        return self._prepare(why, current)

    def _prepare(self, why: str, current: tuple) -> tuple | None:
        new_id = identity(self.path)
        active = self._supervisor.identity
        if new_id["sha256"] and new_id["sha256"] == active.get("sha256"):
            # the manifest is the running one's; its files may not be (a model replaced in place)
            problem = content_problem(self.path, self._active_print, current)
            if not problem:
                log.info("%s: bundle %s unchanged (sha256 %s); nothing to do", why, self.path, new_id["sha256"][:12])
                return "seen", current, None
            return self._load_failed(why, current, problem)
        try:
            candidate = self.opener(self.path)
        except EdgekitError as exc:
            return self._load_failed(why, current, exc.message)
        except Exception as exc:  # a runtime that throws on open: refused, never fatal
            return "refuse", current, first_line(f"cannot open it: {type(exc).__name__}: {exc}")
        problem = self._check(candidate, active)
        if problem:
            candidate.close()
            return "refuse", current, problem
        return "install", current, candidate

    def _load_failed(self, why: str, current: tuple, message: str) -> tuple | None:
        if still_copying(message, current):
            log.info("%s: %s is still being written (%s); waiting", why, self.path, message)
            return None  # _seen stays old: the next poll (or request) tries again
        return "refuse", current, f"cannot load it: {message}"

    def _check(self, candidate: Loaded, active: dict[str, Any]) -> str:
        target, running = candidate.identity.get("target"), active.get("target")
        if target and running and target != running:
            return f"it is built for target {target!r}, this device runs {running!r} (restart the service to change)"
        if problem := self._task_change(candidate):
            return problem
        with self._lock:
            recent = list(self._recent)
        if not recent:  # no frame yet (a camera outage): a test pattern still proves the model runs
            from edgekit.camera import Frame, synthetic_frame

            recent = [(Frame(synthetic_frame(i), time.perf_counter_ns(), i), None) for i in range(self._warmup)]
        try:
            return warm_up(candidate, recent, self._min_agreement)
        except Exception as exc:
            return first_line(f"its warm-up failed: {type(exc).__name__}: {exc}")

    def _task_change(self, candidate: Loaded) -> str:
        """A candidate that decodes another task, or names other classes, would change what every
        consumer of the results receives: refused unless ``[model] allow_task_change``."""
        if self._allow_task_change:
            return ""
        fix = "(set [model] allow_task_change = true, or restart the service, to change it)"
        pipeline = getattr(self._supervisor, "pipeline", None)
        running, new = task_of(pipeline), task_of(candidate.pipeline)
        if pipeline is not None and running != new:
            return f"it changes the task from {running} to {new} {fix}"
        labels = getattr(self._supervisor, "labels", None)
        if labels is not None and list(candidate.labels) != list(labels):
            return f"it changes the labels ({len(labels)} -> {len(candidate.labels)}, " \
                   f"first difference: {first_difference(labels, candidate.labels)}) {fix}"
        return ""

    def _refuse(self, current: tuple, reason: str) -> None:
        self._refused.add(current)
        self._seen = current
        self.refuse(str(self.path), reason, identity(self.path))

    def refuse(self, what: str, reason: str, bundle: dict[str, Any]) -> None:
        """Log, count and publish one refusal of ``bundle`` (``what`` names it: a path, or a fleet
        version refused before it reached the path: untrusted, tampered, missing)."""
        log.warning("hot-swap refused %s: %s; still serving sha256 %s", what, reason,
                    self._supervisor.identity.get("sha256", "")[:12])
        self.last = f"refused: {reason}"
        self.counts["refused"] += 1  # counted after the line: a reader that sees the count finds it logged
        self._event("refused", reason, bundle)

    # ------------------------------------------------------------------ the inference loop
    def remember(self, frame: Any, result: Any) -> None:
        """Keep the newest frames (and the running model's top-1) for a candidate's warm-up."""
        with self._lock:
            self._recent.append((frame, top1(result)))

    def install_pending(self) -> None:
        """Between two frames: switch to a checked candidate, keeping the previous model for rollback."""
        if self._pending is None:
            return
        with self._lock:
            candidate, self._pending = self._pending, None
        self._previous_print, self._active_print = self._active_print, self._pending_print
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
        self._active_print = self._previous_print
        sha = failed.identity.get("sha256", "")[:12]
        self._previous, self._probation = None, 0
        failed.close()
        if self._seen is not None:
            self._refused.add(self._seen)
        log.warning("hot-swap: bundle sha256 %s failed on probation (%s); rolled back to sha256 %s", sha,
                    first_line(f"{type(exc).__name__}: {exc}"), self._supervisor.identity.get("sha256", "")[:12])
        reason = first_line(f"failed on probation: {type(exc).__name__}: {exc}")
        self.last = first_line(f"rolled back {sha}: {type(exc).__name__}: {exc}")
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
