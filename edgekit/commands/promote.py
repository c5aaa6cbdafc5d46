"""``edgekit promote``: point a channel at a version already in the store (canary -> stable, rollback)."""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit promote``'s arguments."""
    parser.add_argument("version", metavar="VERSION", help="a version's sha256 or its first 6+ digits")
    parser.add_argument("dest", metavar="s3://BUCKET/PREFIX", help="where versions and channels live")
    parser.add_argument("--channel", required=True, help="the channel to move, e.g. stable")
    parser.add_argument("--trusted-key", action="append", metavar="PUB",
                        help="refuse unless the version is signed by this key (repeatable)")
    parser.add_argument("--json", action="store_true", help="the move as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """Move the channel and say from where to where."""
    from edgekit.fleet.keys import read_trusted
    from edgekit.fleet.publish import promote

    trusted = read_trusted(args.trusted_key) if args.trusted_key else None
    done = promote(args.version, args.dest, args.channel, trusted)
    if args.json:
        print(json.dumps(done))
    elif not args.quiet:
        was = done["previous"][:12] or "nothing"
        print(f"channel {done['channel']} of {done['dest']}: {was} -> {done['version'][:12]} "
              f"(signed by key {done['key_id']})")
    return 0
