"""``edgekit doctor``: print what this machine can build and run, what is missing, and the fix
for each. The checks are library code in :mod:`edgekit.doctor`; this module only prints.
Always exits 0: doctor reports, it does not fail.
"""

from __future__ import annotations

import argparse
import json

from edgekit.doctor import MISSING, OK, WARN, Check, Env, report, run_checks, targets_summary


def format_table(checks: list[Check]) -> str:
    """A fixed-width table, then each problem with its fix, then the targets that can run here."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'group':8} {'check'.ljust(width)}  {'status':8} detail"]
    for c in checks:
        lines.append(f"{c.group:8} {c.name.ljust(width)}  {c.status.upper() if c.status != OK else 'ok':8} {c.detail}")
    fixes = [c for c in checks if c.fix and c.status in (MISSING, WARN)]
    if fixes:
        lines += ["", "to fix:"]
        lines += [f"  {c.name}: {c.fix}" for c in fixes]
    lines.append("")
    for target, t in targets_summary(checks).items():
        lines.append(
            f"target {target:8} "
            + ("can run here" if t["can_run"] else "cannot run here: needs " + "; ".join(t["missing"]))
        )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``doctor`` arguments."""
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def main(args: argparse.Namespace) -> int:
    """Print the report; always 0 (a missing piece is information, not an error)."""
    checks = run_checks(Env())  # Env named here so a test can point it at a fake root
    if getattr(args, "json", False):
        print(json.dumps(report(checks), indent=2))
    else:
        print(format_table(checks))
    return 0
