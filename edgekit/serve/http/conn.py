"""One client connection of the bounded HTTP server: what it sent, its deadline and phase, and
how it is hung up without destroying an answer the client has not read yet."""

from __future__ import annotations

import contextlib
import socket

READ_CHUNK = 65536


class Conn:
    """One client connection: its socket, what it sent so far, its deadline and phase."""

    __slots__ = ("sock", "addr", "peer", "buf", "deadline", "out", "phase", "unread", "continued")

    def __init__(self, sock: socket.socket, addr: tuple, deadline: float):
        self.sock, self.addr, self.peer = sock, addr, str(addr[0])
        self.buf = bytearray()
        self.deadline = deadline
        self.out = memoryview(b"")
        self.phase = "read"  # read -> busy (a worker has it) -> write -> closed
        self.unread = False  # the client sent more than the request we took: drain before closing
        self.continued = False  # "100 Continue" was sent (once per request)


def hang_up(sock: socket.socket, drain: bool) -> None:
    """Close; with ``drain``, first drop what the client sent that we did not read (closing
    with unread bytes sends a reset, which can destroy the answer before the client reads it)."""
    if drain:
        with contextlib.suppress(OSError):
            for _ in range(4):
                if not sock.recv(READ_CHUNK):
                    break
    sock.close()
