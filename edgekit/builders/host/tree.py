"""The resident memory of a build's whole process tree: this process and its children together.

A build runs children beside itself: onnx2tf's conversion process (a second Python with
TensorFlow loaded) while the parent holds the ONNX model, edgetpu_compiler, the RKNN toolkit.
Neither this process's ``VmHWM`` nor ``RUSAGE_CHILDREN`` (the largest finished child alone, and
with ``vfork`` it starts at the parent's size) says what the machine had to hold at once, which
is what an OOM kill answers to. :class:`TreeWatch` samples it from /proc in a daemon thread:
at each look, this process's RSS plus, for every descendant alive, its own high-water mark so
far (``VmHWM``: a child's peak between two looks is not missed). The watch's peak is the largest
such sum, and never below this process's own ``VmHWM``.

One watch runs per build: :func:`start_watch` (the pre-check starts it, before the model first
runs) replaces any earlier one; :func:`stop_watch` ends it. A watch also ends by itself once the
object it was started for (the build's log) is gone, so a build that failed leaves no thread
sampling behind. Linux only: elsewhere the figures are this process's own.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

INTERVAL_S = 0.1
"""Seconds between two looks at the tree."""
SETTLE_S = 0.05
"""A child younger than this is not counted yet: between ``fork``/``vfork`` and ``exec`` it shows
this process's own pages, which would count them twice."""
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _status(pid: int | str) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in bytes ({} once it is gone or without /proc)."""
    found = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found[line[:5]] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


def descendants(root: int) -> dict[int, float]:
    """Every process under ``root`` now (children, their children...) and its age in seconds,
    from /proc/PID/stat."""
    children: dict[int, list[tuple[int, int]]] = {}
    try:
        entries = os.listdir("/proc")
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()  # fields[1]: the parent; fields[19]: start time
            children.setdefault(int(fields[1]), []).append((int(entry), int(fields[19])))
        except (OSError, ValueError, IndexError):
            continue
    found: dict[int, float] = {}
    frontier = [root]
    while frontier:
        for child, started in children.get(frontier.pop(), []):
            found[child] = uptime - started / _TICKS
            frontier.append(child)
    return found


@dataclass
class TreePeak:
    """What a watch saw (bytes): the tree's peak, this process's part of it and its children's."""

    tree: int = 0  # this process's RSS plus each live child's VmHWM, at the largest look
    own: int = 0  # this process's RSS at that look
    children: int = 0  # the children's part at that look
    largest_child: int = 0  # the largest VmHWM any one child reached


class TreeWatch:
    """Samples this process's tree every :data:`INTERVAL_S` in a daemon thread (see the module doc)."""

    def __init__(self, owner: object | None = None, interval: float = INTERVAL_S):
        """A watch (not started) that ends by itself once ``owner`` is gone (None: only by :meth:`stop`)."""
        self._peak = TreePeak()
        self._hwm: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            self._owner = weakref.ref(owner) if owner is not None else None
        except TypeError:  # an owner that takes no weak reference: the watch ends with stop() only
            self._owner = None
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="edgekit-tree-watch", daemon=True)

    def start(self) -> TreeWatch:
        """Begin sampling (one look now, so the figure is never empty)."""
        self.look()
        self._thread.start()
        return self

    def stop(self) -> TreePeak:
        """End sampling (one last look) and return the peak."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self.look()
        return self.peak()

    def _run(self) -> None:
        """The thread: a look every interval until stopped or the owner is gone."""
        while not self._stop.wait(self._interval):
            if self._owner is not None and self._owner() is None:
                return  # the build it watched is gone (a failure unwound it)
            self.look()

    def look(self) -> None:
        """One look at the tree now."""
        own = _status("self").get("VmRSS", 0)
        children = 0
        for pid, age in descendants(os.getpid()).items():
            hwm = _status(pid).get("VmHWM", 0) if age >= SETTLE_S else 0
            if hwm:
                self._hwm[pid] = max(self._hwm.get(pid, 0), hwm)
                children += self._hwm[pid]
        with self._lock:
            if own + children > self._peak.tree:
                self._peak.tree, self._peak.own, self._peak.children = own + children, own, children
            self._peak.largest_child = max([self._peak.largest_child, *self._hwm.values()])

    def peak(self) -> TreePeak:
        """The peak so far; the tree figure never below this process's own ``VmHWM``."""
        own_hwm = _status("self").get("VmHWM", 0)
        with self._lock:
            p = TreePeak(**vars(self._peak))
        if own_hwm > p.tree:
            p.tree, p.own, p.children = own_hwm, own_hwm, 0
        return p


_WATCH: list[TreeWatch] = []


def start_watch(owner: object | None = None) -> TreeWatch | None:
    """Start the build's watch (ending any earlier one); None where there is no /proc."""
    stop_watch()
    if not Path("/proc/self/status").exists():
        return None
    _WATCH.append(TreeWatch(owner).start())
    return _WATCH[-1]


def current_watch() -> TreeWatch | None:
    """The running watch, or None."""
    return _WATCH[-1] if _WATCH else None


def stop_watch() -> TreePeak | None:
    """End the running watch and return its peak (None when none ran)."""
    if not _WATCH:
        return None
    return _WATCH.pop().stop()
