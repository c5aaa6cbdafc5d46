"""A small HTTP server that no client can starve: whole-request deadlines, a per-peer cap.

``http.server.ThreadingHTTPServer`` starts one thread per connection and reads from the
socket inside it: a client that sends one byte a second holds that thread as long as it
likes, and a handful of them starve every other client (a thread pool only moves the limit).
This server keeps ``BaseHTTPRequestHandler`` (the HTTP parsing) but never lets a handler
touch a socket:

- one selector thread accepts connections and reads each request, non-blocking, into a
  buffer until its head (and a body of at most ``max_body_bytes``) is complete. The whole
  request must arrive within ``timeout_s`` of its first byte and within ``idle_timeout_s``
  of the connection being accepted, however the bytes trickle in; past that the connection
  is closed. A slow or idle client costs a file descriptor and a buffer, never a thread;
- only a complete request goes to a worker, which runs the handler on the buffered bytes and
  hands the answer back as bytes: a worker's time is CPU time, whatever the network does.
  ``priority_paths`` (``/healthz``) are answered at once by the selector thread itself, so
  a probe never queues behind scrapes (their handler must be quick and never block); a path
  in ``quick_answers`` is answered there by its function, without the handler's parsing
  (about 30 us instead of 200: a burst of probes costs little);
- the selector thread writes answers, non-blocking, within ``timeout_s`` in all;
- at most ``max_per_peer`` connections per client address (loopback, i.e. the device itself,
  is not capped unless ``cap_loopback``): the next one gets ``503`` and is closed; at most
  ``max_connections`` in all: beyond it the oldest connection still sending its request is
  closed (a scrape sends its request at once, so it is never the oldest for long);
- a request head over ``max_head_bytes`` gets ``431`` (``414`` for a request line alone), a
  body over ``max_body_bytes`` gets ``413``; a client that hangs up is a DEBUG line.

Threads: 1 + ``workers``, whatever the number of clients.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler

from edgekit.serve.httpwire import (
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    answer_bytes,
    buffered,
    canned,
    is_loopback,
    request_length,
    request_line,
)

log = logging.getLogger("edgekit.serve")

BACKLOG = 1024  # a burst of connections waits in the kernel (the OS caps it: somaxconn) instead of a 1 s SYN retry
WORKERS = 2  # handlers run at once: they only use CPU (under the GIL), so more would only contend
TIMEOUT_S = 5.0  # a started request must arrive whole within this; an answer must be written within this
IDLE_TIMEOUT_S = 10.0  # a connection must have sent a whole request within this of being accepted
MAX_CONNECTIONS = 512  # connections open at once; the oldest one still sending is closed beyond this
MAX_PER_PEER = 32  # connections open at once from one address (not loopback): a scraper needs 1
PRIORITY_PATHS = ("/healthz",)
COUNTS = ("accepted", "answered", "refused", "evicted", "timed_out", "too_large")
READ_CHUNK = 65536


class _Conn:
    """One client connection: its socket, what it sent so far, its deadline and phase."""

    __slots__ = ("sock", "addr", "peer", "buf", "deadline", "out", "phase", "unread")

    def __init__(self, sock: socket.socket, addr: tuple, deadline: float):
        self.sock, self.addr, self.peer = sock, addr, str(addr[0])
        self.buf = bytearray()
        self.deadline = deadline
        self.out = memoryview(b"")
        self.phase = "read"  # read -> busy (a worker has it) -> write -> closed
        self.unread = False  # the client sent more than the request we took: drain before closing


class BoundedHTTPServer:
    """Serve ``handler`` (a BaseHTTPRequestHandler subclass) on ``(host, port)``.

    ``serve_forever()`` runs the selector loop until ``shutdown()``; ``server_close()``
    releases the port and every open connection. ``server_address`` is where it listens;
    ``counts`` says how many connections were accepted, answered, refused (per-peer cap or
    full), evicted (``max_connections``), timed out, or sent a request too large.
    """

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 workers: int = WORKERS, timeout_s: float = TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, max_per_peer: int = MAX_PER_PEER,
                 cap_loopback: bool = False, max_head_bytes: int = MAX_HEAD_BYTES,
                 max_body_bytes: int = MAX_BODY_BYTES, priority_paths: tuple[str, ...] = PRIORITY_PATHS,
                 quick_answers: Mapping[str, Callable[[], tuple[int, str, bytes]]] | None = None,
                 backlog: int = BACKLOG):
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
        self._handler = buffered(handler)
        self.timeout_s, self.idle_timeout_s, self.max_connections = timeout_s, idle_timeout_s, max_connections
        self.max_per_peer, self.cap_loopback = max_per_peer, cap_loopback
        self.max_head_bytes, self.max_body_bytes = max_head_bytes, max_body_bytes
        self.priority_paths = tuple(priority_paths)
        self.quick_answers = dict(quick_answers or {})
        # every key from the start: another thread may copy it while this one counts
        self.counts: Counter[str] = Counter(dict.fromkeys(COUNTS, 0))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edgekit-http-worker")
        self._selector = selectors.DefaultSelector()
        self._reading: OrderedDict[socket.socket, _Conn] = OrderedDict()  # oldest first
        self._others: dict[socket.socket, _Conn] = {}  # with a worker or being written
        self._peers: Counter[str] = Counter()
        self._done: queue.SimpleQueue[tuple[_Conn, bytes]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._next_expiry = 0.0
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    @property
    def open_connections(self) -> int:
        """Connections open now (reading, being answered or written)."""
        return len(self._reading) + len(self._others)

    # ------------------------------------------------------------------ the selector loop
    def serve_forever(self, poll_interval: float = 0.05) -> None:
        """Accept, read requests, dispatch whole ones, write answers; until :meth:`shutdown`."""
        self._stopped.clear()
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _events in self._selector.select(poll_interval):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._collect()
                    elif key.data.phase == "write":
                        self._send(key.data)
                    elif key.data.phase == "read":
                        self._read(key.data)
                self._expire(time.monotonic())
        finally:
            for fileobj in (self.socket, self._wake_r):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(fileobj)
            self._stopped.set()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: drop this one, keep serving
                log.debug("http accept failed: %s", exc)
                return
            sock.setblocking(False)
            self.counts["accepted"] += 1
            peer = str(addr[0])
            if self._peers[peer] >= self.max_per_peer > 0 and (self.cap_loopback or not is_loopback(peer)):
                self._refuse(sock, f"too many connections from {peer} (at most {self.max_per_peer})")
                continue
            if len(self._reading) + len(self._others) >= self.max_connections:
                if not self._reading:  # every slot is being answered: nothing to evict
                    self._refuse(sock, "too many connections")
                    continue
                self.counts["evicted"] += 1
                self._close(next(iter(self._reading.values())), "evicted: too many connections")
            conn = _Conn(sock, addr, time.monotonic() + self.idle_timeout_s)
            self._peers[peer] += 1
            self._reading[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        """503 and close, before reading anything: one short send fits an empty socket buffer."""
        self.counts["refused"] += 1
        log.debug("http connection refused: %s", why)
        with contextlib.suppress(OSError):
            sock.send(canned(503, why))
        _hang_up(sock, drain=True)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(conn, f"read failed: {exc}")
            return
        if not chunk:
            self._close(conn, "hung up before a whole request")
            return
        if not conn.buf:  # the first byte starts the request's own deadline
            conn.deadline = min(conn.deadline, time.monotonic() + self.timeout_s)
        conn.buf += chunk
        status, length = request_length(conn.buf, self.max_head_bytes, self.max_body_bytes)
        if status == 200:
            conn.unread = len(conn.buf) > length
            self._dispatch(conn, bytes(conn.buf[:length]))
        elif status:
            self.counts["too_large"] += 1
            conn.unread = True
            self._selector.unregister(conn.sock)
            self._write(conn, canned(status, "request too large"))

    def _dispatch(self, conn: _Conn, request: bytes) -> None:
        self._selector.unregister(conn.sock)
        del self._reading[conn.sock]
        self._others[conn.sock] = conn
        conn.phase, conn.buf = "busy", bytearray()
        method, path, version = request_line(request)
        if method in ("GET", "HEAD") and version in ("HTTP/1.0", "HTTP/1.1"):
            if path in self.quick_answers:  # ahead of all queued, without the handler
                self._write(conn, self._quick(conn, path, method == "GET"))
                return
            if path in self.priority_paths:  # ahead of all queued
                self._write(conn, self._answer(conn, request, time.monotonic()))
                return
        try:
            self._pool.submit(self._work, conn, request, time.monotonic())
        except RuntimeError:  # the pool is shut down: we are stopping
            self._close(conn)

    def _collect(self) -> None:
        """Answers the workers finished: start writing each."""
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                conn, answer = self._done.get_nowait()
            except queue.Empty:
                return
            if conn.phase != "busy":
                continue
            if answer:
                self._write(conn, answer)
            else:  # the handler answered nothing (an empty request line): just close
                self._close(conn)

    def _write(self, conn: _Conn, answer: bytes) -> None:
        """Write ``answer`` (the connection is registered with the selector for nothing): at once
        when the socket takes it all (the usual case), else as the client reads, by the deadline."""
        self._reading.pop(conn.sock, None)
        self._others[conn.sock] = conn
        conn.phase, conn.out = "busy", memoryview(answer)
        if self._send(conn):
            conn.phase = "write"
            conn.deadline = time.monotonic() + self.timeout_s
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)

    def _send(self, conn: _Conn) -> bool:
        """Send what the socket takes now; whether some of the answer is left."""
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            self._close(conn, f"went away: {exc}")
            return False
        conn.out = conn.out[sent:]
        if conn.out:
            return True
        self.counts["answered"] += 1
        self._close(conn)
        return False

    def _expire(self, now: float) -> None:
        if now < self._next_expiry:
            return
        self._next_expiry = now + 0.05
        for conn in [c for c in (*self._reading.values(), *self._others.values()) if c.phase != "busy"]:
            if conn.deadline <= now:
                self.counts["timed_out"] += 1
                if conn.phase == "write":  # a reset frees the answer the kernel still holds for it
                    with contextlib.suppress(OSError):
                        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                what = "an answer not taken" if conn.phase == "write" else "no whole request"
                self._close(conn, f"{what} within the deadline")

    def _close(self, conn: _Conn, why: str = "") -> None:
        if conn.phase == "closed":
            return
        if conn.phase in ("read", "write"):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.phase = "closed"
        self._reading.pop(conn.sock, None)
        self._others.pop(conn.sock, None)
        self._peers[conn.peer] -= 1
        if self._peers[conn.peer] <= 0:
            del self._peers[conn.peer]
        if why:
            log.debug("http client %s: %s", conn.peer, why)
        _hang_up(conn.sock, drain=conn.unread)

    # ------------------------------------------------------------------ a worker
    def _answer(self, conn: _Conn, request: bytes, received_at: float) -> bytes:
        try:
            return self._handler((request, received_at), conn.addr, self).wfile.getvalue()
        except Exception:  # a bug in a handler: one log entry, a 500, the server keeps going
            log.exception("http request from %s failed", conn.peer)
            return canned(500, "internal error")

    def _quick(self, conn: _Conn, path: str, body: bool) -> bytes:
        try:
            status, content_type, payload = self.quick_answers[path]()
        except Exception:  # a bug in a callback: one log entry, a 500, the server keeps going
            log.exception("http %s from %s failed", path, conn.peer)
            return canned(500, "internal error")
        return answer_bytes(status, content_type, payload, body)

    def _work(self, conn: _Conn, request: bytes, received_at: float) -> None:
        self._done.put((conn, self._answer(conn, request, received_at)))
        with contextlib.suppress(OSError):  # a full wake-up pipe already wakes the loop
            self._wake_w.send(b"\0")

    # ------------------------------------------------------------------ life cycle
    def shutdown(self) -> None:
        """Stop the loop and wait for it (like socketserver's)."""
        self._stop.set()
        self._stopped.wait(5)

    def server_close(self) -> None:
        """Close the listening socket, every connection and the workers."""
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for conn in [*self._reading.values(), *self._others.values()]:
            self._close(conn)
        self._selector.close()
        self.socket.close()
        self._wake_r.close()
        self._wake_w.close()


def _hang_up(sock: socket.socket, drain: bool) -> None:
    """Close; with ``drain``, first drop what the client sent that we did not read (closing
    with unread bytes sends a reset, which can destroy the answer before the client reads it)."""
    if drain:
        with contextlib.suppress(OSError):
            for _ in range(4):
                if not sock.recv(READ_CHUNK):
                    break
    sock.close()
