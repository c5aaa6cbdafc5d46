"""Keep library chatter off the user's screen, and load OpenCV only where it is used.

Native libraries print from C/C++ straight to file descriptor 2, past Python's logging:

- LiteRT's ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`` comes from TFLite's
  ``MinimalLogger``, which ``fprintf``\\ s to stderr at INFO in release builds and has no
  environment switch (``TF_CPP_MIN_LOG_LEVEL`` does not reach it; the severity can only be set
  from C++, ``tflite/minimal_logging.cc``). :func:`native_stderr_to_log` redirects fd 2 to a
  temporary file for the few milliseconds of interpreter creation and logs what was caught:
  INFO lines at DEBUG, anything else at WARNING (so a real error is still seen).
- OpenCV's ``[ WARN:0@...]`` lines (a camera that does not open, a stream that drops): OpenCV
  has its own log level; :func:`import_cv2` sets it to ERROR unless edgekit logs at DEBUG
  (``-vv``) or the user set ``OPENCV_LOG_LEVEL`` themselves.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from edgekit.errors import BackendUnavailable

OPENCV_HINT = "pip install 'edgekit-vision[opencv]' (or opencv-python-headless)"


@functools.lru_cache(maxsize=1)  # a failed import searches sys.path again each time: ask once
def optional_cv2() -> Any | None:
    """OpenCV when it is installed (quieted, see :func:`import_cv2`), else None."""
    try:
        return import_cv2("")
    except BackendUnavailable:
        return None


def import_cv2(needed_for: str = "this") -> Any:
    """Import OpenCV, with its own warnings at ERROR unless edgekit logs at DEBUG.

    Raises:
        BackendUnavailable: OpenCV is not installed; the hint names the extra.
    """
    first = "cv2" not in sys.modules
    try:
        import cv2
    except ImportError as exc:
        raise BackendUnavailable(f"{needed_for} needs OpenCV, which is not installed", OPENCV_HINT) from exc
    if first and "OPENCV_LOG_LEVEL" not in os.environ:
        debugging = logging.getLogger("edgekit").isEnabledFor(logging.DEBUG)
        with contextlib.suppress(AttributeError):  # very old builds lack cv2.utils.logging
            cv2.utils.logging.setLogLevel(
                cv2.utils.logging.LOG_LEVEL_WARNING if debugging else cv2.utils.logging.LOG_LEVEL_ERROR
            )
    return cv2


def tflite_level(line: str) -> int:
    """LiteRT's own lines: ``INFO:`` at DEBUG, anything else at WARNING (a real error is seen)."""
    return logging.DEBUG if line.startswith("INFO:") else logging.WARNING


_NATIVE_ERROR = re.compile(r"^(E\d{4}|F\d{4}|ERROR|Error|error:|Traceback|Fatal|Check failed)|(Error|Exception):")


def converter_level(line: str) -> int:
    """TensorFlow converter chatter (``fully_quantize: 0, inference_type: 6 ...``, MLIR and absl
    notes) at DEBUG; lines that look like an error or a failed check at WARNING."""
    return logging.WARNING if _NATIVE_ERROR.search(line) else logging.DEBUG


@contextlib.contextmanager
def native_stderr_to_log(logger: logging.Logger, level_of: Callable[[str], int] = tflite_level) -> Iterator[None]:
    """Catch what native code writes to fd 2 inside the block and log it instead, each line at
    the level ``level_of`` gives it.

    Keep the block short: for its duration every write to fd 2 in the process is caught, and
    re-logged line by line when it ends. Python's ``sys.stderr`` is flushed first so nothing
    written before the block is caught, and the logging handlers that write to fd 2 are held
    for the block, so another thread's log line waits a moment instead of being caught and
    re-logged as a WARNING with a second timestamp (the daemon logs from several threads).
    """
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all (a daemonised process): nothing to catch
        yield
        return
    sys.stderr.flush()
    held = _stderr_handlers()
    for handler in held:  # RLocks: this thread may still log (that line is caught, as before)
        handler.acquire()
    previous, python_side = sys.stderr, _python_stderr(saved)
    try:
        with tempfile.TemporaryFile() as caught:
            os.dup2(caught.fileno(), 2)
            sys.stderr = python_side or previous  # our own prints (a progress bar) still reach the screen
            try:
                yield
            finally:
                sys.stderr = previous
                if python_side is not None:
                    python_side.flush()
                os.dup2(saved, 2)
                os.close(saved)
                caught.seek(0)
                text = caught.read().decode("utf-8", "replace")
    finally:
        for handler in reversed(held):
            handler.release()
    for line in text.splitlines():
        if line.strip():
            logger.log(level_of(line), "%s", line)


def _python_stderr(saved_fd: int) -> Any:
    """A text stream on the real stderr (``saved_fd``) for Python's own writes while fd 2 is
    caught; None when ``sys.stderr`` is not fd 2 anyway (a test's capture, a log file)."""
    try:
        if sys.stderr.fileno() != 2:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    return open(saved_fd, "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",  # noqa: SIM115
                errors="backslashreplace", closefd=False)


def _stderr_handlers() -> list[logging.Handler]:
    """Every logging handler whose stream is fd 2, each once, in a fixed order (so two threads
    holding them never wait on each other crosswise)."""
    loggers = [logging.getLogger(), *(x for x in logging.Logger.manager.loggerDict.values()
                                      if isinstance(x, logging.Logger))]
    found: dict[int, logging.Handler] = {}
    for lg in loggers:
        for handler in lg.handlers:
            stream = getattr(handler, "stream", None)
            try:
                to_fd2 = stream is not None and stream.fileno() == 2
            except (AttributeError, OSError, ValueError):  # a StringIO, a closed stream: not fd 2
                to_fd2 = False
            if to_fd2:
                found[id(handler)] = handler
    return [found[k] for k in sorted(found)]


def litert_interpreter(**kwargs: Any) -> Any:
    """``ai_edge_litert``'s Interpreter made with LiteRT's native lines logged (INFO at DEBUG), not
    printed: the build makes many, and each printed "INFO: Created TensorFlow Lite XNNPACK delegate
    for CPU." mid-build."""
    from ai_edge_litert.interpreter import Interpreter

    with native_stderr_to_log(logging.getLogger("edgekit.builders.native")):
        return Interpreter(**kwargs)
