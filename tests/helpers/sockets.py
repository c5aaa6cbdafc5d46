"""Reading an HTTP answer off a raw socket, for the endpoint tests."""

from __future__ import annotations

import socket


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset after the answer counts as the end)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)
