"""``edgekit push``: upload a signed bundle as an immutable version and point a channel at it."""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit push``'s arguments."""
    parser.add_argument("bundle", metavar="BUNDLE", help="bundle folder (signed with --key first if it is not)")
    parser.add_argument("dest", metavar="s3://BUCKET/PREFIX",
                        help="where versions and channels live (endpoint and credentials as AWS tools take them)")
    parser.add_argument("--channel", help="point this channel at the version (none: upload only; promote later)")
    parser.add_argument("--key", required=True, metavar="KEY", help="private key to sign with (edgekit keygen)")
    parser.add_argument("--json", action="store_true", help="what was pushed as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """Push and say what the channel points at now."""
    from edgekit.fleet.publish import push

    done = push(args.bundle, args.dest, args.channel, args.key)
    if args.json:
        print(json.dumps(done))
        return 0
    if args.quiet:
        return 0
    if done["signed"]:
        print(f"signed {args.bundle} with key {done['key_id']} ({done['was']})")
    print(f"pushed {done['bundle']} as version {done['version'][:12]} to {done['dest']}/versions/{done['version']}/ "
          f"({done['files']} files, {done['bytes'] / 1e6:.2f} MB, {done['sent']} sent; signed by key {done['key_id']})")
    if done["channel"]:
        was = f" (was {done['previous'][:12]})" if done["previous"] else ""
        print(f"channel {done['channel']} -> {done['version'][:12]}{was}")
    return 0
