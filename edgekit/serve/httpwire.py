"""An HTTP request and answer as bytes: framing a request read from a socket, a canned answer,
and a ``BaseHTTPRequestHandler`` that works on bytes instead of a socket.

The bounded server (:mod:`edgekit.serve.httpserver`) reads requests itself, without a thread
per client; these functions tell it when a request is whole and what to send back.
"""

from __future__ import annotations

import functools
import io
import ipaddress
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler

MAX_HEAD_BYTES = 16 * 1024  # request line + headers; a Prometheus scrape sends about 300 bytes
MAX_BODY_BYTES = 8 * 1024  # POST /reload takes no body


def answer_bytes(status: int, content_type: str, payload: bytes, body: bool = True, extra: str = "") -> bytes:
    """A whole HTTP/1.0 answer (the connection closes after it); ``body=False`` for HEAD."""
    head = (f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\nServer: edgekit\r\n"
            f"Date: {formatdate(usegmt=True)}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(payload)}\r\nCache-Control: no-store\r\n{extra}Connection: close\r\n\r\n")
    return head.encode("latin-1") + (payload if body else b"")


def canned(status: int, text: str) -> bytes:
    """A plain-text answer the server makes itself (a refusal, a request too large, a bug)."""
    return answer_bytes(status, "text/plain; charset=utf-8", (text + "\n").encode(),
                        extra="Retry-After: 1\r\n" if status == 503 else "")


def request_length(buf: bytes | bytearray, max_head: int = MAX_HEAD_BYTES,
                   max_body: int = MAX_BODY_BYTES) -> tuple[int, int]:
    """Where the first request in ``buf`` ends: ``(200, length)`` once it is whole, ``(0, 0)``
    while more bytes are needed, ``(status, 0)`` when it can never be served (413, 414, 431).

    The body length is ``Content-Length`` when it is a plain non-negative number; any other
    value counts as no body, and the handler judges the request.
    """
    end = -1
    for sep in (b"\n\r\n", b"\n\n"):
        found = buf.find(sep)
        if found >= 0 and (end < 0 or found + len(sep) < end):
            end = found + len(sep)
    if end < 0 or end > max_head:
        if len(buf) <= max_head and end < 0:
            return 0, 0
        return (414 if b"\n" not in buf[:max_head] else 431), 0
    body = 0
    for line in bytes(buf[:end]).split(b"\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            body = int(value.strip())
            break
    if body > max_body:
        return 413, 0
    return (200, end + body) if len(buf) >= end + body else (0, 0)


def request_line(head: bytes) -> tuple[str, str, str]:
    """``(method, path without the query, version)`` of a request head; empty strings when it
    is not three words."""
    words = head.split(b"\n", 1)[0].split()
    if len(words) != 3:
        return "", "", ""
    return words[0].decode("latin-1"), words[1].split(b"?", 1)[0].decode("latin-1"), words[2].decode("latin-1")


def buffered(handler: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    """``handler`` reading its request from bytes (``request`` is ``(bytes, received_at)``) and
    writing its answer to ``wfile`` (a BytesIO): it never touches a socket, so it never waits
    for a client. ``received_at`` lets a handler share work among requests that waited."""

    class Buffered(handler):  # type: ignore[valid-type, misc]
        received_at: float  # time.monotonic() when the whole request had arrived

        def setup(self) -> None:
            data, self.received_at = self.request
            self.connection = None
            self.rfile = io.BytesIO(data)
            self.wfile = io.BytesIO()

        def finish(self) -> None:  # the server writes wfile's bytes itself
            pass

    Buffered.__name__ = Buffered.__qualname__ = handler.__name__
    return Buffered


@functools.lru_cache(maxsize=1024)  # asked on every connection past the cap: parse each address once
def is_loopback(address: str) -> bool:
    """Whether a peer address is this machine (IPv4-mapped IPv6 and zone ids understood)."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0].removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False
