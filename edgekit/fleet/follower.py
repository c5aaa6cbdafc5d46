"""The daemon's channel follower: poll the channel, fetch and verify a new version, hand it to the
hot-swap, and remember what was refused.

``[model] path`` becomes the versions folder's ``current`` link (:mod:`edgekit.fleet.local`). At
start (:meth:`ChannelFollower.prepare`) a version already on the device is checked (signature by a
trusted key, every hash) and served without asking the store, so a device whose store is down
still starts; only a device with nothing to serve waits for the store. Then a thread polls the
pointer every ``poll_interval_s`` (jittered, so a fleet does not poll in step; with If-None-Match,
so an unchanged pointer costs one small request). A new version is fetched by
:class:`~edgekit.fleet.pull.Fetcher`; ``current`` is flipped to it and the hot-swap
(:class:`~edgekit.serve.swap.BundleSwap`) is asked to look: it loads it, checks target, task and a
warm-up beside the running model, swaps between frames and rolls back on probation.

A version refused (by the fetcher: untrusted, tampered, missing, too big, another target; or by the
hot-swap: failed warm-up, rolled back) is counted in ``edgekit_model_swaps_total{result="refused"}``
(or ``rolled_back``), logged once, ``current`` flipped back, and not tried again until the channel's
pointer changes. A store that is down or slow, or a full disk, is a fetch error: counted, logged
once per distinct reason, retried with exponential backoff; inference never waits for any of it.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import random
import threading
import time
from typing import Any

from edgekit.errors import EXIT_RUNTIME, BundleError, EdgekitError, UsageError
from edgekit.fleet.channel import MAX_POINTER_BYTES, Pointer, PointerError, channel_object, parse_pointer
from edgekit.fleet.keys import read_trusted
from edgekit.fleet.local import VersionsDir, default_root
from edgekit.fleet.pull import Fetcher, Missing, NoSpace, Refused
from edgekit.fleet.signature import verify_bundle
from edgekit.fleet.store import Reader, StoreError, parse_location

log = logging.getLogger("edgekit.serve")

MAX_BACKOFF_S = 300.0
MISSING_POLLS = 3  # polls a channel's version may be missing before it is refused (a mirror catching up)


class StoreUnavailable(EdgekitError):
    """Nothing on this device to serve and the store cannot give it now (exit 1: try again later)."""

    exit_code = EXIT_RUNTIME


class ChannelFollower:
    """Follows ``[model] source``'s ``channel`` for one daemon (see the module docstring).

    ``reader`` and ``free_bytes`` replace the store reader and the free-space check (tests)."""

    def __init__(self, config: Any, stop: threading.Event, reader: Reader | None = None, free_bytes: Any = None):
        m = config.model
        self.location = parse_location(m.source, "[model] source")
        self.channel = m.channel
        self.vdir = VersionsDir(m.versions_dir or default_root(str(self.location), m.channel))
        self._model = m
        self._reader, self._free_bytes = reader, free_bytes
        self._stop = stop
        self._wake = threading.Event()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._swap: Any = None
        self._supervisor: Any = None
        self._thread: threading.Thread | None = None
        self._fetcher: Fetcher | None = None
        self._pointer: Pointer | None = None
        self._etag = ""
        self._candidate: dict[str, Any] | None = None  # the version flipped to, its swap's outcome pending
        self._good = ""  # the version served before the candidate: kept on disk for a rollback
        self._refused: dict[str, tuple[str, str]] = {}  # pointer digest -> (version, reason)
        self._missing: dict[str, int] = {}  # pointer digest -> polls that found its version missing
        self._said: set[str] = set()
        self._failures = 0
        self.state = "starting"
        self.last_error = ""
        self.counts = {"polls": 0, "fetch_errors": 0, "downloaded_bytes": 0, "fetched": 0}

    def configured(self, config: Any) -> Any:
        """``config`` with ``[model] path`` at the versions folder's ``current`` link."""
        return dataclasses.replace(config, model=dataclasses.replace(config.model, path=str(self.vdir.current)))

    # ------------------------------------------------------------------ start and stop
    def prepare(self) -> None:
        """Lock the versions folder and make sure ``current`` names a version that verifies: the
        local one if it does, else the channel's, fetched now. Raises when there is none to serve."""
        trusted = read_trusted(list(self._model.trusted_keys), "[model] trusted_keys")
        self._fetcher = Fetcher(self._reader or Reader(self.location), trusted, int(self._model.max_bundle_mb * 1e6),
                                stopping=self._stop.is_set, progress=self._progress)
        if self._free_bytes is not None:
            self._fetcher.free_bytes = self._free_bytes
        self.vdir.lock()
        try:
            self._first_version()
        except BaseException:
            self.vdir.unlock()
            raise

    def _first_version(self) -> None:
        current = self.vdir.current_version()
        if current is not None:
            try:
                verify_bundle(self.vdir.path(current), self._fetcher.trusted)
                log.info("channel %s of %s: starting with version %s from %s", self.channel, self.location,
                         current[:12], self.vdir.root)
                return
            except BundleError as exc:
                log.warning("version %s on this device does not verify (%s); fetching the channel's version",
                            current[:12], exc.message)
        try:
            pointer = self._read_pointer()
            self._fetcher.fetch(self.vdir, pointer.version)
        except (StoreError, NoSpace, PointerError) as exc:
            raise StoreUnavailable(f"no version of channel {self.channel} is on this device and {self.location} "
                                   f"cannot give one now: {exc}",
                                   "check the store and the credentials; the service retries when restarted") from exc
        except Refused as exc:
            raise UsageError(f"channel {self.channel} of {self.location} points at a version this device refuses: "
                             f"{exc}", "push a bundle signed by a trusted key for this target") from exc
        self.vdir.flip(pointer.version)
        log.info("channel %s of %s: fetched version %s", self.channel, self.location, pointer.version[:12])

    def attach(self, swap: Any, supervisor: Any) -> None:
        """Start following, handing versions to ``swap`` and reading what runs from ``supervisor``."""
        self._swap, self._supervisor = swap, supervisor
        self._good = supervisor.identity.get("sha256", "")
        self.state = "serving"
        self._thread = threading.Thread(target=self._run, name="edgekit-fleet", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (a download in progress stops at its next block) and release the folder."""
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)  # a read blocked on a silent store is not waited for (a daemon thread)
        self.vdir.unlock()

    def on_swap_event(self, event: dict[str, Any]) -> None:
        """A hot-swap outcome (any thread, the inference loop's included): queued for the follower."""
        self._events.put(event)
        self._wake.set()

    def stats(self) -> dict[str, Any]:
        """The /stats ``fleet`` entry."""
        serving = self._supervisor.identity.get("sha256", "") if self._supervisor is not None else ""
        return {"source": str(self.location), "channel": self.channel, "version": serving,
                "channel_version": self._pointer.version if self._pointer else "", "state": self.state,
                "store_up": int(self._failures == 0 and self.counts["polls"] > 0), "last_error": self.last_error,
                "refused": {v[:12]: reason for v, reason in self._refused.values()}, **self.counts,
                "versions_dir": str(self.vdir.root)}

    # ------------------------------------------------------------------ the follower thread
    def _run(self) -> None:
        while not self._stop.is_set():
            self._handle_events()
            delay = self._model.poll_interval_s
            try:
                self._poll()
                if self._failures:
                    log.info("channel %s: %s answers again", self.channel, self.location)
                self._failures, self.last_error = 0, ""
                self._said.clear()
            except (StoreError, NoSpace, PointerError, OSError) as exc:
                if self._stop.is_set():  # a download stopped for shutdown: no error to report
                    return
                delay = self._failed(exc)
            except Exception:  # a bug here must not end following, nor the daemon
                log.exception("channel %s: following failed", self.channel)
                delay = self._failed(RuntimeError("internal error (see the log)"))
            if self._wake.wait(delay * random.uniform(0.9, 1.1)):
                self._wake.clear()

    def _failed(self, exc: BaseException) -> float:
        """Count a fetch error, log it once per distinct reason; the backoff before the next poll."""
        self._failures += 1
        self.counts["fetch_errors"] += 1
        self.last_error = str(exc)[:300]
        self.state = "disk full" if isinstance(exc, NoSpace) else "store unreachable"
        if self.last_error not in self._said:
            self._said.add(self.last_error)
            log.warning("channel %s: %s; still serving sha256 %s, retrying with backoff", self.channel,
                        self.last_error, (self._supervisor.identity.get("sha256", "") if self._supervisor else "")[:12])
        base = self._model.poll_interval_s
        return min(base * 2 ** min(self._failures, 16), max(base, MAX_BACKOFF_S))

    def _read_pointer(self) -> Pointer:
        key = self.location.key(channel_object(self.channel))
        reader = self._fetcher.reader
        response = reader.get(key, MAX_POINTER_BYTES, self._etag if self._pointer else "")
        self.counts["polls"] += 1
        if response.status == 304 and self._pointer is not None:
            return self._pointer
        pointer = parse_pointer(response.body, self.channel)
        self._pointer, self._etag = pointer, response.headers.get("etag", "")
        return pointer

    def _poll(self) -> None:
        pointer = self._read_pointer()
        serving = self._supervisor.identity.get("sha256", "")
        if pointer.digest in self._refused:
            self.state = "refused"
            return
        if pointer.version == serving:
            self._settled(serving)
            return
        candidate = self._candidate
        if candidate is not None and candidate["version"] == pointer.version:
            self._nudge(candidate)
            return
        self._fetch_and_hand_over(pointer, serving)

    def _fetch_and_hand_over(self, pointer: Pointer, serving: str) -> None:
        self.vdir.clean_staging(keep=pointer.version)
        self.state = "downloading"
        try:
            self._fetcher.fetch(self.vdir, pointer.version, self._supervisor.identity.get("target", ""))
        except Missing as exc:
            seen = self._missing[pointer.digest] = self._missing.get(pointer.digest, 0) + 1
            if seen < MISSING_POLLS:  # a mirror that copied the pointer first gets a few polls to catch up
                self.state = "waiting for the version"
                log.info("channel %s: %s; polling again (%d of %d)", self.channel, exc, seen, MISSING_POLLS)
                return
            self._refuse(pointer, str(exc))
            return
        except Refused as exc:
            self._refuse(pointer, str(exc))
            return
        self.counts["fetched"] += 1
        self._good = serving or self._good
        self.vdir.flip(pointer.version)
        self._candidate = {"version": pointer.version, "digest": pointer.digest, "asked": time.monotonic()}
        self.state = "swapping"
        log.info("channel %s moved to version %s (signed by key %s); handing it to the hot-swap", self.channel,
                 pointer.version[:12], self._fetcher.last_key.get(pointer.version, "?"))
        self._swap.request(f"channel {self.channel} moved to version {pointer.version[:12]}")

    def _nudge(self, candidate: dict[str, Any]) -> None:
        """A version handed over whose outcome has not come: ask again after a while (a request that
        met a swap under way is not queued by the hot-swap)."""
        if time.monotonic() - candidate["asked"] > 2 * self._model.poll_interval_s + 1 and \
                not self._swap.stats().get("probation"):
            candidate["asked"] = time.monotonic()
            self._swap.request(f"channel {self.channel}: version {candidate['version'][:12]} still waits")

    def _settled(self, serving: str) -> None:
        """The channel's version runs: once off probation, keep ``keep_versions`` and clean up."""
        self.state = "serving"
        if self._swap.stats().get("probation"):
            return
        if self._candidate is not None and self._candidate["version"] == serving:
            self._candidate = None
        if self.vdir.current_version() != serving and self.vdir.has(serving):
            self.vdir.flip(serving)
        self._good = serving  # off probation: the rollback target from now on
        self.vdir.clean_staging()
        self.vdir.prune(self._model.keep_versions, {serving})

    def _refuse(self, pointer: Pointer, reason: str) -> None:
        """The fetcher refused the channel's version: counted and logged (once: not retried until
        the pointer changes)."""
        self._refused = {**dict(list(self._refused.items())[-15:]), pointer.digest: (pointer.version, reason)}
        self.state = "refused"
        bundle = {"bundle": pointer.bundle, "path": f"{self.location}/versions/{pointer.version}",
                  "sha256": pointer.version, "variant": ""}
        self._swap.refuse(f"version {pointer.version[:12]} of channel {self.channel}", reason, bundle)

    def _handle_events(self) -> None:
        """Act on the hot-swap's outcomes for the version handed over."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            candidate = self._candidate
            if candidate is None or event.get("sha256") != candidate["version"]:
                continue
            if event.get("result") == "ok":
                self._candidate = None
                continue
            # a new dict, never one changed in place: /stats reads it from the HTTP thread
            self._refused = {**self._refused, candidate["digest"]: (candidate["version"],
                                                                     str(event.get("reason", ""))[:300])}
            self._candidate = None
            self.state = "refused"
            serving = self._supervisor.identity.get("sha256", "")
            if self.vdir.has(serving):
                self.vdir.flip(serving)  # a restart serves what runs now, not what was refused
            # gone from disk: a retry (the channel moved back to it) is a fresh folder the watcher looks at
            self.vdir.remove(candidate["version"])

    def _progress(self, n: int) -> None:
        self.counts["downloaded_bytes"] += n
