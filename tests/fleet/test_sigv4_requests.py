"""SigV4 with the stdlib: AWS's published example, botocore's signer, and where credentials,
region and endpoint come from (environment, then profiles, as AWS tools read them)."""

from __future__ import annotations

import calendar
import datetime

import pytest

from edgekit.errors import UsageError
from edgekit.fleet.awsconfig import settings
from edgekit.fleet.sigv4 import Credentials, encode_path, sign

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


def test_the_get_object_example_of_the_aws_documentation():
    # "Authenticating Requests: Using the Authorization Header", example GET Object (bytes 0-9 of test.txt)
    headers = sign("GET", "https://examplebucket.s3.amazonaws.com/test.txt", {"Range": "bytes=0-9"}, EXAMPLE,
                   "us-east-1", now=calendar.timegm((2013, 5, 24, 0, 0, 0)))
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


@pytest.mark.parametrize("url, headers, token", [
    ("http://127.0.0.1:8333/models/demo/channels/stable.json", {}, ""),
    ("https://s3.eu-west-1.amazonaws.com/b/v/" + encode_path("a b/ä+c=d~e.tflite"), {"Range": "bytes=10-"}, ""),
    ("https://b.s3.amazonaws.com/k?list-type=2&prefix=demo%2Fversions%2F&delimiter=%2F", {}, "session-token"),
    ("http://store.local/b/k", {"If-None-Match": '"abc"', "Range": "bytes=0-1"}, ""),
])
def test_the_same_signature_as_botocore(url, headers, token):
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    request = AWSRequest(method="GET", url=url, headers=dict(headers))
    S3SigV4Auth(BotoCredentials(EXAMPLE.access_key, EXAMPLE.secret_key, token or None), "s3", "eu-west-1"
                ).add_auth(request)
    stamp = datetime.datetime.strptime(request.headers["x-amz-date"], "%Y%m%dT%H%M%SZ")
    ours = sign("GET", url, headers, Credentials(EXAMPLE.access_key, EXAMPLE.secret_key, token), "eu-west-1",
                payload_sha256=request.headers["x-amz-content-sha256"], now=calendar.timegm(stamp.timetuple()))
    assert ours["Authorization"] == request.headers["Authorization"]
    assert ours.get("x-amz-security-token") == (token or None)


def test_credentials_never_print_their_secret():
    assert "wJalr" not in repr(EXAMPLE) and "wJalr" not in str(EXAMPLE)


def write(path, text):
    path.write_text(text)
    return str(path)


def test_the_environment_wins_over_profiles(tmp_path):
    creds = write(tmp_path / "credentials", "[default]\naws_access_key_id = FILE\naws_secret_access_key = s\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": creds, "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_ACCESS_KEY_ID": "ENV", "AWS_SECRET_ACCESS_KEY": "e", "AWS_SESSION_TOKEN": "t",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:8333/", "AWS_REGION": "eu-central-1"}
    got = settings(env)
    assert got.credentials == Credentials("ENV", "e", "t")
    assert (got.endpoint, got.region) == ("http://127.0.0.1:8333", "eu-central-1")
    assert settings({**env, "AWS_ENDPOINT_URL_S3": "https://s3.local"}).endpoint == "https://s3.local"


def test_a_named_profile_from_the_shared_files(tmp_path):
    env = {"AWS_PROFILE": "fleet", "HOME": str(tmp_path),
           "AWS_SHARED_CREDENTIALS_FILE": write(tmp_path / "c", "[default]\naws_access_key_id = D\n"
                                                "aws_secret_access_key = d\n[fleet]\naws_access_key_id = F\n"
                                                "aws_secret_access_key = f\n"),
           "AWS_CONFIG_FILE": write(tmp_path / "cfg", "[default]\nregion = us-west-2\n[profile fleet]\n"
                                    "region = ap-south-1\nendpoint_url = https://minio.local:9000\n")}
    got = settings(env)
    assert got.credentials == Credentials("F", "f") and got.region == "ap-south-1"
    assert got.endpoint == "https://minio.local:9000"
    assert settings({**env, "AWS_PROFILE": "default"}).region == "us-west-2"


def test_no_credentials_means_unsigned_requests_and_a_bad_endpoint_is_one_line(tmp_path):
    env = {"HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    got = settings(env)
    assert got.credentials is None and got.region == "us-east-1" and got.endpoint == ""
    with pytest.raises(UsageError, match="not an http"):
        settings({**env, "AWS_ENDPOINT_URL": "minio.local:9000"})
    with pytest.raises(UsageError, match="not an AWS config file"):
        settings({**env, "AWS_CONFIG_FILE": write(tmp_path / "bad", "no section header\n")})
