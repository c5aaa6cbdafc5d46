"""``edgekit toolchain``: the vendor toolchains, each in a pinned venv of its own.

    edgekit toolchain list                 # what is installed, and what could be
    edgekit toolchain install rk3588       # Rockchip RKNN-Toolkit2 (+ torch, numpy 1.26)
    edgekit toolchain install imx500       # Sony MCT + imx500-converter (PyTorch CPU, Java)

The work is :mod:`edgekit.toolchain`; this module parses and prints.
"""

from __future__ import annotations

import argparse
import json
import sys

from edgekit.errors import UsageError


def configure(p: argparse.ArgumentParser) -> None:
    """Add the verb's arguments."""
    from edgekit.toolchain.specs import TOOLCHAINS

    p.add_argument("action", choices=("list", "install"), help="list the toolchains, or install some")
    p.add_argument("names", nargs="*", metavar="NAME", help=f"toolchains to install: {', '.join(TOOLCHAINS)}")
    p.add_argument("--force", action="store_true", help="reinstall a toolchain that is installed")
    p.add_argument("--python", metavar="PATH", help="the Python 3.11 to make the venv from (default: edgekit's own "
                   "when it is 3.11, else python3.11 on PATH)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def main(args: argparse.Namespace) -> int:
    """List or install."""
    if args.action == "list":
        if args.names:
            raise UsageError("toolchain list takes no names", "run: edgekit toolchain list")
        return _list(args.json)
    if not args.names:
        raise UsageError("which toolchain?", "run: edgekit toolchain install rk3588 (or imx500)")
    from edgekit.toolchain.install import install
    from edgekit.toolchain.specs import get_spec

    for name in args.names:
        get_spec(name)  # every name checked before the first long install
    quiet = args.quiet or args.json
    done = [install(n, force=args.force, python=args.python,
                    say=(lambda _line: None) if quiet else (lambda line: print(line, file=sys.stderr)))
            for n in args.names]
    if args.json:
        print(json.dumps([t.to_json() for t in done], indent=2))
    else:
        for t in done:
            print(f"{t.name}: {t.interpreter} ({_versions(t.versions)}; {t.size_mb / 1000:.2f} GB, "
                  f"installed in {t.install_s:.0f} s)")
    return 0


def _versions(versions: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items())


def _list(as_json: bool) -> int:
    """One line per known toolchain: installed (where, versions, size) or how to install it."""
    from edgekit.toolchain.specs import TOOLCHAINS
    from edgekit.toolchain.store import installed_toolchains, toolchains_root

    have = {t.name: t for t in installed_toolchains()}
    rows = []
    for name, spec in TOOLCHAINS.items():
        t = have.get(name)
        rows.append({"name": name, "installed": t is not None, "summary": spec.summary,
                     **(t.to_json() if t else {"install": f"edgekit toolchain install {name}", "note": spec.note})})
    if as_json:
        for r in rows:
            r.pop("extra", None)
        print(json.dumps({"root": str(toolchains_root()), "toolchains": rows}, indent=2))
        return 0
    print(f"toolchains in {toolchains_root()}")
    for r in rows:
        if r["installed"]:
            print(f"  {r['name']:8} installed  {_versions(r['versions'])}; {r['size_mb'] / 1000:.2f} GB, "
                  f"installed in {r['install_s']:.0f} s on {r['installed_at'][:10]}")
        else:
            print(f"  {r['name']:8} not installed: {r['install']} ({r['note']})")
        print(f"  {'':8} {r['summary']}")
    return 0
