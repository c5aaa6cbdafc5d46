"""What the hot-swap watcher looks at: a bundle path's fingerprint, its identity, whether its
content still matches its manifest, and a deadline for every check.

The fingerprint (where the path resolves to; each file's name, size and mtime) costs a few
``stat`` calls, never a read, so it is taken every poll. When it changes but the manifest is
the running bundle's, only the files whose size or mtime changed are hashed
(:func:`content_problem`): a model file replaced under an unchanged ``edgekit.json`` is refused
live as ``load_bundle`` refuses it at a restart. Files are opened only as regular files
(:mod:`edgekit.util.safe_open`), so a FIFO in a watched bundle cannot block a read; a check that
still does not finish (a hung network file system, a device that never answers) is abandoned
after a deadline by :func:`with_deadline`.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.heads.classify import Decoder

SETTLE_S = 10.0  # a bundle whose files changed this recently and do not match yet is still being copied
CHECK_DEADLINE_S = 300.0
"""How long one hot-swap check (load, hashes, runtime open, warm-up) may take before it is abandoned
and counted as refused: far above a real one (a TensorRT engine build is the slowest open)."""


def fingerprint(path: str | Path) -> tuple | None:
    """Where ``path`` resolves to and (name, size, mtime) of every file under it; None if absent.

    A directory with no files (or only unreadable entries) is still a fingerprint, so a watched
    path turned into some other directory is looked at (and refused as not a bundle), not taken
    for a path that does not exist. ``stat`` never opens a file: a FIFO here cannot block.
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return real, (("", st.st_size, st.st_mtime_ns),)
    entries = []
    for root, _dirs, files in os.walk(real):
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:  # a dangling symlink or a file removed meanwhile: its own entry
                st = None
            entries.append((os.path.relpath(full, real), st.st_size if st else -1, st.st_mtime_ns if st else -1))
    return real, tuple(sorted(entries))


def identity(path: str | Path, variant: str | None = None, target: str | None = None) -> dict[str, Any]:
    """Name, sha256 and target of a model path: a bundle's hash is its manifest's (which lists the
    sha256 of every file), a bare model's is the file's own ('' when it is not a regular file)."""
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


def content_problem(path: str | Path, before: tuple | None, now: tuple) -> str:
    """Why the bundle at ``path`` (fingerprint ``now``) no longer matches its manifest, '' when it does.

    Only files listed in the manifest whose (size, mtime) differ from ``before`` (the fingerprint
    the running bundle was loaded with; None: every file) are hashed. The words are
    ``load_bundle``'s, so a refusal reads the same live and after a restart.
    """
    from edgekit.bundle import MANIFEST, load_bundle, sha256_file
    from edgekit.errors import BundleError

    try:
        listed = load_bundle(path, check_hashes=False, allow_rejected=True).manifest["files"]
    except BundleError as exc:
        return exc.message
    old = {name: (size, mtime) for name, size, mtime in (before[1] if before and before[0] == now[0] else ())}
    new = {name: (size, mtime) for name, size, mtime in now[1]}
    real = Path(now[0])
    for name, digest in listed.items():
        if name in old and old[name] == new.get(name):
            continue
        try:
            same = sha256_file(real / name, follow=False) == digest
        except OSError as exc:
            return f"{Path(path) / name} cannot be read: {exc.strerror or exc}"
        if not same:
            return f"{Path(path) / name} does not match its sha256 in {MANIFEST} (corrupt or modified)"
    return ""


def still_copying(message: str, current: tuple) -> bool:
    """A hash mismatch or a missing file in a bundle whose files changed within SETTLE_S."""
    partial = "does not match its sha256" in message or " is missing " in message or "no edgekit.json" in message
    return partial and time.time() - newest_mtime(current) < SETTLE_S


def with_deadline(work: Callable[[], None], deadline_s: float, stop: threading.Event | None = None,
                  name: str = "edgekit-swap-check") -> bool:
    """Run ``work`` in a daemon thread; True when it finished within ``deadline_s`` (waiting no
    longer once ``stop`` is set: the daemon is shutting down).

    A check that does not finish is left running (a thread blocked in a read cannot be
    interrupted) and the caller carries on: the watcher stays alive whatever one file does.
    """
    done = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    end = time.monotonic() + deadline_s
    while not done.wait(min(0.1, max(0.0, end - time.monotonic()))):
        if time.monotonic() >= end or (stop is not None and stop.is_set()):
            return done.is_set()
    return True


def drop_decision(decision: tuple | None) -> None:
    """Close the candidate of a hot-swap decision nobody will act on (a check abandoned at its deadline)."""
    if decision is not None and decision[0] == "install":
        decision[2].close()


def top1(result: Any) -> int | None:
    """The top-1 class index of a FrameResult, a Classification or Detections (the best box's
    class; None when nothing was detected or for other task heads)."""
    top = getattr(getattr(result, "result", result), "top", None)
    return getattr(top, "index", None)


class _Unhealthy(Exception):
    """A candidate's outputs that no serving model may give (the reason is the message)."""


class _CheckedRuntime:
    """The candidate's runtime with its raw outputs checked on the way to the frame loop's decoder:
    non-finite values, and a class-score vector without one value per label."""

    def __init__(self, runtime: Any, labels: list[str], classifier: bool):
        self._runtime, self._labels, self._classifier = runtime, labels, classifier
        self.input_spec = runtime.input_spec

    def infer(self, tensor: Any) -> Any:
        outputs = self._runtime.infer(tensor)
        for out in outputs:
            out = np.asarray(out)
            if np.issubdtype(out.dtype, np.floating) and not np.all(np.isfinite(out)):
                raise _Unhealthy("it gives non-finite outputs (NaN/inf)")
        width = np.asarray(outputs[0]).shape[-1]
        # a class-score vector must have one value per label (a detector's head checked its
        # class count against the labels when it chose the output layout)
        if self._classifier and self._labels and len(outputs) == 1 and width != len(self._labels):
            raise _Unhealthy(f"its output has {width} classes for {len(self._labels)} labels")
        return outputs

    def __getattr__(self, name: str) -> Any:  # describe, close, init_ms: the runtime's own
        return getattr(self._runtime, name)


def warm_up(candidate: Any, recent: list[tuple[Any, int | None]], min_agreement: float) -> str:
    """Run ``candidate`` (a :class:`~edgekit.serve.swap.Loaded`) on recent ``(frame, running top-1)`` pairs
    through the frame loop serving uses (:class:`~edgekit.pipeline.Pipeline`, the candidate's own
    decoder); '' when healthy, else why not."""
    from edgekit.pipeline import Pipeline

    served, labels = candidate.pipeline, candidate.labels
    runtime = _CheckedRuntime(served.runtime, labels, isinstance(served.decode, Decoder))
    # Its own metrics: the candidate's pipeline records into the daemon's /stats sink, which the
    # inference loop is writing meanwhile; warm-up frames must not count there.
    loop = Pipeline(runtime, labels, decoder=served.decode, max_corrupt=None, warmup=0, window=len(recent) or 1)
    running = {id(frame): top for frame, top in recent}  # by object: a reconnected camera counts from 0 again
    agree = compared = 0
    try:
        for frame, result in loop.steps(frame for frame, _top in recent):
            top, running_top = top1(result), running.get(id(frame))
            if running_top is not None and top is not None:
                compared += 1
                agree += int(top == running_top)
    except _Unhealthy as exc:
        return str(exc)
    if min_agreement and compared and agree / compared < min_agreement:
        return f"it agrees with the running model on {agree / compared:.0%} of {compared} frames " \
               f"(min {min_agreement:.0%})"
    return ""


def task_of(pipeline: Any) -> str:
    """The task head a Pipeline decodes with, by its decoder (:data:`edgekit.heads.table.TASK_HEADS`)."""
    name = type(getattr(pipeline, "decode", None)).__name__
    return {"Decoder": "classify", "RawDecoder": "raw", "Detector": "detect"}.get(name, name)


def first_difference(before: list[str], after: list[str]) -> str:
    """Where two label lists first differ, in words (``3: 'cat' -> 'dog'``)."""
    for i, (a, b) in enumerate(zip(before, after)):
        if a != b:
            return f"{i}: {a[:40]!r} -> {b[:40]!r}"
    n = min(len(before), len(after))
    return f"{n}: {(before[n:] or after[n:])[0][:40]!r} {'dropped' if len(before) > n else 'added'}"
