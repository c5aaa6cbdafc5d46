"""The ``edgekit targets`` verb: the shipped targets and what this machine can do with each."""

from __future__ import annotations

import argparse
import json


def configure(p: argparse.ArgumentParser) -> None:
    """Add the verb's arguments."""
    p.add_argument("--json", action="store_true", help="machine-readable output")


def main(args: argparse.Namespace) -> int:
    """Print one line per target: name, build here?, run here?, summary; then the accelerators
    edgekit knows but cannot build for here (``edgekit.target.UNBUILDABLE``), with the reason."""
    from edgekit.target import UNBUILDABLE, available_targets, load_target

    rows = []
    for name in available_targets():
        t = load_target(name)
        can_build, why_build = t.can_build()
        can_run, why_run = t.can_run()
        rows.append({"target": name, "summary": t.summary, "build": can_build, "build_note": why_build,
                     "run": can_run, "run_note": why_run})
    for t in UNBUILDABLE.values():
        rows.append({"target": t.name, "summary": t.summary, "build": False, "build_note": f"{t.why}; {t.fix}",
                     "run": False, "run_note": "no edgekit runtime adapter yet"})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["target"]) for r in rows)
    print(f"{'target'.ljust(width)}  build  run    summary")
    for r in rows:
        print(f"{r['target'].ljust(width)}  {'yes' if r['build'] else 'no ':5}  {'yes' if r['run'] else 'no ':5}  "
              f"{r['summary']}")
        for key in ("build", "run"):
            if not r[key]:
                print(f"{''.ljust(width)}  {key}: {r[key + '_note']}")
    return 0
