"""``edgekit keygen``: an Ed25519 key pair for signing bundles (docs/fleet.md, "Rolling out a model")."""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit keygen``'s arguments."""
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for NAME.key (secret, 0600) and NAME.pub")
    parser.add_argument("--name", default="edgekit", help="file name of the pair (default: edgekit)")
    parser.add_argument("--force", action="store_true", help="replace a key pair of that name")
    parser.add_argument("--json", action="store_true", help="the paths and key id as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """Write the pair and say what each file is for."""
    from edgekit.fleet.keys import generate

    private, public, kid = generate(args.out, args.name, args.force)
    if args.json:
        print(json.dumps({"key": str(private), "pub": str(public), "key_id": kid}))
    elif not args.quiet:
        print(f"wrote {private} (secret: keep it on the signing machine; mode 0600)")
        print(f"wrote {public} (key id {kid}: give it to devices as --trusted-key)")
    return 0
