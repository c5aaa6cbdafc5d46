"""An HTTP request and answer as bytes: framing a request read from a socket, a canned answer,
and a ``BaseHTTPRequestHandler`` that works on bytes instead of a socket.

The bounded server (:mod:`edgekit.serve.http.server`) reads requests itself, without a thread
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


MAX_LENGTH_DIGITS = 12  # a Content-Length longer than this is over any body cap: 413 before int() sees it
EXPECT_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def request_length(buf: bytes | bytearray, max_head: int = MAX_HEAD_BYTES,
                   max_body: int = MAX_BODY_BYTES) -> tuple[int, int]:
    """Where the first request in ``buf`` ends: ``(200, length)`` once it is whole, ``(0, 0)``
    while more bytes are needed, ``(status, 0)`` when it can never be served (400, 411, 413,
    414, 417, 431: see :func:`request_framing`)."""
    status, length, _ = request_framing(buf, max_head, max_body)
    return (0, 0) if status == 100 else (status, length)


def request_framing(buf: bytes | bytearray, max_head: int = MAX_HEAD_BYTES,
                    max_body: int = MAX_BODY_BYTES) -> tuple[int, int, str]:
    """``(status, length, why)`` of the first request in ``buf``: 200 and its length once it is
    whole; 0 while more bytes are needed; 100 when the head asks ``Expect: 100-continue`` and
    its body has not begun (the server says ``100 Continue`` and reads on); else the status that
    refuses it and why.

    Every step is bounded and none can raise: the head is looked at only within ``max_head``
    bytes, and a Content-Length is read by ``int()`` only once it is at most 12 plain digits
    (Python refuses to convert more than 4,300, and no body here is near 12). Framing that two
    parsers could read two ways (a request smuggler's tools) is refused, never guessed at:
    a Content-Length that is not plain digits, two that disagree, a space before a header's
    colon, a folded header line, or any Transfer-Encoding (no body here needs chunks).
    """
    end = _head_end(buf)
    if end < 0 or end > max_head:
        if len(buf) <= max_head and end < 0:
            return 0, 0, ""
        return (414 if b"\n" not in buf[:max_head] else 431), 0, "request head too large"
    status, body, why = _body_length(bytes(buf[:end]).split(b"\n")[1:], max_body)
    if status != 200:
        return status, 0, why
    if len(buf) >= end + body:
        return 200, end + body, ""
    return (100 if why == "continue" and len(buf) == end else 0), 0, ""


def _head_end(buf: bytes | bytearray) -> int:
    """Offset just past the blank line that ends the head (bare newlines too), -1 when none yet."""
    end = -1
    for sep in (b"\n\r\n", b"\n\n"):
        found = buf.find(sep)
        if found >= 0 and (end < 0 or found + len(sep) < end):
            end = found + len(sep)
    return end


def _body_length(lines: list[bytes], max_body: int) -> tuple[int, int, str]:
    """``(200, body length, "continue" or "")`` from the header lines, or ``(status, 0, why)``."""
    lengths: set[bytes] = set()
    expect, chunked = b"", False
    for raw in lines:
        line = raw.rstrip(b"\r")
        if line[:1] in (b" ", b"\t"):  # obsolete line folding: RFC 9112 5.2 lets a server refuse it
            return 400, 0, "a folded header line"
        name, colon, value = line.partition(b":")
        if not colon:
            continue  # not a header line: the handler's parser judges it
        key = name.strip().lower()
        if key in (b"content-length", b"transfer-encoding") and name != name.strip():
            return 400, 0, "whitespace before a header's colon"  # RFC 9112 5.1: one parser's header, not another's
        if key == b"content-length":
            lengths.add(value.strip())
        elif key == b"transfer-encoding":
            chunked = True
        elif key == b"expect":
            expect = value.strip().lower()
    if chunked:
        return (400, 0, "both Content-Length and Transfer-Encoding") if lengths else \
            (411, 0, "Transfer-Encoding is not accepted: send Content-Length")
    if len(lengths) > 1:
        return 400, 0, "Content-Length headers that disagree"
    body = 0
    if lengths:
        value = lengths.pop()
        if not value.isdigit():  # ASCII digits only (bytes): no sign, no space, no list
            return 400, 0, "Content-Length is not a number"
        value = value.lstrip(b"0") or b"0"  # int() counts leading zeros against its 4,300 digits too
        if len(value) > MAX_LENGTH_DIGITS:
            return 413, 0, "request body too large"
        body = int(value)
    if body > max_body:
        return 413, 0, "request body too large"
    if expect and expect != b"100-continue":
        return 417, 0, "only Expect: 100-continue is understood"
    return 200, body, "continue" if expect and body else ""


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
