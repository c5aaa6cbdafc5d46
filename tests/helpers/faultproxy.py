"""A loopback TCP proxy in front of the real store, for the faults a network brings: the store
down (connections refused), a response cut after some bytes (a download broken half way), or a
store that answers slowly. Each client connection carries one HTTP request (edgekit's store reader
opens one per request), so the proxy reads the request head, records it, then pumps the answer.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Rules:
    """What the proxy does now (tests change these while it runs)."""

    down: bool = False  # refuse new connections (nothing listens)
    cut: Callable[[str], int | None] = lambda request: None  # bytes of the answer to pass before a cut
    delay_s: float = 0.0  # wait this long before answering
    down_after_cut: bool = False  # a cut takes the whole store down (it died mid-answer)


@dataclass
class FaultProxy:
    """``127.0.0.1:port`` -> ``upstream``; ``requests`` holds every request head seen (decoded)."""

    upstream: tuple[str, int]
    rules: Rules = field(default_factory=Rules)
    requests: list[str] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._server: socket.socket | None = None
        self._lock = threading.Lock()
        self._active: set[socket.socket] = set()
        self._listen()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _listen(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        self.port = server.getsockname()[1]
        server.listen(16)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def set_down(self, down: bool) -> None:
        """Stop listening and drop every open connection (the store died: connection refused from now
        on, an answer under way ends short), or listen again on the same port."""
        with self._lock:
            if down and self._server is not None:
                with contextlib.suppress(OSError):  # wakes the thread blocked in accept(); close() alone would not
                    self._server.shutdown(socket.SHUT_RDWR)
                self._server.close()
                self._server = None
                for conn in list(self._active):
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)
            elif not down and self._server is None:
                self._listen()

    def close(self) -> None:
        self.set_down(True)

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        self._active.add(client)
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            request = head.split(b"\r\n\r\n", 1)[0].decode("latin-1")
            self.requests.append(request)
            if self.rules.delay_s:
                time.sleep(self.rules.delay_s)
            upstream = socket.create_connection(self.upstream, timeout=30)
            upstream.sendall(head)
            if self._pump(upstream, client, self.rules.cut(request)) and self.rules.down_after_cut:
                self.set_down(True)
        except OSError:
            pass
        finally:
            self._active.discard(client)
            client.close()
            if upstream is not None:
                upstream.close()

    @staticmethod
    def _pump(upstream: socket.socket, client: socket.socket, limit: int | None) -> bool:
        """Pass the answer on; True when it was cut at ``limit`` bytes."""
        sent = 0
        while True:
            chunk = upstream.recv(65536)
            if not chunk:
                return False
            if limit is not None and sent + len(chunk) >= limit:
                client.sendall(chunk[: max(0, limit - sent)])
                client.shutdown(socket.SHUT_RDWR)  # cut: the reader sees the answer end early
                return True
            client.sendall(chunk)
            sent += len(chunk)
