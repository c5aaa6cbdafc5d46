"""Mutation testing of the core modules with mutmut, each module against its own fast tests.

    python -m scripts.mutate                 # every module in MODULES (make mutate)
    python -m scripts.mutate bundle gate     # some of them
    python -m scripts.mutate --survivors     # also list each survivor's diff

For each module the checkout's files (``git ls-files``) are copied into a scratch directory with
a ``setup.cfg`` whose ``[mutmut]`` section mutates that one file and runs that module's tests, so
the modules do not share mutmut's state and each run stays small. mutmut maps every test to the
functions it calls and runs only those tests per mutant. Tests that need TensorFlow (a model
converted in a session fixture) are left out: each mutant runs in a fresh fork, which would
convert again. The kill rates go in docs/mutation.md by hand, with a reason for each survivor
that is equivalent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Module:
    """One core module: the file mutated, pytest arguments that narrow its tests (``-k``, ``-m``), and
    optionally mutmut name globs (``edgekit.x.x_func*``) when only some functions are core. Its tests
    are found by the layout's path rule (:func:`tests_of`), not listed by hand."""

    source: str
    select: tuple[str, ...] = ()
    only: tuple[str, ...] = field(default=())


def tests_of(source: str) -> list[str]:
    """The path rule of the mirrored test layout: ``edgekit/<package>/<module>.py`` is tested in
    ``tests/<package>/``, a top-level ``edgekit/<module>.py`` in ``tests/test_<module>*.py``."""
    parts = Path(source).relative_to("edgekit").parts
    if len(parts) > 1:
        return [f"tests/{parts[0]}"]
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob(f"test_{Path(source).stem}*.py"))


MODULES: dict[str, Module] = {
    "bundle": Module("edgekit/bundle.py", ("-k", "not adapter and not hashes_every_bundle_file_once and not faults")),
    "tensors": Module("edgekit/heads/tensors.py", ("-m", "not slow")),
    "classify": Module("edgekit/heads/classify.py", ("-m", "not slow")),
    "metrics": Module("edgekit/metrics.py"),
    "image": Module("edgekit/imaging/image.py"),
    # the gate's summary over every variant; the ratio check itself (BuildContext.verify) runs only
    # inside a real build, so its `>=` boundary is held by the slow tests/builders/gate/test_verify_gate.py builds
    "gate": Module("edgekit/builders/publish.py", ("-m", "not slow", "-k", "verify"),
                   ("edgekit.builders.publish.x_verification_summary*", "edgekit.builders.publish.x__why*")),
    # the tests that convert a model (the `model` fixture) are left out by name
    "compiler_report": Module("edgekit/builders/edgetpu/report.py", (
        "-m", "not slow", "-k", "edgetpu_compiler and not (test_find_compiler or test_absent_compiler or "
        "test_all_mapped or test_partly_mapped or test_zero_ops or test_compiler_failure or test_exit_0_without or "
        "test_timeout_kills or test_bad_min_runtime or test_threshold_validates or test_build_step or "
        "test_real_compiler_maps)")),
    # the daemon's fault paths: failure streak, reopen with backoff, close (opening a bundle is test_daemon's)
    "supervisor": Module("edgekit/serve/supervisor.py", ("-k", "supervisor and not configured"), tuple(
        f"edgekit.serve.supervisor.x\u01c1ModelSupervisor\u01c1{f}__mutmut_*"
        for f in ("failed", "succeeded", "retry", "close", "ok", "open"))),
    "mailbox": Module("edgekit/camera/mailbox.py", ("-k", "mailbox")),
    # the detect head: YOLO decoding, NMS, boxes back onto the frame (the TF-converted models are slow tests)
    "detect_yolo": Module("edgekit/detect/yolo.py", ("-m", "not slow")),
    "detect_nms": Module("edgekit/detect/nms.py", ("-m", "not slow")),
    "detect_boxes": Module("edgekit/detect/boxes.py", ("-m", "not slow")),
}


def _setup_cfg(module: Module) -> str:
    """The [mutmut] section for one module (setup.cfg lists: one value a line)."""
    tests, args = tests_of(module.source), list(module.select)
    lines = ["[mutmut]", "source_paths = edgekit", f"only_mutate = {module.source}",
             "also_copy =", "    models", "    calib", "    eval", "    deploy",
             "pytest_add_cli_args_test_selection ="]
    lines += [f"    {t}" for t in tests]
    lines += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -q"]
    lines += [f"    {a}" for a in args]
    return "\n".join(lines) + "\n"


def _copy_checkout(dest: Path) -> None:
    """The tracked and new (not ignored) files of the checkout, symlinks kept as links."""
    git = shutil.which("git") or "git"
    names = subprocess.run([git, "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src, dst = ROOT / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def run_module(name: str, module: Module, max_children: int, survivors: bool) -> dict:
    """Mutate one module in a scratch copy; mutmut's counts plus the survivors' names (and diffs)."""
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    with tempfile.TemporaryDirectory(prefix=f"edgekit-mutate-{name}-") as scratch:
        work = Path(scratch)
        _copy_checkout(work)
        (work / "setup.cfg").write_text(_setup_cfg(module))
        t0 = time.monotonic()
        run = subprocess.run([mutmut, "run", "--max-children", str(max_children), *module.only], cwd=work,
                             capture_output=True, text=True)
        seconds = time.monotonic() - t0
        if run.returncode != 0:
            tail = (run.stdout + run.stderr)[-2000:]
            return {"module": name, "error": f"mutmut run failed (exit {run.returncode}): {tail}"}
        subprocess.run([mutmut, "export-cicd-stats"], cwd=work, check=True, capture_output=True)
        stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
        listed = subprocess.run([mutmut, "results"], cwd=work, check=True, capture_output=True, text=True).stdout
        # "name: status" for every mutant not killed; timeouts were noticed by the tests
        rows = [line.strip().rsplit(": ", 1) for line in listed.splitlines() if ": " in line]
        names = [n for n, status in rows if status in ("survived", "no tests")]
        diffs = _diffs(work, names) if survivors and names else {}
    return {"module": name, "source": module.source, "seconds": round(seconds), **stats,
            "not_killed": names, "diffs": diffs}


_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
out = {}
for name in json.loads(sys.stdin.read()):
    diff = get_diff_for_mutant(name)
    out[name] = [ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
print(json.dumps(out))
"""


def _diffs(work: Path, names: list[str]) -> dict[str, list[str]]:
    """The changed lines of each mutant, read in one process (``mutmut show`` per mutant takes seconds)."""
    run = subprocess.run([sys.executable, "-c", _DIFFS], cwd=work, input=json.dumps(names), capture_output=True,
                         text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def kill_rate(r: dict) -> float | None:
    """Killed (timeouts count: the tests noticed) over every mutant that was run; no-test mutants
    count against the rate, since no test would notice them either."""
    counted = r["killed"] + r["timeout"] + r["survived"] + r["no_tests"] + r["suspicious"] + r["segfault"]
    return (r["killed"] + r["timeout"]) / counted if counted else None  # mutants not run (other functions): out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--survivors", action="store_true", help="print each surviving mutant's diff")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module {unknown[0]!r}; choose from {', '.join(MODULES)}")
    results = []
    print("| module | file | mutants | killed | survived | no tests | kill rate | time |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.modules or list(MODULES):
        r = run_module(name, MODULES[name], args.max_children, args.survivors)
        results.append(r)
        if "error" in r:
            print(f"| {name} | {MODULES[name].source} | {r['error']} |")
            continue
        rate = kill_rate(r)
        run = r["killed"] + r["timeout"] + r["survived"] + r["no_tests"] + r["suspicious"] + r["segfault"]
        print(f"| {name} | {r['source']} | {run} | {r['killed'] + r['timeout']} | "
              f"{r['survived']} | {r['no_tests']} | {rate:.0%} | {r['seconds']} s |" if rate is not None else
              f"| {name} | {r['source']} | 0 | | | | n/a | {r['seconds']} s |", flush=True)
    for r in results:
        for mutant, diff in r.get("diffs", {}).items():
            print(f"\n{mutant}\n" + "\n".join(diff))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
