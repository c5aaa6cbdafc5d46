"""Build logging: every step timed, written to the console and to the bundle's build.log."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM stopped the build (``signum``: the CLI exits 128 + signum, as a shell reports it).

    A KeyboardInterrupt, so everything that cleans up after Ctrl-C cleans up after it too.
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class BuildLog:
    """Collects timestamped lines; echoes them to stderr unless ``quiet``."""

    def __init__(self, quiet: bool = False):
        self.lines: list[str] = []
        self.quiet = quiet
        self.t0 = time.perf_counter()
        self.interrupted = False
        self.signum: int | None = None  # SIGTERM's number when it was SIGTERM

    def check(self) -> None:
        """Raise KeyboardInterrupt if Ctrl-C (or Terminated if SIGTERM) arrived (see :func:`interruptible`)."""
        if self.interrupted:
            raise Terminated(self.signum) if self.signum else KeyboardInterrupt

    def info(self, msg: str) -> None:
        """Record a line and show it."""
        line = f"[{time.perf_counter() - self.t0:7.2f}s] {msg}"
        self.lines.append(line)
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def record(self, text: str, prefix: str = "") -> None:
        """Add a tool's own output to the build log only (never the console): one line per line."""
        stamp = f"[{time.perf_counter() - self.t0:7.2f}s] {prefix}"
        self.lines.extend(stamp + line.rstrip() for line in text.splitlines() if line.strip())

    def warn(self, msg: str) -> None:
        """Record and show a warning."""
        self.info(f"WARNING: {msg}")

    @contextmanager
    def step(self, name: str) -> Iterator[dict]:
        """Time a step: ``with log.step("convert fp32") as s: ...``; ``s["seconds"]`` afterwards,
        and ``s["peak_rss"]``, the process's peak resident memory so far (bytes), which the
        log line shows too."""
        from edgekit.builders.host.resources import GB, peak_rss

        info: dict = {}
        self.check()
        t = time.perf_counter()
        self.info(f"{name} ...")
        try:
            yield info
        finally:
            info["seconds"] = round(time.perf_counter() - t, 3)
            info["peak_rss"] = peak_rss()
        self.check()
        self.info(f"{name}: done in {info['seconds']:.2f}s (peak RSS so far {info['peak_rss'] / GB:.2f} GB)")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@contextmanager
def interruptible(log: BuildLog) -> Iterator[None]:
    """Turn Ctrl-C and SIGTERM into a flag checked between build steps.

    A KeyboardInterrupt raised inside TensorFlow's C++ wrappers can land in a ``__del__`` and be
    swallowed ("Exception ignored in ... UniquePtr.__del__"), after which the build would go on
    and write bundles. The flag is checked at every step boundary instead; a second signal
    interrupts at once. SIGTERM (``timeout``, ``kill``, systemd, a CI runner) cleans up as
    Ctrl-C does: its default action would leave the temporary bundle and work directories.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, frame):
        term = signum == signal.SIGTERM
        if log.interrupted:
            raise Terminated(signum) if term else KeyboardInterrupt
        log.interrupted, log.signum = True, (signum if term else None)
        again = "send SIGTERM again" if term else "Ctrl-C again"
        print(f"{'terminated' if term else 'interrupt'}: stopping after the current step ({again} to stop now)",
              file=sys.stderr, flush=True)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def progress(iterable, desc: str, total: int | None = None):
    """A tqdm progress bar on stderr when tqdm is installed (it is in the build extra)."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return iterable
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, leave=False, mininterval=0.2,
                disable=None, dynamic_ncols=True)
