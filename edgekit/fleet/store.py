"""Reading objects from an S3-compatible store or a static web server, with the standard library.

A location is ``s3://BUCKET/PREFIX`` (requests signed with SigV4, :mod:`edgekit.fleet.sigv4`, when
credentials are found by :mod:`edgekit.fleet.awsconfig`; path-style on a custom endpoint, as MinIO and
SeaweedFS expect) or ``https://HOST/PATH`` / ``http://...``: the same layout served read-only by any
web server or CDN. A device only reads (GET, HEAD), so no SDK is needed.

Errors are :class:`StoreError` (the store is down, slow, refuses or answers nonsense: worth retrying
later) or :class:`NotFound` (the object is not there). Downloads stream to a ``.part`` file and
resume where it ends with a Range request; a server that ignores the range starts the file over.
"""

from __future__ import annotations

import http.client
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from edgekit.errors import UsageError
from edgekit.fleet.awsconfig import AwsSettings, settings
from edgekit.fleet.sigv4 import encode_path, sign

TIMEOUT_S = 20.0  # per connect and per read: a store that says nothing this long is down for us
CHUNK = 1 << 20
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_FIX = "give s3://BUCKET/PREFIX or an https:// base URL"


class StoreError(Exception):
    """The store could not be read now (down, slow, refused, a bad answer): retried later."""


class NotFound(StoreError):
    """The store answered that the object does not exist."""


@dataclass(frozen=True)
class Location:
    """Where versions and channels live: a bucket and prefix, or a base URL."""

    scheme: str  # "s3", "http" or "https"
    bucket: str = ""
    prefix: str = ""  # no leading or trailing "/"; "" = the bucket's top
    base: str = ""  # http(s): the base URL without a trailing "/"

    def key(self, *parts: str) -> str:
        """The object key (s3) or path below the base (http) of ``parts`` under the prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        parts = urlsplit(self.base)  # user:password@ never printed
        return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}"


def parse_location(text: str, what: str = "--source") -> Location:
    """A :class:`Location` from ``s3://BUCKET[/PREFIX]`` or ``http(s)://HOST[/PATH]``; UsageError if neither."""
    parts = urlsplit(text.strip())
    if parts.scheme == "s3":
        bucket, prefix = parts.netloc, parts.path.strip("/")
        if not _BUCKET.match(bucket):
            raise UsageError(f"{what} {text!r}: {bucket!r} is not an S3 bucket name", _FIX)
        if any(seg in ("", ".", "..") for seg in prefix.split("/")) and prefix:
            raise UsageError(f"{what} {text!r}: the prefix has an empty, '.' or '..' part", _FIX)
        return Location("s3", bucket=bucket, prefix=prefix)
    if parts.scheme in ("http", "https") and parts.hostname:
        if parts.query or parts.fragment:
            raise UsageError(f"{what} {text!r}: a base URL has no query or fragment", _FIX)
        return Location(parts.scheme, base=text.strip().rstrip("/"))
    raise UsageError(f"{what} {text!r} is not s3://BUCKET/PREFIX or an http(s):// URL", _FIX)


@dataclass
class Response:
    """A small object read whole: status, lower-cased headers and the body."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class Reader:
    """GET and HEAD on one location; ``aws`` defaults to what the environment and profiles say."""

    def __init__(self, location: Location, aws: AwsSettings | None = None, timeout_s: float = TIMEOUT_S):
        self.location = location
        self.aws = (aws or settings()) if location.scheme == "s3" else None
        self.timeout_s = timeout_s

    def url(self, key: str) -> str:
        """The URL of ``key`` (path-style on a custom endpoint, virtual-hosted on AWS)."""
        loc, path = self.location, encode_path(key)
        if loc.scheme != "s3":
            return f"{loc.base}/{path}"
        if self.aws.endpoint:
            return f"{self.aws.endpoint}/{loc.bucket}/{path}"
        if "." in loc.bucket:  # a dotted bucket breaks the TLS name of a virtual host
            return f"https://s3.{self.aws.region}.amazonaws.com/{loc.bucket}/{path}"
        return f"https://{loc.bucket}.s3.{self.aws.region}.amazonaws.com/{path}"

    def _open(self, method: str, key: str, headers: dict[str, str]) -> tuple[http.client.HTTPConnection,
                                                                              http.client.HTTPResponse]:
        url = self.url(key)
        parts = urlsplit(url)
        if self.aws is not None and self.aws.credentials is not None:
            headers = sign(method, url, headers, self.aws.credentials, self.aws.region)
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=(self.aws.ca_bundle if self.aws else "") or None)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=self.timeout_s, context=context)
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout_s)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, target, headers={k: v for k, v in headers.items() if k != "Host"})
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise StoreError(f"{self._where(key)}: {_why(exc)}") from exc

    def _where(self, key: str) -> str:
        """An object's name in messages (never a credential: http user info is dropped)."""
        loc = self.location
        return f"s3://{loc.bucket}/{key}" if loc.scheme == "s3" else f"{loc}/{key}"

    def get(self, key: str, limit: int, etag: str = "") -> Response:
        """A small object whole (at most ``limit`` bytes); status 304 with ``etag`` when unchanged."""
        conn, resp = self._open("GET", key, {"If-None-Match": etag} if etag else {})
        try:
            if resp.status == 304:
                return Response(304, _headers(resp))
            self._check(resp, key, (200,))
            body = resp.read(limit + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise StoreError(f"{self._where(key)}: {_why(exc)}") from exc
        finally:
            conn.close()
        if len(body) > limit:
            raise StoreError(f"{self._where(key)} is over {limit} bytes")
        return Response(resp.status, _headers(resp), body)

    def head(self, key: str) -> int:
        """The size of an object in bytes."""
        conn, resp = self._open("HEAD", key, {})
        try:
            self._check(resp, key, (200,))
            size = resp.getheader("Content-Length")
        finally:
            conn.close()
        if size is None or not size.isdigit():
            raise StoreError(f"{self._where(key)}: the store gave no size for it")
        return int(size)

    def download(self, key: str, part: Path, size: int, stopping: Callable[[], bool] = lambda: False,
                 progress: Callable[[int], None] = lambda n: None) -> None:
        """Fill ``part`` with the ``size`` bytes of ``key``, resuming where it ends (Range); never
        reads past ``size`` (an object that grew is no longer what was sized and checked)."""
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        if have == size:
            return
        conn, resp = self._open("GET", key, {"Range": f"bytes={have}-"} if have else {})
        try:
            self._check(resp, key, (200, 206))
            if resp.status == 206 and not (resp.getheader("Content-Range") or "").startswith(f"bytes {have}-"):
                raise StoreError(f"{self._where(key)}: the store answered another range than bytes={have}-")
            if resp.status == 200:
                have = 0  # the server ignored the range: start over
            with open(part, "ab" if have else "wb") as f:
                while have < size:
                    if stopping():
                        raise StoreError("stopped")
                    block = resp.read(min(CHUNK, size - have))
                    if not block:
                        raise StoreError(f"{self._where(key)}: the connection ended after {have} of {size} bytes")
                    f.write(block)
                    have += len(block)
                    progress(len(block))
        except (TimeoutError, http.client.HTTPException, ConnectionError, ssl.SSLError) as exc:
            raise StoreError(f"{self._where(key)}: {_why(exc)} after {have} of {size} bytes") from exc
        finally:
            conn.close()

    def _check(self, resp: http.client.HTTPResponse, key: str, ok: tuple[int, ...]) -> None:
        if resp.status in ok:
            return
        detail = ""
        if resp.status >= 300:
            match = re.search(rb"<Code>([^<]{1,64})</Code>", resp.read(4096) if resp.status != 304 else b"")
            detail = f" ({match.group(1).decode('ascii', 'replace')})" if match else ""
        if resp.status == 404:
            raise NotFound(f"{self._where(key)} does not exist{detail}")
        if resp.status in (301, 302, 307, 308):
            raise StoreError(f"{self._where(key)}: the store redirects to {resp.getheader('Location', '?')}{detail} "
                             "(set AWS_REGION, or the endpoint)")
        if resp.status in (401, 403):
            raise StoreError(f"{self._where(key)}: access denied{detail} (check the credentials: "
                             "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the profile)")
        raise StoreError(f"{self._where(key)}: the store answered {resp.status} {resp.reason}{detail}")


def _headers(resp: http.client.HTTPResponse) -> dict[str, str]:
    return {k.lower(): v for k, v in resp.getheaders()}


def _why(exc: BaseException) -> str:
    """An exception in a few words (a refused connection, a timeout, a reset)."""
    if isinstance(exc, TimeoutError):
        return "no answer in time (the store is slow or unreachable)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (the store is down)"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]

