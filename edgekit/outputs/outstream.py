"""Results written to stdout that cannot be written: one error line, not a traceback or a silent exit 0.

``edgekit run --json > results.jsonl`` on a full disk raised ``OSError: [Errno 28]`` out of a
``write``; ``edgekit bench --json > report.json`` exited 0 with the file cut off, the failure
left to the flush at interpreter exit, which Python reports as "Exception ignored" or not at
all. :func:`guarded_stdout` makes every write and flush of stdout raise :class:`OutputError`
instead, flushes before it returns, and after a failure points file descriptor 1 at
``/dev/null`` so the exit-time flush of what is still buffered cannot fail again. A reader that
went away (``| head``) is still a ``BrokenPipeError``, which the CLI treats as a normal end.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any

from edgekit.errors import OutputError  # exit 1: the command was right, the disk was not

__all__ = ["OutputError", "guarded_stdout"]


class _Guarded:
    """A text stream whose write/flush failures (other than a broken pipe) are OutputError."""

    def __init__(self, stream: Any):
        self._stream = stream

    def _call(self, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            name = getattr(self._stream, "name", "<stdout>")
            where = "standard output" if name in ("<stdout>", 1) else f"standard output ({name})"
            raise OutputError(f"cannot write to {where}: {exc.strerror or exc}",
                              "free some space where the output is redirected, or redirect it elsewhere") from exc

    def write(self, text: str) -> int:
        raw = getattr(self._stream, "buffer", None)
        if isinstance(raw, io.RawIOBase):  # PYTHONUNBUFFERED=1 (Docker images, systemd units): see _write_raw
            self._call(self._stream.flush)
            return self._call(self._write_raw, raw, text)
        return self._call(self._stream.write, text)

    def flush(self) -> None:
        self._call(self._stream.flush)

    def _write_raw(self, raw: io.RawIOBase, text: str) -> int:
        """Under PYTHONUNBUFFERED the text layer writes straight to the file and ignores a short
        write: on a full disk the output was cut off without an error. Write until done, so the
        next write after a short one raises ENOSPC."""
        data = memoryview(text.encode(self._stream.encoding or "utf-8", self._stream.errors or "strict"))
        while data:
            n = raw.write(data)
            data = data[n or 0:]
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """Within the block, ``sys.stdout`` failures are :class:`OutputError`; stdout is flushed at the end."""
    original = sys.stdout
    # a closed stdout (`>&-`, some service managers) is None in Python: the results go nowhere
    stream = original if original is not None else open(os.devnull, "w")  # noqa: SIM115 - closed below
    sys.stdout = _Guarded(stream)  # type: ignore[assignment]
    try:
        yield
        sys.stdout.flush()
    except OutputError:
        discard(stream)
        raise
    finally:
        sys.stdout = original
        if stream is not original:
            stream.close()


def discard_stdout() -> None:
    """Send the rest of stdout nowhere (its reader left, or it cannot be written)."""
    stream = sys.stdout
    discard(getattr(stream, "_stream", stream))


def discard(stream: Any) -> None:
    """Point the stream's file descriptor at /dev/null: what is still buffered goes nowhere, quietly."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no real descriptor (a test's capture)
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
