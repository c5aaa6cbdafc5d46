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
  body over ``max_body_bytes`` gets ``413``; framing two parsers could read two ways gets
  ``400`` (``411`` for Transfer-Encoding alone; :func:`~edgekit.serve.http.wire.request_framing`);
  ``Expect: 100-continue`` is answered ``100 Continue`` when the body may come, else refused
  (``413``, ``417``); a client that hangs up is a DEBUG line;
- an exception while serving one connection (a bug, whatever the request) closes that
  connection only, is counted (``internal``) and logged in one line: the loop goes on. Its
  health (:class:`~edgekit.serve.http.health.ServerHealth`: a heartbeat, why it stopped, the
  requests the workers hold) is ``health.problem()``.

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

from edgekit.serve.http.conn import READ_CHUNK, Conn, hang_up
from edgekit.serve.http.health import ServerHealth
from edgekit.serve.http.wire import (
    EXPECT_CONTINUE,
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    answer_bytes,
    buffered,
    canned,
    is_loopback,
    request_framing,
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
# malformed: framing refused (400, 411, 417); internal: a connection closed on an exception in
# the I/O thread; handler: a handler or quick answer raised (500)
COUNTS = ("accepted", "answered", "refused", "evicted", "timed_out", "too_large", "malformed", "internal", "handler")


class BoundedHTTPServer:
    """Serve ``handler`` (a BaseHTTPRequestHandler subclass) on ``(host, port)``.

    ``serve_forever()`` runs the selector loop until ``shutdown()``; ``server_close()``
    releases the port and every open connection. ``server_address`` is where it listens;
    ``counts`` says how many connections were accepted, answered, refused (per-peer cap or
    full), evicted (``max_connections``), timed out, sent a request too large or malformed, were
    closed on an exception (``internal``) or answered 500 by a failing handler (``handler``);
    ``health`` whether the loop still serves.
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
        self._reading: OrderedDict[socket.socket, Conn] = OrderedDict()  # oldest first
        self._others: dict[socket.socket, Conn] = {}  # with a worker or being written
        self._peers: Counter[str] = Counter()
        self._done: queue.SimpleQueue[tuple[Conn, bytes]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._next_expiry = 0.0
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self.health = ServerHealth()

    @property
    def open_connections(self) -> int:
        """Connections open now (reading, being answered or written)."""
        return len(self._reading) + len(self._others)

    # ------------------------------------------------------------------ the selector loop
    def serve_forever(self, poll_interval: float = 0.05) -> None:
        """Accept, read requests, dispatch whole ones, write answers; until :meth:`shutdown`."""
        self._stopped.clear()
        self.health.started()
        failure: BaseException | None = None
        try:
            self._selector.register(self.socket, selectors.EVENT_READ)
            self._selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _events in self._selector.select(poll_interval):
                    self._event(key)
                now = time.monotonic()
                self._expire(now)
                self.health.turned(now)
        except BaseException as exc:  # noqa: BLE001 - what stopped the loop is the endpoint's health
            failure = exc
            log.error("the HTTP endpoint stopped serving: %s: %s", type(exc).__name__, exc)
            log.debug("the HTTP endpoint's I/O loop failed", exc_info=True)  # the thread ends: health says why
        finally:
            for fileobj in (self.socket, self._wake_r):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(fileobj)
            self.health.stopped(failure)
            self._stopped.set()

    def _event(self, key: selectors.SelectorKey) -> None:
        """One ready file: the listening socket, the workers' wake-up or a client connection."""
        if key.fileobj is self.socket:
            self._guarded(None, self._accept)
        elif key.fileobj is self._wake_r:
            self._guarded(None, self._collect)
        elif key.data.phase == "write":
            self._guarded(key.data, self._send, key.data)
        elif key.data.phase == "read":
            self._guarded(key.data, self._read, key.data)

    def _guarded(self, conn: Conn | None, step: Callable[..., object], *args: object) -> None:
        """Run one step of the loop; an exception closes ``conn`` only (a bug must not take every
        client's endpoint with it), counted as ``internal`` and logged in one line."""
        try:
            step(*args)
        except Exception as exc:
            self.counts["internal"] += 1
            log.warning("http: %s while serving %s: %s (that connection is closed; the endpoint goes on)",
                        type(exc).__name__, conn.peer if conn is not None else "the server", exc)
            log.debug("http step failed", exc_info=True)
            if conn is not None:
                with contextlib.suppress(Exception):
                    self._close(conn)

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
            conn = Conn(sock, addr, time.monotonic() + self.idle_timeout_s)
            self._peers[peer] += 1
            self._reading[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        """503 and close, before reading anything: one short send fits an empty socket buffer."""
        self.counts["refused"] += 1
        log.debug("http connection refused: %s", why)
        with contextlib.suppress(OSError):
            sock.send(canned(503, why))
        hang_up(sock, drain=True)

    def _read(self, conn: Conn) -> None:
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
        status, length, why = request_framing(conn.buf, self.max_head_bytes, self.max_body_bytes)
        if status == 200:
            conn.unread = len(conn.buf) > length
            self._dispatch(conn, bytes(conn.buf[:length]))
        elif status == 100:  # the client waits for a go-ahead before its body: one short send, once
            if not conn.continued and request_line(conn.buf)[2] == "HTTP/1.1":
                conn.continued = True
                with contextlib.suppress(OSError):
                    conn.sock.send(EXPECT_CONTINUE)
        elif status:
            self.counts["too_large" if status in (413, 414, 431) else "malformed"] += 1
            conn.unread = True
            self._selector.unregister(conn.sock)
            self._write(conn, canned(status, why))

    def _dispatch(self, conn: Conn, request: bytes) -> None:
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
        now = time.monotonic()
        self.health.job_queued(id(conn), now)
        try:
            self._pool.submit(self._work, conn, request, now)
        except RuntimeError:  # the pool is shut down: we are stopping
            self.health.job_done(id(conn))
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
                self._guarded(conn, self._write, conn, answer)
            else:  # the handler answered nothing (an empty request line): just close
                self._guarded(conn, self._close, conn)

    def _write(self, conn: Conn, answer: bytes) -> None:
        """Write ``answer`` (the connection is registered with the selector for nothing): at once
        when the socket takes it all (the usual case), else as the client reads, by the deadline."""
        self._reading.pop(conn.sock, None)
        self._others[conn.sock] = conn
        conn.phase, conn.out = "busy", memoryview(answer)
        if self._send(conn):
            conn.phase = "write"
            conn.deadline = time.monotonic() + self.timeout_s
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)

    def _send(self, conn: Conn) -> bool:
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
                self._guarded(conn, self._time_out, conn)

    def _time_out(self, conn: Conn) -> None:
        self.counts["timed_out"] += 1
        if conn.phase == "write":  # a reset frees the answer the kernel still holds for it
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        what = "an answer not taken" if conn.phase == "write" else "no whole request"
        self._close(conn, f"{what} within the deadline")

    def _close(self, conn: Conn, why: str = "") -> None:
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
        hang_up(conn.sock, drain=conn.unread)

    # ------------------------------------------------------------------ a worker
    def _answer(self, conn: Conn, request: bytes, received_at: float) -> bytes:
        try:
            return self._handler((request, received_at), conn.addr, self).wfile.getvalue()
        except Exception as exc:  # a bug in a handler: one log line, a 500, the server keeps going
            return self._handler_failed(f"http request from {conn.peer}", exc)

    def _quick(self, conn: Conn, path: str, body: bool) -> bytes:
        try:
            status, content_type, payload = self.quick_answers[path]()
        except Exception as exc:  # a bug in a callback: one log line, a 500, the server keeps going
            return self._handler_failed(f"http {path} from {conn.peer}", exc)
        return answer_bytes(status, content_type, payload, body)

    def _handler_failed(self, what: str, exc: Exception) -> bytes:
        """A handler's exception: counted, one WARNING line (the traceback at DEBUG), a 500."""
        self.counts["handler"] += 1
        log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
        log.debug("%s failed", what, exc_info=True)
        return canned(500, "internal error")

    def _work(self, conn: Conn, request: bytes, received_at: float) -> None:
        try:
            self._done.put((conn, self._answer(conn, request, received_at)))
        finally:
            self.health.job_done(id(conn))
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
