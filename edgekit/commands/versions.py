"""``edgekit versions``: the versions in a store and what each channel points at."""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit versions``' arguments."""
    parser.add_argument("dest", metavar="s3://BUCKET/PREFIX", help="where versions and channels live")
    parser.add_argument("--json", action="store_true", help="every version and channel as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """One line per version, newest push first; the channels pointing at it at the end of its line."""
    from edgekit.fleet.publish import versions

    found = versions(args.dest)
    if args.json:
        for entry in found["versions"]:
            entry.pop("manifest", None)
        print(json.dumps(found, indent=2))
        return 0
    if not found["versions"]:
        print(f"no versions in {found['dest']} (push one: edgekit push BUNDLE {args.dest} --channel stable --key KEY)")
        return 0
    print(f"{'version':12}  {'pushed (UTC)':19}  {'bundle':14} {'target':8} {'task':9} {'key':16} {'MB':>7}  channels")
    for v in found["versions"]:
        state = "" if v["complete"] else "  (incomplete)"
        print(f"{v['version'][:12]}  {v['pushed'] or '?':19}  {v['name'][:14]:14} {v['target'][:8]:8} "
              f"{v['task'][:9]:9} {v['key_id'][:16]:16} {v['bytes'] / 1e6:7.2f}  {', '.join(v['channels'])}{state}")
    missing = {c: v for c, v in found["channels"].items() if v and v not in {e["version"] for e in found["versions"]}}
    for channel, version in sorted(missing.items()):
        print(f"channel {channel} points at {version[:12]}, which is not in the store")
    return 0
