"""The daemon's HTTP endpoint under abuse, the systemd notifications, and start-up checks.

HTTP: 200 concurrent /metrics clients, 300 idle sockets, clients that hang up early, against
the real endpoint of a running daemon. systemd: a real AF_UNIX datagram socket as
NOTIFY_SOCKET. Start-up: `edgekit serve --print-config` and `Daemon.start` refuse what
cannot work, with one line.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgekit.errors import UsageError
from edgekit.serve.daemon import Daemon
from tests.helpers.sockets import read_all
from tests.helpers.waiting import wait_until
from tests.serve.test_daemon import LABELS, fake_runtime, http_get, make_config, real_runtime, running


def raw_get(address: tuple[str, int], path: str = "/metrics", timeout: float = 10.0) -> tuple[int, float]:
    """One HTTP/1.0 GET on a fresh socket: (status, seconds until the whole answer arrived)."""
    t0 = time.perf_counter()
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        answer = read_all(sock)
    status = int(answer.split(b" ", 2)[1])
    return status, time.perf_counter() - t0


@pytest.mark.slow  # asserts on wall-clock time
def test_200_concurrent_metrics_clients_are_all_answered_within_5_s(tmp_path):
    daemon = Daemon(make_config(tmp_path), runtime_factory=real_runtime, labels=LABELS)
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 5)
        address = daemon.http_address
        barrier = threading.Barrier(200)

        def client(_):
            barrier.wait()  # all 200 connect at once: the listen backlog must hold them
            return raw_get(address)

        with ThreadPoolExecutor(200) as pool:
            results = list(pool.map(client, range(200)))
    statuses = [s for s, _ in results]
    slowest = max(t for _, t in results)
    assert statuses == [200] * 200
    # slack for a loaded 2-core machine: two suites side by side saw 2.43 and 2.96 s; a server that
    # served the 200 one after another behind a slow one would take minutes
    assert slowest < 5.0, f"slowest answer {slowest:.2f} s"


@pytest.mark.slow  # asserts on wall-clock time
def test_idle_sockets_do_not_pin_threads_and_the_endpoint_still_answers(tmp_path):
    daemon = Daemon(make_config(tmp_path), runtime_factory=real_runtime, labels=LABELS)
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 5)
        base = threading.active_count()
        idle = [socket.create_connection(daemon.http_address, timeout=5) for _ in range(300)]
        try:
            time.sleep(0.3)
            during = threading.active_count()
            status, took = raw_get(daemon.http_address)
        finally:
            for s in idle:
                s.close()
    assert status == 200 and took < 2.0
    assert during - base <= 4, f"{during - base} threads for 300 idle sockets"


@pytest.mark.slow  # asserts on wall-clock time
def test_idle_sockets_are_closed_after_the_idle_timeout():
    from http.server import BaseHTTPRequestHandler

    from edgekit.serve.http.server import BoundedHTTPServer

    server = BoundedHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler, idle_timeout_s=0.2, max_connections=8)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conns = [socket.create_connection(server.server_address, timeout=5) for _ in range(10)]
        # Beyond max_connections the oldest are closed at once; the rest after the idle timeout.
        assert conns[0].recv(1) == b"" and conns[1].recv(1) == b""
        t0 = time.monotonic()
        assert conns[-1].recv(1) == b""
        assert time.monotonic() - t0 < 2
    finally:
        server.shutdown()
        server.server_close()


def test_clients_that_hang_up_early_leave_no_traceback(tmp_path, caplog, capfd):
    daemon = Daemon(make_config(tmp_path), runtime_factory=real_runtime, labels=LABELS)
    caplog.set_level(logging.DEBUG, logger="edgekit")
    with running(daemon):
        wait_until(lambda: daemon.stats()["frames"]["processed"] >= 5)
        for _ in range(50):
            with socket.create_connection(daemon.http_address, timeout=5) as sock:
                # Ask, then reset the connection before the answer is written.
                sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with socket.create_connection(daemon.http_address, timeout=5) as sock:
                sock.sendall(b"GET /met")  # half a request, then gone
        assert http_get(daemon, "/healthz")[0] == 200
    assert not [r for r in caplog.records if r.exc_info], "a client hang-up logged a traceback"
    assert "Traceback" not in capfd.readouterr().err


def test_watchdog_and_ready_are_sent_to_the_notify_socket(tmp_path, monkeypatch):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # WatchdogSec=0.2: a ping every 0.1 s
    daemon = Daemon(make_config(tmp_path), runtime_factory=real_runtime, labels=LABELS)
    messages: list[str] = []
    try:
        with running(daemon):
            deadline = time.monotonic() + 5
            while messages.count("WATCHDOG=1") < 3 and time.monotonic() < deadline:
                messages.append(sock.recv(256).decode())
        while True:  # what close() sent
            try:
                sock.settimeout(0.5)
                messages.append(sock.recv(256).decode())
            except TimeoutError:
                break
    finally:
        sock.close()
    assert messages[0] == "READY=1"
    assert messages.count("WATCHDOG=1") >= 3
    assert messages[-1] == "STOPPING=1"


@pytest.mark.slow  # asserts on wall-clock time
def test_no_watchdog_ping_while_the_loop_is_stuck(tmp_path, monkeypatch):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.1)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # a ping every 50 ms while the loop turns
    # FakeRuntime for timing control: an inference that hangs 1.2 s, which no real small model does on cue
    daemon = Daemon(make_config(tmp_path), runtime_factory=lambda: fake_runtime(delay_s=1.2), labels=LABELS)
    pings: list[float] = []
    try:
        with running(daemon):
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                try:
                    if sock.recv(256) == b"WATCHDOG=1":
                        pings.append(time.monotonic())
                except TimeoutError:
                    pass
    finally:
        sock.close()
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    # No ping comes while an inference hangs (1.2 s here, the loop's only work): with WatchdogSec
    # shorter than that, systemd would restart the service. (A turning loop pings every 50 ms:
    # the test above.)
    assert pings and gaps and min(gaps) > 1.0, gaps


# ---------------------------------------------------------------------------------------- start-up checks
def cli(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit.cli", *argv], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(b"")
    return path


BAD_CONFIGS = {
    "no model": ("[camera]\nuri = 'synthetic'\n", "no model to serve"),
    "listen notahost": ("[model]\npath = 'm.tflite'\n[http]\nlisten = 'notahost:9100'\n", "cannot resolve host"),
    "unknown camera option": ("[model]\npath = 'm.tflite'\n[camera]\nuri = 'synthetic'\n[camera.options]\nzoom = 2\n",
                              "unknown camera option(s) zoom"),
    "malformed camera uri": ("[model]\npath = 'm.tflite'\n[camera]\nuri = 'synthetic:320x240@-5'\n",
                             "bad camera URI"),
    "missing password file": ("[model]\npath = 'm.tflite'\n[mqtt]\nhost = '127.0.0.1'\npassword_file = 'nope'\n",
                              "password_file"),
    "missing model": ("[model]\npath = 'absent.tflite'\n", "does not exist"),
    "output under a file": ("[model]\npath = 'm.tflite'\n[output]\njsonl = 'm.tflite/x.jsonl'\n",
                            "is a file, not a directory"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_print_config_refuses_what_would_fail_to_start(case, tmp_path, model_file, capsys):
    from edgekit.cli import main

    text, words = BAD_CONFIGS[case]
    config = tmp_path / "serve.toml"
    config.write_text(text)
    assert main(["serve", "--config", str(config), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 2  # the error line and its fix line


@pytest.mark.slow
def test_output_under_a_file_is_one_line_not_a_traceback(tmp_path, model_file):
    (tmp_path / "afile").write_text("x")
    proc = cli("serve", str(model_file), "--camera", "synthetic", "--http", "off",
               "--output", "afile/x.jsonl", cwd=tmp_path)
    assert proc.returncode == 2
    assert "afile is a file, not a directory" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 2


@pytest.mark.slow  # asserts on wall-clock time
def test_a_malformed_camera_uri_is_fatal_at_start(tmp_path):
    config = make_config(tmp_path, camera={"uri": "synthetic:320x240@-5"})
    daemon = Daemon(config, runtime_factory=real_runtime, labels=LABELS)
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="bad camera URI"):
        daemon.start()
    daemon.close()
    assert time.monotonic() - t0 < 2  # not retried with backoff: systemd sees the failure at once
