"""The bounded HTTP server against real sockets: whole-request deadlines, the per-peer cap,
/healthz ahead of busy workers, answers written by a deadline, and request framing; then slow
clients against a running daemon's endpoint.

``benchmarks/http_slow_clients.py`` measures 300 slow clients and bursts of 200 scrapes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest

from edgekit.serve.daemon import Daemon
from edgekit.serve.http.server import BoundedHTTPServer
from edgekit.serve.http.wire import request_length
from tests.helpers.sockets import read_all
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon import LABELS, make_config, real_runtime, running

BIG = b"x" * (32 << 20)  # more than any socket buffer takes: the client must read it


def handler_class(release: threading.Event | None = None):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path == "/block":  # holds its worker until the test releases it
                release.wait(30)
            if self.path == "/boom":
                raise RuntimeError("a bug in a handler")
            body = BIG if self.path == "/big" else f"ok {self.path}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


@contextmanager
def serving(handler=None, **options):
    server = BoundedHTTPServer(("127.0.0.1", 0), handler or handler_class(), **options)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def exchange(address, data: bytes = b"GET /x HTTP/1.0\r\n\r\n", timeout: float = 10.0) -> bytes:
    with socket.create_connection(address, timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the server answered and closed before taking it all
            sock.sendall(data)
        return read_all(sock)


def test_request_framing():
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    assert request_length(head) == (200, len(head))
    assert request_length(head[:-2]) == (0, 0)  # the blank line is still missing
    assert request_length(b"GET / HTTP/1.0\n\n") == (200, 16)  # bare newlines, as http.server accepts
    post = b"POST /reload HTTP/1.0\r\nContent-Length: 5\r\n\r\n"
    assert request_length(post + b"hel") == (0, 0)
    assert request_length(post + b"hello, and more") == (200, len(post) + 5)
    assert request_length(b"POST / HTTP/1.0\r\nContent-Length: -5\r\n\r\n") == (400, 0)  # not a length
    assert request_length(b"POST / HTTP/1.0\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n") == (413, 0)
    assert request_length(b"POST / HTTP/1.0\r\nContent-Length: 99999999999\r\n\r\n") == (413, 0)
    assert request_length(b"GET /" + b"a" * 20000) == (414, 0)
    assert request_length(b"GET / HTTP/1.0\r\nX: " + b"b" * 20000) == (431, 0)


def test_a_trickling_client_is_cut_off_by_the_whole_request_deadline():
    """A byte every 50 ms is never 0.3 s apart, yet the request must be whole within 0.3 s."""
    with serving(timeout_s=0.3) as server:
        sock = socket.create_connection(server.server_address, timeout=10)
        sent = 0
        try:
            sock.sendall(b"GET /met")
            while sent < 400:  # 20 s of trickling: far past the deadline
                sock.sendall(b"r")
                sent += 1
                time.sleep(0.05)
        except OSError:  # the server closed: a reset on our next byte
            pass
        finally:
            sock.close()
        assert sent < 400, "the trickling client was never cut off"
        wait_until(lambda: server.counts["timed_out"] == 1)
        assert b" 200 " in exchange(server.server_address)  # and the server still answers
        wait_until(lambda: server.open_connections == 0)  # nothing kept of either


def test_the_per_peer_cap_refuses_the_next_connection_with_503():
    with serving(max_per_peer=2, cap_loopback=True) as server:
        first = [socket.create_connection(server.server_address, timeout=10) for _ in range(2)]
        wait_until(lambda: server.counts["accepted"] == 2)
        third = exchange(server.server_address, b"")
        assert third.startswith(b"HTTP/1.0 503 ") and b"too many connections from 127.0.0.1" in third
        first[0].sendall(b"GET /a HTTP/1.0\r\n\r\n")  # the capped ones are still served
        assert b" 200 " in read_all(first[0])
        first[0].close()
        assert b"ok /b" in exchange(server.server_address, b"GET /b HTTP/1.0\r\n\r\n")  # a slot is free again
        first[1].close()
    assert server.counts["refused"] == 1


def test_loopback_is_not_capped_unless_asked():
    with serving(max_per_peer=2) as server:
        idle = [socket.create_connection(server.server_address, timeout=10) for _ in range(3)]
        try:
            assert b"ok /x" in exchange(server.server_address)
        finally:
            for sock in idle:
                sock.close()
    assert server.counts["refused"] == 0


def test_healthz_is_answered_while_every_worker_is_busy():
    release = threading.Event()
    with serving(handler_class(release), workers=1) as server, ThreadPoolExecutor(2) as pool:
        blocked = [pool.submit(exchange, server.server_address, b"GET /block HTTP/1.0\r\n\r\n") for _ in range(2)]
        wait_until(lambda: server.counts["accepted"] == 2)
        try:
            health = exchange(server.server_address, b"GET /healthz HTTP/1.0\r\n\r\n")
            queued = [f.done() for f in blocked]
        finally:
            release.set()
        answers = [f.result() for f in blocked]
    assert b"ok /healthz" in health
    assert queued == [False, False]  # the worker was still held when /healthz was answered
    assert all(b"ok /block" in a for a in answers)


def test_an_answer_the_client_does_not_read_is_dropped_at_the_deadline():
    with serving(timeout_s=0.3) as server:
        with socket.create_connection(server.server_address, timeout=10) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /big HTTP/1.0\r\n\r\n")
            wait_until(lambda: server.counts["timed_out"] == 1, timeout=30)
            assert len(read_all(sock)) < len(BIG)
        assert b"ok /x" in exchange(server.server_address)


def test_a_handler_bug_is_a_500_and_one_log_entry(caplog):
    with serving() as server:
        answer = exchange(server.server_address, b"GET /boom HTTP/1.0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 500 ")
        assert b"ok /x" in exchange(server.server_address)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "http request from 127.0.0.1 failed: RuntimeError: a bug in a handler"]  # one line, the traceback at DEBUG
    assert server.counts["handler"] == 1


def test_oversized_requests_get_a_status_not_a_hang():
    with serving() as server:
        assert exchange(server.server_address, b"GET /" + b"a" * 70000 + b" HTTP/1.0\r\n\r\n").startswith(
            b"HTTP/1.0 414 ")
        assert exchange(server.server_address, b"POST / HTTP/1.0\r\nContent-Length: 9999999\r\n\r\n").startswith(
            b"HTTP/1.0 413 ")


def trickle(address, count: int, stop: threading.Event, cut: list) -> None:
    """``count`` slow clients: half a request line, then a byte a second, reconnecting when cut."""
    socks = []
    while not stop.is_set():
        while len(socks) < count:
            sock = socket.create_connection(address, timeout=5)
            sock.sendall(b"GET /metr")
            socks.append(sock)
        for sock in list(socks):
            try:
                sock.sendall(b"i")
            except OSError:
                cut.append(1)
                socks.remove(sock)
                sock.close()
        stop.wait(1.0)
    for sock in socks:
        sock.close()


def timed_get(address, path: str) -> tuple[int | None, float]:
    t0 = time.perf_counter()
    answer = exchange(address, f"GET {path} HTTP/1.0\r\n\r\n".encode())
    parts = answer.split(b" ", 2)
    return (int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None), time.perf_counter() - t0


@pytest.mark.slow  # asserts on wall-clock time
def test_50_slow_clients_do_not_starve_healthz_or_scrapes(tmp_path):
    daemon = Daemon(make_config(tmp_path), runtime_factory=real_runtime, labels=LABELS)
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 5)
        address, stop, cut = daemon.http_address, threading.Event(), []
        attacker = threading.Thread(target=trickle, args=(address, 50, stop, cut), daemon=True)
        attacker.start()
        try:
            time.sleep(2.0)  # every slow client holds a connection and has sent bytes
            with ThreadPoolExecutor(40) as pool:
                rounds = [list(pool.map(lambda p: timed_get(address, p), ["/metrics", "/healthz"] * 20))
                          for _ in range(4)]
                for _ in range(6):
                    rounds.append([timed_get(address, "/healthz")])
                    time.sleep(1.0)  # past the request deadline: slow clients are cut and come back
        finally:
            stop.set()
            attacker.join(10)
        counts = daemon.http.connection_counts
    answers = [a for r in rounds for a in r]
    assert [s for s, _ in answers] == [200] * len(answers)
    slowest = max(t for s, t in answers)
    assert slowest < 1.0, f"slowest answer {slowest:.2f} s"
    assert counts["timed_out"] >= 50, counts  # every slow client was cut off at least once


def test_the_endpoint_answers_healthz_on_the_io_thread_while_stats_holds_every_worker(caplog):
    from edgekit.serve.http.endpoint import HttpEndpoint, ServeMetrics

    release, ready = threading.Event(), [True]

    def stats():  # a /stats that hangs: it holds the only worker
        release.wait(30)
        return {}

    def health():
        if ready[0] is None:
            raise RuntimeError("a bug in the health callback")
        return ready[0], {"status": "ok" if ready[0] else "unavailable"}

    endpoint = HttpEndpoint("127.0.0.1", 0, ServeMetrics(dict), health, stats, workers=1)
    endpoint.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            hanging = pool.submit(exchange, endpoint.address, b"GET /stats HTTP/1.0\r\n\r\n")
            wait_until(lambda: endpoint.connection_counts["accepted"] == 1)
            try:
                got = exchange(endpoint.address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                head = exchange(endpoint.address, b"HEAD /healthz HTTP/1.0\r\n\r\n")
                ready[0] = False
                down = exchange(endpoint.address, b"GET /healthz?verbose HTTP/1.0\r\n\r\n")
                ready[0] = None
                bug = exchange(endpoint.address, b"GET /healthz HTTP/1.0\r\n\r\n")
                assert not hanging.done()
            finally:
                release.set()
            assert hanging.result().startswith(b"HTTP/1.0 200 ")
        odd = exchange(endpoint.address, b"GET /healthz HTTP/9.9\r\n\r\n")  # not quick: the handler judges it
    finally:
        endpoint.close()
    assert got.startswith(b"HTTP/1.0 200 OK\r\n") and got.endswith(b'{"status": "ok"}')
    assert b"Content-Type: application/json\r\n" in got and b"Content-Length: 16\r\n" in got
    assert head.startswith(b"HTTP/1.0 200 OK\r\n") and head.endswith(b"\r\n\r\n")  # HEAD: no body
    assert down.startswith(b"HTTP/1.0 503 ") and down.endswith(b'{"status": "unavailable"}')
    assert bug.startswith(b"HTTP/1.0 500 ")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "http /healthz from 127.0.0.1 failed: RuntimeError: a bug in the health callback"]  # one line, counted
    assert endpoint.connection_counts["handler"] == 1
    assert b"Error code explanation: 505" in odd  # http.server answers an unknown version as HTTP/0.9
