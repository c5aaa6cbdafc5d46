"""A small HTTP server that stays up under load: real backlog, socket timeouts, a thread cap.

``http.server.ThreadingHTTPServer`` starts one thread per accepted connection, with a
listen backlog of 5 and no socket timeout: 200 concurrent scrapers overflow the backlog,
every idle connection pins a thread forever, and a client that hangs up early prints a
BrokenPipeError traceback. This server keeps ``BaseHTTPRequestHandler`` (the HTTP parsing)
and replaces the connection handling:

- one selector thread accepts connections and watches them until their first bytes arrive:
  an idle connection costs a file descriptor, not a thread, and is closed after
  ``idle_timeout_s`` (the oldest one is closed first when ``max_connections`` are open);
- a connection with data is handed to a fixed pool of ``workers`` threads, whose socket
  reads and writes time out after ``timeout_s`` (a client that trickles bytes cannot hold a
  worker for longer);
- a client that hangs up or times out is a DEBUG line, never a traceback.

Threads: 1 + ``workers``, whatever the number of clients.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler

log = logging.getLogger("edgekit.serve")

BACKLOG = 128  # a burst of scrapers waits in the kernel instead of being refused
WORKERS = 4  # requests answered at once (each /metrics takes about a millisecond)
TIMEOUT_S = 5.0  # a started request must be read and answered within this (per socket operation)
IDLE_TIMEOUT_S = 10.0  # a connection that sends nothing is closed after this
MAX_CONNECTIONS = 512  # connections open at once; the oldest idle one is closed beyond this
QUIET_ERRORS = (ConnectionError, TimeoutError)  # the client went away: not our fault, not a traceback


class BoundedHTTPServer:
    """Serve ``handler`` (a BaseHTTPRequestHandler subclass) on ``(host, port)``.

    ``serve_forever()`` runs the selector loop until ``shutdown()``; ``server_close()``
    releases the port and every open connection. ``server_address`` is where it listens.
    """

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 workers: int = WORKERS, timeout_s: float = TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, backlog: int = BACKLOG):
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(backlog)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.handler = handler
        self.timeout_s, self.idle_timeout_s, self.max_connections = timeout_s, idle_timeout_s, max_connections
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgekit-http-worker")
        self._selector = selectors.DefaultSelector()
        self._idle: OrderedDict[socket.socket, tuple[float, object]] = OrderedDict()  # oldest first
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    # ------------------------------------------------------------------ the selector loop
    def serve_forever(self, poll_interval: float = 0.05) -> None:
        """Accept, watch idle connections, dispatch readable ones; until :meth:`shutdown`."""
        self._stopped.clear()
        self._selector.register(self.socket, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(poll_interval):
                    if key.fileobj is self.socket:
                        self._accept()
                    else:
                        self._dispatch(key.fileobj)
                self._expire(time.monotonic())
        finally:
            self._selector.unregister(self.socket)
            self._stopped.set()

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: drop this one, keep serving
                log.debug("http accept failed: %s", exc)
                return
            if len(self._idle) >= self.max_connections:
                oldest = next(iter(self._idle))
                self._forget(oldest)
                oldest.close()
            conn.setblocking(False)
            self._idle[conn] = (time.monotonic() + self.idle_timeout_s, addr)
            self._selector.register(conn, selectors.EVENT_READ)

    def _dispatch(self, conn: socket.socket) -> None:
        _, addr = self._forget(conn)
        conn.setblocking(True)
        conn.settimeout(self.timeout_s)
        try:
            self._pool.submit(self._handle, conn, addr)
        except RuntimeError:  # the pool is shut down: we are stopping
            conn.close()

    def _expire(self, now: float) -> None:
        while self._idle:
            conn, (deadline, _addr) = next(iter(self._idle.items()))
            if deadline > now:
                return
            self._forget(conn)
            conn.close()

    def _forget(self, conn: socket.socket) -> tuple[float, object]:
        self._selector.unregister(conn)
        return self._idle.pop(conn)

    # ------------------------------------------------------------------ a worker
    def _handle(self, conn: socket.socket, addr: object) -> None:
        try:
            self.handler(conn, addr, self)
        except QUIET_ERRORS as exc:
            log.debug("http client %s went away: %s", addr, exc)
        except Exception:  # a bug in a handler: one log entry, the server keeps going
            log.exception("http request from %s failed", addr)
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            conn.close()

    # ------------------------------------------------------------------ life cycle
    def shutdown(self) -> None:
        """Stop the loop and wait for it (like socketserver's)."""
        self._stop.set()
        self._stopped.wait(5)

    def server_close(self) -> None:
        """Close the listening socket, idle connections and the worker pool."""
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for conn in list(self._idle):
            self._idle.pop(conn)
            conn.close()
        self._selector.close()
        self.socket.close()
