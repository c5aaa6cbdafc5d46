"""Slow clients against `edgekit serve`'s HTTP endpoint: can they starve /healthz and /metrics?

A real daemon (synthetic camera, a real ONNX model, the real endpoint) runs in a child
process, so the clients do not share its interpreter lock. Other processes (at niceness 10:
on a fleet they would be other machines) keep ``--slow`` slow clients open (each connects,
sends half a request line, then one byte a second, and reconnects when the server cuts it
off: the pressure never lets up) and, once they are in, fire rounds of ``--scrapes``
concurrent scrapes (half /metrics, half /healthz, each on a fresh connection, from 4
processes) every 1.5 s for ``--seconds``, while a probe (niceness 0) asks /healthz every 50 ms.

    python benchmarks/http_slow_clients.py
    python benchmarks/http_slow_clients.py --slow 300 --scrapes 200 --seconds 15 --json slow.json

Every client comes from 127.0.0.1, which the per-peer cap leaves alone (it is the device
itself): this measures the worst case, slow clients the cap does not stop. Figures, not
pass/fail (goal: /healthz p99 < 100 ms and every scrape answered).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # real_models: a tiny real ONNX model, no TensorFlow

SCRAPE_TIMEOUT_S = 10.0
ROUND_PERIOD_S = 1.5  # a burst of scrapes every this
CLIENT_NICE = 10  # the slow clients and the scrape bursts run at this niceness; the probe at 0
BURST_PROCESSES = 4  # the bursts come from this many processes (a client is not the bottleneck)


def serve(address_queue, stop, workdir: str) -> None:
    """The child: a real daemon on a synthetic camera until ``stop`` is set."""
    from edgekit.imaging.image import InputSpec
    from edgekit.serve.config.load import ServeConfig, override
    from edgekit.serve.daemon import Daemon
    from tests.helpers.real_models import onnx_runtime

    config = ServeConfig()
    for table, values in {"model": {"path": "tiny"}, "camera": {"uri": "synthetic:64x48@30"},
                          "output": {"jsonl": str(Path(workdir) / "results.jsonl")},
                          "http": {"listen": "127.0.0.1:0"}}.items():
        config = override(config, table, **values)
    spec = InputSpec(shape=(1, 16, 16, 3))
    daemon = Daemon(config, labels=["cat", "dog", "bird"],
                    runtime_factory=lambda: onnx_runtime(spec, weights=[0.0, 0.5, 0.0], bias=[-2.3, -0.36, -1.6]))
    daemon.start()
    threading.Thread(target=daemon.run, daemon=True).start()
    address_queue.put(daemon.http_address)
    cpu0 = time.process_time()
    stop.wait()
    cpu = time.process_time() - cpu0
    frames = daemon.stats()["frames"]["processed"]
    daemon.stop()
    address_queue.put({**getattr(daemon.http, "connection_counts", {}), "cpu_s": round(cpu, 2), "frames": frames})
    daemon.close()


async def slow_client(address, stop, tally: dict) -> None:
    """Half a request line, then a byte a second; reconnect whenever the server cuts it off."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), SCRAPE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            tally["connect_failed"] += 1
            await asyncio.sleep(0.5)
            continue
        tally["connections"] += 1
        tally["open"] += 1
        try:
            writer.write(b"GET /metr")
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(4096), 1.0)
                except asyncio.TimeoutError:
                    writer.write(b"i")
                    await writer.drain()
                    continue
                if not data:  # the server's deadline ran out: it closed the connection
                    tally["cut"] += 1
                    break
                tally["answered"] += 1  # a refusal (503) or an error status
        except OSError:
            tally["cut"] += 1
        finally:
            tally["open"] -= 1
            writer.close()


async def slow_clients(address, count: int, stop, ready) -> dict:
    """``count`` slow clients until ``stop`` is set; ``ready`` is set once they are all open."""
    tally = dict.fromkeys(("connections", "open", "cut", "answered", "connect_failed"), 0)
    tasks = [asyncio.create_task(slow_client(address, stop, tally)) for _ in range(count)]
    deadline = time.monotonic() + 20
    while tally["open"] < count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    ready.set()
    samples = []
    while not stop.is_set():
        await asyncio.sleep(0.2)
        samples.append(tally["open"])
    await asyncio.gather(*tasks)
    return {**tally, "open_median": float(np.median(samples)) if samples else 0.0}


def get(address, path: str) -> tuple[int | None, float]:
    """One GET on a fresh connection (blocking): (status or None when unanswered, seconds)."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(address, timeout=SCRAPE_TIMEOUT_S) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: edgekit\r\n\r\n".encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        parts = b"".join(chunks).split(b" ", 2)
        status = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
    except OSError:
        status = None
    return status, time.perf_counter() - t0


def scrape_rounds(address, paths: list[str], starts: list[float]) -> list:
    """At each of ``starts`` (monotonic), GET every path at once, one thread each."""
    found = []
    with ThreadPoolExecutor(len(paths)) as pool:
        for start in starts:
            time.sleep(max(0.0, start - time.monotonic()))
            found.extend(zip(paths, pool.map(lambda p: get(address, p), paths)))
    return found


def probe(address, stop_at: float) -> list:
    """/healthz every 50 ms until ``stop_at``, from a process of its own."""
    found = []
    while time.monotonic() < stop_at:
        found.append(("/healthz", get(address, "/healthz")))
        time.sleep(0.05)
    return found


def _run(results, name, fn, *args) -> None:
    if name != "probe":  # on a fleet the scrapers and attackers are other machines: here they
        os.nice(CLIENT_NICE)  # yield the CPU to the daemon, or they would measure themselves
    results.put((name, fn(*args)))


def summary(rounds: list, probed: list, tally: dict) -> dict:
    """Percentiles (ms) and counts: ``rounds`` and ``probed`` are lists of (path, (status, s))."""
    def pct(values):
        if not values:
            return {"n": 0}
        ms = np.array(values) * 1000
        return {"n": len(ms), "p50_ms": round(float(np.percentile(ms, 50)), 2),
                "p99_ms": round(float(np.percentile(ms, 99)), 2), "max_ms": round(float(ms.max()), 2)}

    burst_health = [t for p, (s, t) in rounds if p == "/healthz" and s is not None]
    probe_health = [t for _, (s, t) in probed if s is not None]
    every = rounds + probed
    return {
        "healthz_all": pct(burst_health + probe_health), "healthz_in_bursts": pct(burst_health),
        "healthz_probe": pct(probe_health),
        "metrics": pct([t for p, (s, t) in rounds if p == "/metrics" and s is not None]),
        "answered": sum(1 for _, (s, _t) in every if s == 200), "total": len(every),
        "statuses": sorted({str(s) for _, (s, _t) in every}), "slow_clients": tally,
    }


def attack(ctx, address, args) -> dict:
    """Slow clients, then scrape rounds (from ``BURST_PROCESSES`` processes) and a probe."""
    results, stop, ready = ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_run, args=(results, "slow", lambda: asyncio.run(
        slow_clients(address, args.slow, stop, ready)))), ]
    procs[0].start()
    ready.wait(30)
    t0 = time.monotonic() + 2.0  # every slow client has started trickling
    starts = [t0 + k * ROUND_PERIOD_S for k in range(max(1, int(args.seconds / ROUND_PERIOD_S)))]
    paths = (["/metrics", "/healthz"] * args.scrapes)[:args.scrapes]
    for i in range(BURST_PROCESSES):
        share = paths[i::BURST_PROCESSES]
        if share:
            procs.append(ctx.Process(target=_run, args=(results, f"burst{i}", scrape_rounds, address, share, starts)))
    procs.append(ctx.Process(target=_run, args=(results, "probe", probe, address, starts[-1] + ROUND_PERIOD_S)))
    for proc in procs[1:]:
        proc.start()
    found = {}
    for _ in procs[1:]:
        name, value = results.get(timeout=args.seconds + 120)
        found[name] = value
    stop.set()
    name, found["slow"] = results.get(timeout=30)
    for proc in procs:
        proc.join(10)
    rounds = [r for name, value in found.items() if name.startswith("burst") for r in value]
    return summary(rounds, found["probe"], found["slow"])


def main(argv: list[str] | None = None) -> int:
    """Run the attack against a daemon in a child process; print (and optionally save) figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slow", type=int, default=300, help="slow clients kept open (default 300)")
    ap.add_argument("--scrapes", type=int, default=200, help="concurrent scrapes per round (default 200)")
    ap.add_argument("--seconds", type=float, default=15.0, help="how long the scrape rounds last (default 15)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    ctx = multiprocessing.get_context("fork")  # before any thread exists in this process
    addresses, stop = ctx.Queue(), ctx.Event()
    with tempfile.TemporaryDirectory(prefix="edgekit-slow-") as workdir:
        child = ctx.Process(target=serve, args=(addresses, stop, workdir), daemon=True)
        child.start()
        address = tuple(addresses.get(timeout=60))
        time.sleep(1.0)  # frames flow: /healthz is 200
        figures = attack(ctx, address, args)
        stop.set()
        figures["server_counts"] = addresses.get(timeout=30)
        child.join(30)
    figures.update(cores=os.cpu_count(), load_average=[round(x, 2) for x in os.getloadavg()],
                   slow=args.slow, scrapes_per_round=args.scrapes)
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


def report(figures: dict) -> None:
    """The figures as a few lines."""
    h, m, tally = figures["healthz_all"], figures["metrics"], figures["slow_clients"]
    print(f"{figures['slow']} slow clients ({tally['open_median']:.0f} open at the median moment; "
          f"{tally['cut']} cut off by the server's deadline and reconnected, {tally['connections']} connections)")
    print(f"/healthz: p50 {h.get('p50_ms')} ms, p99 {h.get('p99_ms')} ms, max {h.get('max_ms')} ms over {h['n']} "
          f"(inside the bursts: p99 {figures['healthz_in_bursts'].get('p99_ms')} ms; "
          f"probe every 50 ms: p99 {figures['healthz_probe'].get('p99_ms')} ms)")
    print(f"/metrics: p50 {m.get('p50_ms')} ms, p99 {m.get('p99_ms')} ms over {m['n']}")
    print(f"scrapes answered 200: {figures['answered']}/{figures['total']} (statuses {figures['statuses']}), "
          f"{figures['scrapes_per_round']} at once per round")
    print(f"server: {figures['server_counts']}; {figures['cores']} cores, load average {figures['load_average']}")


if __name__ == "__main__":
    raise SystemExit(main())
