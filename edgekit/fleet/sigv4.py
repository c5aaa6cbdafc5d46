"""AWS Signature Version 4 for S3 requests, with the standard library (hmac, hashlib).

Written from AWS's description of the algorithm ("Authenticating Requests: Using the Authorization
Header"), so a device reads from S3, MinIO or SeaweedFS without boto3 (tens of MB). The tests check
it against AWS's published GET example, against botocore's signer and against a real SeaweedFS
gateway, which rejects a wrong signature.

Steps: a canonical request (method, URI-encoded path, sorted query, the signed headers lowercased
and trimmed, the payload's sha256), a string to sign (algorithm, time, scope, the canonical
request's sha256), a signing key derived by HMAC chaining of date, region, service and
``aws4_request`` from ``"AWS4" + secret``, and the hex HMAC of the string to sign under it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED = "UNSIGNED-PAYLOAD"


@dataclass(frozen=True)
class Credentials:
    """An access key pair and, for temporary credentials, the session token."""

    access_key: str
    secret_key: str
    token: str = ""

    def __repr__(self) -> str:  # never a secret in a log line or a traceback
        return f"Credentials(access_key={self.access_key!r}, secret_key='***', token={'***' if self.token else ''!r})"


def encode_path(path: str) -> str:
    """A path as S3 wants it in the request line and the canonical request: every byte but unreserved
    characters and '/' percent-encoded (S3 keys are encoded once, not twice as other services)."""
    return quote(path, safe="/-_.~")


def _canonical_query(query: str) -> str:
    pairs = []
    for part in query.split("&") if query else []:
        key, _, value = part.partition("=")
        pairs.append((quote(_unquote(key), safe="-_.~"), quote(_unquote(value), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(method: str, url: str, headers: dict[str, str], credentials: Credentials, region: str,
         payload_sha256: str = EMPTY_SHA256, service: str = "s3", now: float | None = None) -> dict[str, str]:
    """The headers to send: ``headers`` plus Host, x-amz-date, x-amz-content-sha256, the session
    token if any and Authorization, every one of them signed.

    ``url`` must already be encoded as it goes on the wire (:func:`encode_path` for the path);
    ``payload_sha256`` is the hex sha256 of the body (the empty body's by default) or
    :data:`UNSIGNED`.
    """
    parts = urlsplit(url)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    date = stamp[:8]
    out = {**headers, "Host": parts.netloc, "x-amz-date": stamp, "x-amz-content-sha256": payload_sha256}
    if credentials.token:
        out["x-amz-security-token"] = credentials.token
    canonical = {name.lower(): re.sub(r"\s+", " ", str(value).strip()) for name, value in out.items()}
    signed = ";".join(sorted(canonical))
    request = "\n".join([method.upper(), parts.path or "/", _canonical_query(parts.query),
                         "".join(f"{k}:{canonical[k]}\n" for k in sorted(canonical)), signed, payload_sha256])
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(request.encode()).hexdigest()])
    signature = hmac.new(_signing_key(credentials.secret_key, date, region, service), to_sign.encode(),
                         hashlib.sha256).hexdigest()
    out["Authorization"] = (f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
                            f"SignedHeaders={signed}, Signature={signature}")
    return out
