"""``make pi-check``: the device side on a Raspberry Pi's own architecture (aarch64, Debian bookworm,
Python 3.11) under qemu-user emulation, compared with the same runs on this x86-64 host.

    python -m scripts.pi_check [--dist dist] [--cpu cortex-a72|cortex-a76] [--classify-images 200] ...

Two installs, as a Pi user makes them: ``pip install 'edgekit-vision[litert]'`` (lean) and
``[litert,opencv,serve]`` (full), each built for aarch64 and for x86-64 from the same wheel. Every
variant of the cpu/rpi/edgetpu bundles that ``make demo`` built runs on the same decoded frames on
both machines (scripts/pi_probe.py); ``edgekit doctor --json``, ``edgekit targets --json`` and
``edgekit serve`` (HTTP on) run emulated. One table; exit 1 on any FAIL, 2 when it cannot run.
Emulated speed is not a Pi's speed: no latency is printed (docs/pi.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from scripts import pi_userland as ul
from scripts.pi_rules import (
    FAIL,
    INFO,
    OK,
    Row,
    compare_bundle,
    compare_outputs,
    detection_difference,
    failed,
    format_table,
    human_size,
)

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "scripts" / "pi_probe.py"
BUNDLES = {"classify": ("demo-cpu", "demo-rpi", "demo-edgetpu"),
           "detect": ("detector-cpu", "detector-rpi", "detector-edgetpu")}
INSTALLS = {"lean": "litert", "full": "litert,opencv,serve"}
CLI = "import sys; from edgekit.cli import main; sys.exit(main())"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pi-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--dist", type=Path, default=REPO / "dist", help="where `make demo` put the bundles")
    p.add_argument("--cpu", choices=sorted(ul.CPUS), default="cortex-a72",
                   help="emulated core: cortex-a72 (Pi 4, default) or cortex-a76 (Pi 5)")
    p.add_argument("--classify-images", type=int, default=200, help="eval/fashion images per classifier variant")
    p.add_argument("--detect-images", type=int, default=20, help="eval/detect images per detector variant")
    p.add_argument("--cli-frames", type=int, default=10, help="eval/detect images of the edgekit run CLI check")
    p.add_argument("--serve-frames", type=int, default=300, help="frames edgekit serve processes")
    return p.parse_args(argv)


def variants(dist: Path) -> dict[str, list[str]]:
    """task -> ``BUNDLE:VARIANT`` of every model in the demo bundles; says to run make demo if one is missing."""
    missing = [b for names in BUNDLES.values() for b in names if not (dist / b / "edgekit.json").is_file()]
    if missing:
        raise ul.PiCheckError(f"{dist} lacks the bundles {', '.join(missing)}: run `make demo` first")
    specs: dict[str, list[str]] = {}
    for task, names in BUNDLES.items():
        for name in names:
            models = json.loads((dist / name / "edgekit.json").read_text())["models"]
            specs.setdefault(task, []).extend(f"{dist / name}:{m['name']}" for m in models)
    return specs


def frames(out: Path, folder: Path, count: int) -> Path:
    """``count`` images of ``folder`` spread over its sub-folders, decoded once here into one .npz."""
    from edgekit.imaging.image import IMAGE_SUFFIXES, read_image

    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    step = max(len(paths) / max(count, 1), 1.0)
    chosen = [paths[int(i * step)] for i in range(min(count, len(paths)))]
    np.savez(out, **{f"f{i:05d}": read_image(p) for i, p in enumerate(chosen)})
    return out


def run(cmd: list[str], pythonpath: list[Path], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """A command with PYTHONPATH set to exactly the given install, from a folder without a checkout in it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath)), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def last_line(done: subprocess.CompletedProcess) -> str:
    text = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return f"exit {done.returncode}: {text[-1] if text else 'no output'}"


def probe(python: list[str], path: list[Path], work: Path, npz: Path, specs: list[str], tag: str) -> tuple[dict, dict]:
    """(results.json, outputs) of scripts/pi_probe.py over ``specs``; ({'failed': line}, {}) when it died."""
    out = work / tag
    done = run([*python, str(PROBE), str(npz), str(out), *specs], path, work, timeout=3600)
    if done.returncode != 0 or not (out / "results.json").is_file():
        return {"failed": last_line(done)}, {}
    with np.load(out / "outputs.npz", allow_pickle=False) as data:
        outputs = {k: data[k] for k in data.files}
    return json.loads((out / "results.json").read_text()), outputs


def compare_rows(install: str, specs: list[str], ref: tuple[dict, dict], got: tuple[dict, dict]) -> list[Row]:
    """One row per bundle variant: aarch64 against x86-64."""
    if "failed" in ref[0] or "failed" in got[0]:
        which = "x86-64" if "failed" in ref[0] else "aarch64"
        return [Row(install, "probe", FAIL, f"{which} probe: {(ref[0] if which == 'x86-64' else got[0])['failed']}")]
    rows = []
    for i, spec in enumerate(specs):
        r, g = ref[0]["bundles"][spec], got[0]["bundles"][spec]
        if r.get("error") and not r["error"].startswith("decode"):
            rows.append(Row(install, _short(spec), FAIL, f"x86-64: {r['error']}"))
            continue
        raw = compare_outputs(ref[1], got[1], f"b{i}_")
        status, detail = compare_bundle(r.get("task", "classify"), r, g, raw)
        if r.get("error") and status == OK:  # both sides failed the same way: still a failure of the install
            status, detail = FAIL, f"{detail}; x86-64 too: {r['error']}"
        rows.append(Row(install, _short(spec), status, detail))
    return rows


def _short(spec: str) -> str:
    path, _, variant = spec.rpartition(":")
    return f"run {Path(path).name}:{variant}"


def import_row(install: str, got: dict) -> Row:
    """``import edgekit`` on aarch64 loads neither cv2 nor TensorFlow (read by the probe before anything else)."""
    if "import" not in got:
        return Row(install, "import edgekit", FAIL, got.get("failed", "no probe result"))
    info = got["import"]
    heavy = info["heavy_loaded"]
    detail = f"{info['machine']}, Python {info['python']}, edgekit {info['edgekit']}; heavy modules loaded: " + (
        ", ".join(heavy) or "none")
    return Row(install, "import edgekit", OK if not heavy and info["machine"] == "aarch64" else FAIL, detail)


def doctor_rows(python: list[str], path: list[Path], work: Path) -> list[Row]:
    """``edgekit doctor --json`` and ``edgekit targets --json`` under emulation, lean install."""
    done = run([*python, "-c", CLI, "doctor", "--json"], path, work, timeout=600)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return [Row("lean", "doctor --json", FAIL, last_line(done))]
    checks = {c["name"]: c for c in report.get("checks", [])}
    litert, tpu = checks.get("ai_edge_litert", {}), checks.get("libedgetpu", {})
    ok = report.get("machine") == "aarch64" and litert.get("status") == "ok" and tpu.get("status") == "missing" \
        and "apt" in tpu.get("fix", "")
    rows = [Row("lean", "doctor --json", OK if ok else FAIL,
                f"machine {report.get('machine')}, ai_edge_litert {litert.get('detail')}, libedgetpu "
                f"{tpu.get('status')}: {tpu.get('fix', '')}")]
    done = run([*python, "-c", CLI, "targets", "--json"], path, work, timeout=600)
    try:
        targets = {t["target"]: t for t in json.loads(done.stdout)}
    except (ValueError, KeyError, TypeError):
        return [*rows, Row("lean", "targets --json", FAIL, last_line(done))]
    runs = {name: t["run"] for name, t in targets.items()}
    ok = runs.get("cpu") is True and runs.get("rpi") is True and runs.get("edgetpu") is False \
        and "libedgetpu" in targets["edgetpu"].get("run_note", "")
    detail = ", ".join(f"{n} {'runs' if r else 'no'}" for n, r in sorted(runs.items()))
    return [*rows, Row("lean", "targets --json", OK if ok else FAIL,
                       f"{detail}; edgetpu: {targets.get('edgetpu', {}).get('run_note')}")]


def cli_row(ctx: dict, work: Path, count: int) -> Row:
    """``edgekit run BUNDLE --camera folder:eval/detect --json`` itself (the CLI, the folder source, the JPEG
    decoder of the aarch64 OpenCV wheel) on both machines, full install: the same detections frame by frame."""
    spec = f"{ctx['dist'] / 'detector-cpu'}:int8"
    cmd = ["-c", CLI, "run", spec, "--camera", f"folder:{REPO / 'eval' / 'detect'}", "--max-frames", str(count),
           "--json"]
    frames_of = {}
    for arch, (python, path) in ctx["cli"].items():
        done = run([*python, *cmd], path, work, timeout=1800)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"frame"')]
        if done.returncode != 0 or len(lines) != count:
            return Row("full", "edgekit run (CLI)", FAIL, f"{arch}: {len(lines)} frames; {last_line(done)}")
        frames_of[arch] = lines
    pairs = [detection_difference(a, b) for a, b in zip(frames_of["x86_64"], frames_of["aarch64"])]
    same, px = sum(ok for ok, _ in pairs), max(p for _, p in pairs)
    return Row("full", "edgekit run (CLI)", OK if same == count else FAIL,
               f"detector-cpu:int8 on {count} eval/detect JPEGs: {same}/{count} frames same labels, boxes max "
               f"{px:.2f} px")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (our own 127.0.0.1 endpoint)
            return answer.status, answer.read().decode()
    except OSError as exc:
        return getattr(exc, "code", 0) or 0, ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_row(python: list[str], path: list[Path], work: Path, dist: Path, count: int) -> Row:
    """``edgekit serve`` of the demo classifier for ``count`` frames, HTTP on: /healthz, /metrics, the results file."""
    clip = dist / "demo_clip.avi"  # made by make demo's benchmark; else the eval images as a folder
    camera = f"file:{clip}" if clip.is_file() else f"folder:{REPO / 'eval' / 'fashion'}"
    port, results = _free_port(), work / "serve.jsonl"
    cmd = [*python, "-c", CLI, "serve", "--bundle", str(dist / "demo-cpu"), "--camera", camera,
           "-O", "loop=true", "--http", f"127.0.0.1:{port}", "--output", str(results), "--mqtt", "off",
           "--max-frames", str(count), "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    health, metrics = 0, ""
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline and not (health == 200 and metrics):
        time.sleep(0.5)
        health, _ = _get(f"http://127.0.0.1:{port}/healthz")
        metrics = _get(f"http://127.0.0.1:{port}/metrics")[1] if health == 200 else ""
    try:
        out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return Row("full", "serve", FAIL, f"did not finish {count} frames in 10 min")
    lines, whole = _results_file(results)
    families = _metric_families(metrics)
    ok = proc.returncode == 0 and health == 200 and families > 0 and whole and lines >= count
    why = "" if proc.returncode == 0 else "; " + last_line(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    return Row("full", "serve", OK if ok else FAIL,
               f"{camera.split(':')[0]} source, /healthz {health}, /metrics {families} families, results "
               f"{lines} JSON lines{'' if whole else ' (NOT whole)'}{why}")


def _results_file(path: Path) -> tuple[int, bool]:
    """(result lines, every line whole JSON and the file ends with a newline)."""
    if not path.is_file():
        return 0, False
    text = path.read_text()
    try:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError:
        return 0, False
    return sum("frame" in r for r in rows if isinstance(r, dict)), text.endswith("\n")


def _metric_families(text: str) -> int:
    """How many metric families the Prometheus text parser reads (0 when it does not parse)."""
    if not text:
        return 0
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return len(list(text_string_to_metric_families(text)))
    except ValueError:
        return 0


def check_install(name: str, ctx: dict, work: Path) -> list[Row]:
    """Install ``name`` for both machines, probe every variant on both and compare; sizes and import too."""
    extras, results, sizes = INSTALLS[name], {}, {}
    for arch in ("x86_64", "aarch64"):
        site, cached = ul.install(ctx["wheel"], extras, arch)
        layer = ul.edgekit_layer(ctx["wheel"], work / f"edgekit-{arch}-{name}")
        path = [layer, site]
        python = ul.python_command(arch, ctx["root"], ctx["qemu"], ctx["cpu"])
        ctx.setdefault("paths", {})[name] = (python, path)  # the aarch64 one stays: doctor and serve use it
        ctx.setdefault("cli", {})[arch] = (python, path)  # the full install's, last
        sizes[arch] = f"{human_size(ul.tree_size(*path))}{' (cached)' if cached else ''}"
        for task, specs in ctx["specs"].items():
            results[arch, task] = probe(python, path, work, ctx["frames"][task], specs, f"{arch}-{name}-{task}")
    rows = [import_row(name, results["aarch64", "classify"][0]),
            Row(name, "site-packages", INFO, f"'[{extras}]' aarch64 {sizes['aarch64']}; x86-64 {sizes['x86_64']}")]
    for task, specs in ctx["specs"].items():
        rows += compare_rows(name, specs, results["x86_64", task], results["aarch64", task])
    return rows


def main(argv: list[str] | None = None) -> int:
    """Build or reuse the userland and installs, run every check, print the table; 1 on a FAIL, 2 when it cannot run."""
    args = parse_args(argv)
    t0 = time.monotonic()
    try:
        specs = variants(args.dist.resolve())
        ctx = {"qemu": ul.qemu(), "root": ul.userland(args.cpu), "cpu": args.cpu, "specs": specs,
               "dist": args.dist.resolve()}
        ul.cache_dir().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="work-", dir=ul.cache_dir()) as tmp:
            work = Path(tmp)
            ctx["wheel"] = ul.build_wheel(REPO, work / "wheel")
            ctx["frames"] = {"classify": frames(work / "classify.npz", REPO / "eval" / "fashion", args.classify_images),
                             "detect": frames(work / "detect.npz", REPO / "eval" / "detect", args.detect_images)}
            rows = []
            for name in INSTALLS:
                print(f"[{time.monotonic() - t0:5.0f} s] install '{name}': probing every variant on both machines",
                      flush=True)
                rows += check_install(name, ctx, work)
            print(f"[{time.monotonic() - t0:5.0f} s] doctor, targets, run, serve (emulated)", flush=True)
            rows += doctor_rows(*ctx["paths"]["lean"], work)
            rows.append(cli_row(ctx, work, args.cli_frames))
            rows.append(serve_row(*ctx["paths"]["full"], work, args.dist.resolve(), args.serve_frames))
    except ul.PiCheckError as exc:
        print(f"pi-check: {exc}", file=sys.stderr)
        return 2
    print()
    print(format_table(rows))
    bad = failed(rows)
    print(f"\n{len(rows) - len(bad)} of {len(rows)} rows ok, {len(bad)} FAIL; emulated {args.cpu} (qemu-user), "
          f"whole check {time.monotonic() - t0:.0f} s. Emulated speed is not a Pi's speed: no latency is reported.")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
