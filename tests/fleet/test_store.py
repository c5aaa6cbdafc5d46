"""The device's store reader against a real SeaweedFS S3 gateway (SigV4 accepted, a wrong secret
refused, Range resumes, If-None-Match) and against a plain web server (read-only devices)."""

from __future__ import annotations

import functools
import http.server
import threading

import pytest

from edgekit.errors import UsageError
from edgekit.fleet.awsconfig import settings
from edgekit.fleet.sigv4 import Credentials
from edgekit.fleet.store import NotFound, Reader, StoreError, parse_location
from tests.helpers import seaweed as sw

DATA = bytes(range(256)) * 40


@pytest.fixture
def objects(fleet):
    """Two objects under the test's prefix, put there by the admin."""
    client = fleet.server.client()
    client.put_object(Bucket=sw.BUCKET, Key=f"{fleet.prefix}/dir/a b+c.bin", Body=DATA)
    client.put_object(Bucket=sw.BUCKET, Key=f"{fleet.prefix}/small.json", Body=b'{"x": 1}')
    return Reader(parse_location(fleet.dest))


def test_locations_parse_and_print_without_secrets():
    loc = parse_location("s3://models/demo/")
    assert (loc.bucket, loc.prefix, loc.key("channels/stable.json")) == ("models", "demo", "demo/channels/stable.json")
    assert parse_location("s3://models").key("versions") == "versions"
    web = parse_location("https://user:pw@cdn.example.com/fleet/")
    assert str(web) == "https://cdn.example.com/fleet" and "pw" not in str(web)
    for bad in ("s3://Bad_Bucket/x", "s3://models/a//b", "s3://models/../x", "ftp://x/y", "models/demo",
                "https://h/p?q=1"):
        with pytest.raises(UsageError):
            parse_location(bad)


def test_signed_get_head_and_a_range_against_seaweedfs(objects, tmp_path):
    assert objects.get(objects.location.key("small.json"), 100).body == b'{"x": 1}'
    key = objects.location.key("dir/a b+c.bin")  # a space and a plus: the path's encoding is signed too
    assert objects.head(key) == len(DATA)
    part = tmp_path / "a.part"
    part.write_bytes(DATA[:1000])  # what a download cut half way left behind
    objects.download(key, part, len(DATA))
    assert part.read_bytes() == DATA


def test_if_none_match_gives_304_when_unchanged(objects):
    first = objects.get(objects.location.key("small.json"), 100)
    assert first.headers.get("etag")
    again = objects.get(objects.location.key("small.json"), 100, etag=first.headers["etag"])
    assert again.status in (200, 304)  # 304 where the store supports it (SeaweedFS does)
    if again.status == 200:
        assert again.body == first.body


def test_a_missing_object_a_wrong_secret_and_a_size_limit(objects, fleet):
    with pytest.raises(NotFound):
        objects.get(objects.location.key("nothing.json"), 100)
    wrong = settings()
    bad = Reader(objects.location, type(wrong)(Credentials(sw.DEVICE[0], "not-the-secret"), wrong.region,
                                                wrong.endpoint))
    with pytest.raises(StoreError, match="access denied") as info:
        bad.get(objects.location.key("small.json"), 100)
    assert "not-the-secret" not in str(info.value)
    with pytest.raises(StoreError, match="over 4 bytes"):
        objects.get(objects.location.key("small.json"), 4)


def test_a_store_that_is_down_or_silent_is_a_store_error(fleet):
    proxy = fleet.proxy()
    fleet.as_device(proxy.endpoint)
    reader = Reader(parse_location(fleet.dest), timeout_s=0.3)
    proxy.set_down(True)
    with pytest.raises(StoreError, match="refused"):
        reader.get(reader.location.key("x"), 10)
    proxy.set_down(False)
    proxy.rules.delay_s = 1.0
    with pytest.raises(StoreError, match="no answer in time"):
        reader.get(reader.location.key("x"), 10)


def test_a_plain_web_server_serves_a_read_only_device(tmp_path):
    (tmp_path / "fleet" / "dir").mkdir(parents=True)
    (tmp_path / "fleet" / "dir" / "a.bin").write_bytes(DATA)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reader = Reader(parse_location(f"http://127.0.0.1:{server.server_address[1]}/fleet"))
        assert reader.head("dir/a.bin") == len(DATA)
        part = tmp_path / "a.part"
        part.write_bytes(DATA[:7])  # SimpleHTTPRequestHandler ignores Range: the file starts over
        reader.download("dir/a.bin", part, len(DATA))
        assert part.read_bytes() == DATA
        with pytest.raises(NotFound):
            reader.get("dir/none", 10)
    finally:
        server.shutdown()
        server.server_close()
