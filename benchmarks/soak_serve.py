"""One-hour soak of ``edgekit serve`` under the faults a device meets (issue 38): MQTT at QoS 1
to a real mosquitto that is stopped for ``--outage-s`` seconds every ``--outage-every`` seconds,
a hot-swap between two bundle copies every ``--swap-every`` seconds (an atomic symlink flip and
``POST /reload``, as docs/serve.md "Updating the model in place" says), and ``/metrics`` and
``/healthz`` scraped every second.

At the end (and every 30 s in ``<outdir>/progress.json``, so a stopped run still has figures) it
reports the daemon's RSS slope after warm-up (MB/hour, from /proc), the results lost and
duplicated (the daemon's JSON-lines file against what a subscriber received, keyed by frame and
time) and the scrapes answered out of those asked.

    python benchmarks/soak_serve.py --bundle /tmp/soak_dist/demo-cpu --minutes 60 --outdir /tmp/soak

Figures, not pass/fail (goals: lost 0, duplicated 0, every scrape answered, a flat RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "soak/dev"


def free_port() -> int:
    """A TCP port nobody listens on now (the broker keeps it across its restarts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc (Linux)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


class Broker:
    """A mosquitto that can be stopped and started on the same port. Persistence is on so the
    subscriber's QoS 1 session (and what the broker queued for it) outlives an outage: a result
    the daemon published is then never lost by the soak's own subscriber."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
            f"persistence_location {workdir}/\nmax_queued_messages 0\n"
        )
        self.log = (workdir / "mosquitto.log").open("a")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen([binary, "-c", str(self.conf)], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # listening before anyone is told it is back
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: mosquitto writes its persistence file first
            self.proc.wait(20)
        self.proc = None


class Subscriber:
    """Receives ``<topic>/result`` at QoS 1 in a persistent session, keyed by (frame, time)."""

    def __init__(self, port: int):
        self.received: list[tuple] = []
        self.swaps: dict[str, int] = {}
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="soak-subscriber",
                                  clean_session=False)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.2, 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        client.subscribe([(f"{TOPIC}/result", 1), (f"{TOPIC}/events", 1)])

    def _on_message(self, client, userdata, msg) -> None:
        data = json.loads(msg.payload)
        with self.lock:
            if msg.topic.endswith("/events"):
                if data.get("type") == "model_swap":
                    key = str(data.get("result"))
                    self.swaps[key] = self.swaps.get(key, 0) + 1
            else:
                self.received.append((data.get("frame"), data.get("time")))

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class Scraper(threading.Thread):
    """GET /metrics and /healthz once a second; an answer is any HTTP status within 5 s."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.asked, self.answered, self.stop = port, 0, 0, threading.Event()
        self.statuses: dict[str, int] = {}

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for path in ("/metrics", "/healthz"):
                self.asked += 1
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                        r.read()
                        code = r.status
                except urllib.error.HTTPError as exc:  # a 503 from /healthz is an answer
                    code = exc.code
                except OSError:
                    continue
                self.answered += 1
                key = f"{path} {code}"
                self.statuses[key] = self.statuses.get(key, 0) + 1


def prepare_bundles(source: Path, workdir: Path) -> Path:
    """Two copies of one bundle with different manifests (so a flip is a real swap), behind a
    symlink the daemon serves."""
    for name in ("a", "b"):
        dest = workdir / "bundles" / name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(source, dest)
        manifest = dest / "edgekit.json"
        data = json.loads(manifest.read_text())
        data.setdefault("provenance", {})["soak_copy"] = name  # changes the manifest's sha256 only
        manifest.write_text(json.dumps(data, indent=2))
    link = workdir / "bundle"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(workdir / "bundles" / "a")
    return link


def flip(link: Path) -> str:
    """Point the bundle link at the other copy atomically (a new link, then a rename)."""
    new = "b" if os.readlink(link).endswith("/a") else "a"
    tmp = link.with_name("bundle.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(link.parent / "bundles" / new)
    os.replace(tmp, link)
    return new


def write_config(workdir: Path, link: Path, broker_port: int, fps: float) -> Path:
    config = workdir / "serve.toml"
    config.write_text(
        f'[model]\npath = "{link}"\nthreads = 1\n'
        f'[camera]\nuri = "synthetic:64x64@{fps:g}"\n'
        f'[output]\njsonl = "{workdir / "results.jsonl"}"\nmax_bytes = 2000000000\n'
        f'[http]\nlisten = "127.0.0.1:0"\nreload = true\n'
        f'[mqtt]\nhost = "127.0.0.1"\nport = {broker_port}\ndevice = "soak"\ntopic = "{TOPIC}"\n'
        f'qos = 1\npublish = "every"\nqueue_size = 20000\nqueue_file = "{workdir / "mqtt-queue.jsonl"}"\n'
    )
    return config


def start_daemon(workdir: Path, config: Path) -> tuple[subprocess.Popen, int]:
    """``edgekit serve`` as its own process; returns it and its HTTP port (from its log)."""
    err_path = workdir / "serve.log"
    err = err_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "serve", "--config", str(config)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    for _ in range(600):
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", err_path.read_text())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited: {err_path.read_text()[-2000:]}")
        time.sleep(0.1)
    raise RuntimeError("daemon did not report its HTTP port")


def produced(workdir: Path) -> list[tuple]:
    """(frame, time) of every result the daemon wrote to its JSON-lines file."""
    keys = []
    for path in sorted(workdir.glob("results.jsonl*")):
        for line in path.read_text().splitlines():
            if line.strip():
                data = json.loads(line)
                keys.append((data.get("frame"), data.get("time")))
    return keys


def figures(workdir: Path, samples: list, warmup_s: float, sub: Subscriber, scraper: Scraper,
            events: dict, settle_s: float = 0.0) -> dict:
    """The report; ``settle_s`` leaves the newest results (still in flight) out of the loss count."""
    made = produced(workdir)
    with sub.lock:
        got = list(sub.received)
        swaps = dict(sub.swaps)
    newest = max((t for _, t in made if t), default=0)
    counted = {k for k in made if not settle_s or (k[1] or 0) < newest - settle_s}
    got_set = set(got)
    steady = [(t, m) for t, m in samples if t >= warmup_s] or samples
    slope_h = float(np.polyfit(*np.array(steady).T, 1)[0]) * 3600 if len(steady) >= 3 else float("nan")
    return {
        "elapsed_min": round(samples[-1][0] / 60, 2) if samples else 0,
        "produced": len(made), "received": len(got), "received_unique": len(got_set),
        "lost": len(counted - got_set), "duplicated": len(got) - len(got_set),
        "received_not_produced": len(got_set - set(made)),
        "rss_after_warmup_mb": round(steady[0][1], 2) if steady else None,
        "rss_end_mb": round(samples[-1][1], 2) if samples else None,
        "rss_max_mb": round(max(m for _, m in samples), 2) if samples else None,
        "rss_slope_mb_per_hour": round(slope_h, 3),
        "scrapes_answered": scraper.answered, "scrapes_total": scraper.asked,
        "scrape_statuses": dict(scraper.statuses),
        "outages": events["outages"], "swaps_requested": events["swaps"], "swap_events": swaps,
    }


def soak(args: argparse.Namespace, workdir: Path) -> dict:
    """Run the daemon through the schedule; returns the final figures."""
    link = prepare_bundles(args.bundle, workdir)
    broker = Broker(workdir)
    broker.start()
    sub = Subscriber(broker.port)
    proc, http_port = start_daemon(workdir, write_config(workdir, link, broker.port, args.fps))
    scraper = Scraper(http_port)
    scraper.start()
    samples, events = [], {"outages": 0, "swaps": 0}
    t0 = time.monotonic()
    next_outage, next_swap, next_progress = args.outage_every / 2, args.swap_every, 30.0
    try:
        while (now := time.monotonic() - t0) < args.minutes * 60:
            samples.append((now, rss_mb(proc.pid)))
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {proc.returncode}")
            if now >= next_outage:
                broker.stop()
                events["outages"] += 1
                time.sleep(args.outage_s)  # the daemon queues meanwhile
                broker.start()
                next_outage += args.outage_every
            if now >= next_swap:
                flip(link)
                req = urllib.request.Request(f"http://127.0.0.1:{http_port}/reload", method="POST", data=b"")
                try:
                    urllib.request.urlopen(req, timeout=10).read()
                    events["swaps"] += 1
                except OSError as exc:
                    print(f"reload failed: {exc}", flush=True)
                next_swap += args.swap_every
            if now >= next_progress:
                rep = figures(workdir, samples, args.warmup, sub, scraper, events, settle_s=90)
                (workdir / "progress.json").write_text(json.dumps(rep, indent=2) + "\n")
                next_progress += 30
            time.sleep(5)
        scraper.stop.set()  # scrapes of a daemon being stopped on purpose are not counted
        scraper.join(15)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        time.sleep(5)  # the last acknowledged messages reach the subscriber
    finally:
        scraper.stop.set()
        if proc.poll() is None:
            proc.kill()
        sub.close()
        broker.stop()
    report = figures(workdir, samples, args.warmup, sub, scraper, events)
    report["exit_code"] = rc
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True, help="a built bundle directory")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--outdir", type=Path, default=Path("/tmp/soak"))
    parser.add_argument("--fps", type=float, default=15.0, help="synthetic camera rate")
    parser.add_argument("--outage-every", type=float, default=600.0, help="seconds between broker stops")
    parser.add_argument("--outage-s", type=float, default=45.0, help="seconds the broker stays down")
    parser.add_argument("--swap-every", type=float, default=180.0, help="seconds between hot-swaps")
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds left out of the RSS slope")
    args = parser.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    report = soak(args, args.outdir)
    (args.outdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
