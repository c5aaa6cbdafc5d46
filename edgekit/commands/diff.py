"""``edgekit diff BUNDLE BUNDLE``: what differs between two bundles, read from their manifests.

    edgekit diff dist/demo-cpu other/demo-cpu
    edgekit diff dist/demo-cpu dist/demo-cpu.rejected --json

Exit status as diff(1) and cmp(1) have it: 0 the same, 1 different, 2 trouble (a bundle that is
missing, corrupt or whose files do not match their sha256).
"""

from __future__ import annotations

import argparse

DIFF_EXIT = ("exit status: 0 the bundles are the same (files, variants, gate figures, provenance; when and "
             "where they were built is shown, not compared), 1 they differ, 2 trouble (a bundle missing, corrupt "
             "or not matching its sha256)")


def configure(p: argparse.ArgumentParser) -> None:
    """Add the verb's arguments."""
    p.description = f"{p.description}. {DIFF_EXIT}"
    p.add_argument("a", metavar="BUNDLE", help="the first bundle directory")
    p.add_argument("b", metavar="BUNDLE", help="the second bundle directory")
    p.add_argument("--json", action="store_true", help="the comparison as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """Print the differing facts; 0 when there are none, 1 when there are."""
    from edgekit.bundle_diff import diff_bundles, format_diff
    from edgekit.util.finite_json import strict_dumps

    d = diff_bundles(args.a, args.b)
    if args.json:
        print(strict_dumps(d.to_dict(), indent=1))
    elif not args.quiet or not d.identical:
        print(format_diff(d), end="")
    return 0 if d.identical else 1
