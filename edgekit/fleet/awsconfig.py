"""Credentials, region and endpoint the way AWS's own tools find them, with the standard library.

In order: the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``;
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``; ``AWS_REGION`` / ``AWS_DEFAULT_REGION``), then the
profile ``AWS_PROFILE`` (else ``default``) of the shared files ``~/.aws/credentials`` and
``~/.aws/config`` (``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``). No key pair at all means
unsigned requests: a bucket that allows anonymous reads. Instance roles and SSO, which need
further calls to AWS, are left to boto3 on the host; a device takes a key pair (a read-only one).
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import UsageError
from edgekit.fleet.sigv4 import Credentials
from edgekit.util.safe_open import read_regular

MAX_CONFIG_BYTES = 1 << 20
DEFAULT_REGION = "us-east-1"  # what S3-compatible stores expect when nothing says otherwise


@dataclass(frozen=True)
class AwsSettings:
    """What a request to the store needs besides the bucket and key."""

    credentials: Credentials | None
    region: str
    endpoint: str  # "" = AWS itself
    ca_bundle: str = ""


def _profile_section(path: Path, profile: str, config_file: bool) -> dict[str, str]:
    """The keys of ``profile`` in an AWS shared file ({} when the file or profile is missing)."""
    try:
        text = read_regular(path, MAX_CONFIG_BYTES).decode("utf-8", "replace")
    except OSError:
        return {}
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise UsageError(f"{path} is not an AWS config file: {str(exc).splitlines()[0]}", "fix or remove it") from exc
    # ~/.aws/config names profiles "profile NAME" except the default one; ~/.aws/credentials just "NAME"
    name = f"profile {profile}" if config_file and profile != "default" else profile
    return dict(parser[name]) if parser.has_section(name) else {}


def settings(env: Mapping[str, str] | None = None) -> AwsSettings:
    """The settings the environment and the shared files give (see the module docstring)."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    creds_file = _profile_section(Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials"),
                                  profile, config_file=False)
    config_file = _profile_section(Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config"), profile,
                                   config_file=True)
    credentials = None
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        credentials = Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                                  env.get("AWS_SESSION_TOKEN", ""))
    else:
        for section in (creds_file, config_file):
            if section.get("aws_access_key_id") and section.get("aws_secret_access_key"):
                credentials = Credentials(section["aws_access_key_id"], section["aws_secret_access_key"],
                                          section.get("aws_session_token", ""))
                break
    region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or config_file.get("region")
              or DEFAULT_REGION)
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or config_file.get("endpoint_url") or ""
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise UsageError(f"the S3 endpoint {endpoint!r} is not an http:// or https:// URL",
                         "set AWS_ENDPOINT_URL to e.g. https://s3.example.com or http://127.0.0.1:8333")
    return AwsSettings(credentials, region.strip(), endpoint.rstrip("/"),
                       env.get("AWS_CA_BUNDLE") or config_file.get("ca_bundle", ""))
