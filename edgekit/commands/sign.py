"""``edgekit sign``: a detached signature (edgekit.sig) inside a bundle, over its manifest."""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit sign``'s arguments."""
    parser.add_argument("bundle", metavar="BUNDLE", help="bundle folder (every file is checked against its sha256)")
    parser.add_argument("--key", required=True, metavar="KEY", help="the private key edgekit keygen wrote (.key)")
    parser.add_argument("--json", action="store_true", help="the version and key id as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """Sign and say with which key."""
    from edgekit.fleet.signature import SIGNATURE, sign_bundle

    version, kid = sign_bundle(args.bundle, args.key)
    if args.json:
        print(json.dumps({"bundle": args.bundle, "version": version, "key_id": kid}))
    elif not args.quiet:
        print(f"signed {args.bundle} (version {version[:12]}) with key {kid}: {args.bundle.rstrip('/')}/{SIGNATURE}")
    return 0
