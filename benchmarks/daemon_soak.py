"""Soak test of ``edgekit serve``: run the real daemon process on a looping clip for minutes and
watch its memory. A daemon that runs for weeks must have a flat RSS.

The daemon runs as ``python -m edgekit.cli serve`` with a real .tflite, an MJPEG clip paced
at 30 fps and looping, results to a rotated JSON-lines file, the HTTP endpoint and (when
``mosquitto`` is installed) a real broker. Every ``--interval`` seconds the script samples
the process's RSS from /proc and the daemon's /stats. It reports RSS after warm-up and at
the end, and the slope of a least-squares line through the samples (MB per minute, and MB per
hour extrapolated), then stops the daemon with SIGTERM and times the exit.

    python benchmarks/daemon_soak.py --minutes 3
    python benchmarks/daemon_soak.py --minutes 30 --json soak.json --plot soak.png

Figures, not pass/fail.
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
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from daemon_throughput import build_model, write_clip  # noqa: E402 - sibling bench script

from edgekit.bench.machine import machine_context  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc (Linux)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_broker(workdir: Path) -> tuple[subprocess.Popen | None, int | None]:
    """A mosquitto on 127.0.0.1 when installed (the daemon then publishes every result)."""
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None)
    if binary is None:
        return None, None
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    return proc, port


def get_stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as resp:
        return json.loads(resp.read())


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 3:
        return float("nan")
    t, m = np.array(samples).T
    return float(np.polyfit(t / 60.0, m, 1)[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="soak duration (30 for the full run)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds excluded from the RSS figures")
    parser.add_argument("--model", type=Path, help=".tflite to serve (default: build a 224x224 CNN)")
    parser.add_argument("--fps", type=float, default=30.0, help="camera rate of the looping clip")
    parser.add_argument("--no-mqtt", action="store_true", help="do not start a broker even if installed")
    parser.add_argument("--json", type=Path, help="write the report and samples here")
    parser.add_argument("--plot", type=Path, help="write an RSS-over-time PNG here (needs matplotlib)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = args.model or build_model(workdir / "cnn224.tflite")
        clip = write_clip(workdir / "loop.avi", 640, 480, frames=300, fps=args.fps)
        broker, broker_port = (None, None) if args.no_mqtt else start_broker(workdir)
        mqtt = f'[mqtt]\nhost = "127.0.0.1"\nport = {broker_port}\ndevice = "soak"\n' if broker_port else ""
        config = workdir / "serve.toml"
        config.write_text(
            f'[model]\npath = "{model}"\nthreads = 1\n'
            f'[camera]\nuri = "file:{clip}"\n[camera.options]\nloop = true\nfps = {args.fps}\n'
            f'[output]\njsonl = "{workdir / "results.jsonl"}"\nmax_bytes = 1000000\nbackups = 2\n'
            f'[http]\nlisten = "127.0.0.1:0"\n{mqtt}'
        )
        err_path = workdir / "serve.err"
        with err_path.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "edgekit.cli", "serve", "--config", str(config)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            port = None
            for _ in range(300):
                m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", err_path.read_text())
                if m:
                    port = int(m.group(1))
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon exited: {err_path.read_text()}")
                time.sleep(0.1)
            if port is None:
                raise RuntimeError("daemon did not report its HTTP port")
            t0 = time.monotonic()
            samples = []
            while time.monotonic() - t0 < args.minutes * 60:
                stats = get_stats(port)
                samples.append(
                    {
                        "t_s": round(time.monotonic() - t0, 2),
                        "rss_mb": round(rss_mb(proc.pid), 3),
                        "processed": stats["frames"]["processed"],
                        "skipped": stats["frames"]["skipped"],
                        "process_fps": stats["fps"]["process"],
                        "e2e_p99_ms": stats["latency_ms"]["end_to_end"].get("p99"),
                        "ready": stats["health"]["ready"],
                    }
                )
                time.sleep(args.interval)
            final = get_stats(port)
            final_rss = rss_mb(proc.pid)
            t_stop = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
            stop_s = time.monotonic() - t_stop
            files = sorted(p.name for p in workdir.glob("results.jsonl*"))
            disk = sum(p.stat().st_size for p in workdir.glob("results.jsonl*"))
        finally:
            if proc.poll() is None:
                proc.kill()
            if broker is not None:
                broker.terminate()
                broker.wait(10)

    steady = [(s["t_s"], s["rss_mb"]) for s in samples if s["t_s"] >= args.warmup] or [
        (s["t_s"], s["rss_mb"]) for s in samples
    ]
    half = steady[len(steady) // 2 :]
    slope = slope_mb_per_min(steady)
    report = {
        "context": machine_context(),
        "minutes": args.minutes,
        "mqtt": bool(broker_port),
        "frames_processed": final["frames"]["processed"],
        "frames_skipped": final["frames"]["skipped"],
        "errors": final["errors"],
        "mean_fps": round((samples[-1]["processed"] - samples[0]["processed"])
                          / max(1e-9, samples[-1]["t_s"] - samples[0]["t_s"]), 2),
        "e2e_ms": final["latency_ms"]["end_to_end"],
        "inference_ms": final["latency_ms"]["inference"],
        "rss_first_mb": samples[0]["rss_mb"],
        "rss_after_warmup_mb": steady[0][1],
        "rss_end_mb": round(final_rss, 3),
        "rss_max_mb": max(s["rss_mb"] for s in samples),
        "rss_slope_mb_per_min": round(slope, 4),
        "rss_slope_mb_per_hour": round(slope * 60, 2),
        "rss_slope_second_half_mb_per_min": round(slope_mb_per_min(half), 4),
        "sigterm_exit_s": round(stop_s, 3),
        "exit_code": rc,
        "result_files": files,
        "result_bytes_on_disk": disk,
        "samples": samples,
    }
    print(
        f"soak {args.minutes} min: {report['frames_processed']} frames ({report['mean_fps']} fps), "
        f"{report['frames_skipped']} skipped, errors {report['errors']}, mqtt {report['mqtt']}"
    )
    print(
        f"RSS first {report['rss_first_mb']:.1f} MB, after {args.warmup:.0f} s warm-up "
        f"{report['rss_after_warmup_mb']:.1f} MB, end {report['rss_end_mb']:.1f} MB, "
        f"max {report['rss_max_mb']:.1f} MB"
    )
    print(
        f"RSS slope {report['rss_slope_mb_per_min']:+.4f} MB/min ({report['rss_slope_mb_per_hour']:+.2f} MB/h); "
        f"second half {report['rss_slope_second_half_mb_per_min']:+.4f} MB/min"
    )
    print(
        f"end-to-end p50 {report['e2e_ms'].get('p50')} ms p99 {report['e2e_ms'].get('p99')} ms; "
        f"SIGTERM -> exit {report['sigterm_exit_s']} s, code {rc}; results on disk {files} ({disk} bytes)"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([s["t_s"] / 60 for s in samples], [s["rss_mb"] for s in samples], marker=".")
        ax.axvline(args.warmup / 60, color="grey", linestyle=":", label="end of warm-up")
        ax.set_xlabel("minutes")
        ax.set_ylabel("RSS (MB)")
        ax.set_title(f"edgekit serve soak: slope {slope:+.4f} MB/min")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
