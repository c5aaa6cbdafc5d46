"""``edgekit verify``: what a device checks before it runs a bundle (signature, hashes, listing)."""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit verify``'s arguments."""
    parser.add_argument("bundle", metavar="BUNDLE", help="bundle folder with its edgekit.sig")
    parser.add_argument("--trusted-key", required=True, action="append", metavar="PUB",
                        help="a public key the signature may be by; repeat for key rotation")
    parser.add_argument("--json", action="store_true", help="the outcome as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """Exit 0 and say who signed it, or exit 2 with the reason (edgekit's one-line error)."""
    from edgekit.fleet.keys import read_trusted
    from edgekit.fleet.signature import verify_bundle

    verified = verify_bundle(args.bundle, read_trusted(args.trusted_key))
    files = len(verified.bundle.manifest["files"])
    if args.json:
        print(json.dumps({"bundle": args.bundle, "version": verified.sha256, "key_id": verified.key_id,
                          "key": verified.key_path, "files": files, "ok": True}))
    elif not args.quiet:
        print(f"{args.bundle}: version {verified.sha256[:12]} signed by key {verified.key_id} ({verified.key_path}); "
              f"{files} files match their sha256, nothing unlisted")
    return 0
