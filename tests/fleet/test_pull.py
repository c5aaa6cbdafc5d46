"""Fetching one version onto the device, against a real SeaweedFS (through a fault proxy where the
network has to fail): checked before download, resumed after a cut, refused when tampered."""

from __future__ import annotations

import errno
import json

import pytest

from edgekit.bundle import MANIFEST
from edgekit.fleet import pull, store
from edgekit.fleet.channel import version_dir
from edgekit.fleet.keys import read_trusted
from edgekit.fleet.local import VersionsDir
from edgekit.fleet.pull import Fetcher, NoSpace, Refused
from edgekit.fleet.signature import SIGNATURE, verify_bundle
from edgekit.fleet.store import Reader, StoreError, parse_location
from tests.helpers import seaweed as sw


def fetcher(fleet, endpoint: str | None = None, **kwargs) -> Fetcher:
    if endpoint:
        fleet.as_device(endpoint)
    reader = Reader(parse_location(fleet.dest), timeout_s=5)
    return Fetcher(reader, read_trusted([fleet.pub()]), kwargs.pop("max_bytes", 100 << 20), **kwargs)


def versions_dir(fleet) -> VersionsDir:
    vdir = VersionsDir(fleet.tmp / "device")
    vdir.lock()
    return vdir


def put(fleet, version: str, name: str, data: bytes) -> None:
    fleet.server.client().put_object(Bucket=sw.BUCKET, Key=f"{fleet.prefix}/{version_dir(version)}/{name}", Body=data)


def test_a_version_is_fetched_verified_and_moved_in(fleet, bundles):
    version = fleet.push(bundles["v1"])
    vdir = versions_dir(fleet)
    path = fetcher(fleet).fetch(vdir, version, running_target="cpu")
    assert path == vdir.path(version) and verify_bundle(path, read_trusted([fleet.pub()])).sha256 == version
    assert not any(vdir.staging.iterdir())


@pytest.mark.parametrize("case, words", [
    ("stranger", "which is not trusted here"),
    ("model file", "does not match its sha256"),
    ("manifest", "does not hash to the version's name"),
    ("signature", "does not match the manifest"),
    ("unsigned", "is not signed"),
    ("missing", "points at a missing version"),
    ("other target", "built for target 'rpi'"),
    ("too big", "over the 1 MB cap"),
])
def test_what_a_device_refuses(fleet, bundles, case, words):
    bundle = {"other target": bundles["rpi"], "too big": bundles["big"]}.get(case, bundles["v1"])
    version = fleet.push(bundle, key="stranger" if case == "stranger" else "trusted")
    client, base = fleet.server.client(), f"{fleet.prefix}/{version_dir(version)}"
    manifest = json.loads(client.get_object(Bucket=sw.BUCKET, Key=f"{base}/{MANIFEST}")["Body"].read())
    model = next(name for name in manifest["files"] if name.endswith(".tflite"))
    if case == "model file":
        data = bytearray(client.get_object(Bucket=sw.BUCKET, Key=f"{base}/{model}")["Body"].read())
        data[len(data) // 2] ^= 1
        put(fleet, version, model, bytes(data))
    elif case == "manifest":
        put(fleet, version, MANIFEST, json.dumps({**manifest, "name": "evil"}).encode())
    elif case == "signature":
        sig = json.loads(client.get_object(Bucket=sw.BUCKET, Key=f"{base}/{SIGNATURE}")["Body"].read())
        sig["signature"] = ("B" if sig["signature"][0] == "A" else "A") + sig["signature"][1:]
        put(fleet, version, SIGNATURE, json.dumps(sig).encode())
    elif case == "unsigned":
        client.delete_object(Bucket=sw.BUCKET, Key=f"{base}/{SIGNATURE}")
    elif case == "missing":
        version = "0" * 64
    vdir = versions_dir(fleet)
    with pytest.raises(Refused, match=words):
        fetcher(fleet, max_bytes=1_000_000).fetch(vdir, version, running_target="cpu")
    assert not vdir.has(version)


def test_a_download_cut_half_way_resumes_where_it_stopped(fleet, bundles, monkeypatch):
    monkeypatch.setattr(store, "CHUNK", 64 << 10)
    version = fleet.push(bundles["big"])
    proxy = fleet.proxy()
    cuts = []

    def cut(request: str) -> int | None:  # the first GET of the padding is cut after 1.5 MB
        if request.startswith("GET") and "padding.bin" in request and not cuts:
            cuts.append(request)
            return 1_500_000
        return None

    proxy.rules.cut = cut
    f = fetcher(fleet, proxy.endpoint)
    vdir = versions_dir(fleet)
    with pytest.raises(StoreError, match="padding.bin"):
        f.fetch(vdir, version)
    part = vdir.staging / version / "padding.bin.part"
    assert 1_000_000 < part.stat().st_size < 1_500_000
    f.fetch(vdir, version)
    ranged = [r for r in proxy.requests if "padding.bin" in r and r.startswith("GET")]
    assert len(ranged) == 2 and "bytes=0-" not in ranged[1].lower() and "range: bytes=" in ranged[1].lower()
    size = (vdir.path(version) / "padding.bin").stat().st_size
    assert size == 3 << 20 and f.progress is not None


def test_the_store_down_during_a_download_then_back(fleet, bundles):
    version = fleet.push(bundles["big"])
    proxy = fleet.proxy()
    proxy.rules.cut = lambda request: 1_200_000 if "padding.bin" in request else None
    proxy.rules.down_after_cut = True  # the store dies 1.2 MB into the padding and stays down
    f = fetcher(fleet, proxy.endpoint)
    vdir = versions_dir(fleet)
    with pytest.raises(StoreError, match="padding.bin"):
        f.fetch(vdir, version)
    with pytest.raises(StoreError, match="refused"):
        f.fetch(vdir, version)  # still down: the part stays for later
    assert (vdir.staging / version / "padding.bin.part").stat().st_size > 1_000_000
    proxy.rules.cut, proxy.rules.down_after_cut = (lambda request: None), False
    proxy.set_down(False)
    assert f.fetch(vdir, version) == vdir.path(version)


def test_a_full_disk_is_found_before_the_download(fleet, bundles):
    version = fleet.push(bundles["big"])
    f = fetcher(fleet, free_bytes=lambda path: pull.MIN_FREE_BYTES + 1_000_000)  # 1 MB short for 3 MB
    vdir = versions_dir(fleet)
    with pytest.raises(NoSpace, match=r"needs 3\.\d MB more"):
        f.fetch(vdir, version)
    assert not any((vdir.staging / version).iterdir())


def test_a_disk_that_fills_up_during_the_download_gives_the_space_back(fleet, bundles, monkeypatch):
    monkeypatch.setattr(store, "CHUNK", 64 << 10)
    version = fleet.push(bundles["big"])
    seen = []

    def disk_fills(n: int) -> None:  # the write after 1 MB fails as a full disk fails it
        seen.append(n)
        if sum(seen) > 1_000_000:
            raise OSError(errno.ENOSPC, "No space left on device")

    vdir = versions_dir(fleet)
    with pytest.raises(NoSpace, match="filled up"):
        fetcher(fleet, progress=disk_fills).fetch(vdir, version)
    assert not (vdir.staging / version).exists() and not vdir.has(version)


def test_a_version_already_on_the_device_is_checked_not_fetched_again(fleet, bundles):
    version = fleet.push(bundles["v1"])
    vdir = versions_dir(fleet)
    f = fetcher(fleet)
    f.fetch(vdir, version)
    proxy = fleet.proxy()
    f = fetcher(fleet, proxy.endpoint)
    f.fetch(vdir, version)
    assert [r.split()[1].rsplit("/", 1)[-1] for r in proxy.requests] == [MANIFEST, SIGNATURE]


def test_a_signed_manifest_naming_files_outside_is_refused_before_any_download(fleet, bundles, keys):
    import hashlib

    from edgekit.fleet.keys import load_private_key
    from edgekit.fleet.signature import DOMAIN, signature_document

    manifest = json.dumps({"format_version": 1, "target": "cpu", "models": [],
                           "files": {"../../etc/cron.d/x": "0" * 64}}).encode()
    version = hashlib.sha256(manifest).hexdigest()
    private = load_private_key(keys["trusted"][0])
    put(fleet, version, MANIFEST, manifest)
    put(fleet, version, SIGNATURE, signature_document(manifest, private.sign(DOMAIN + manifest), "x"))
    with pytest.raises(Refused, match="will not write"):
        fetcher(fleet).fetch(versions_dir(fleet), version)
