"""``edgekit deploy``: write the deployment files shipped inside the package.

    edgekit deploy                                   # list them
    edgekit deploy systemd --out /etc/systemd/system/
    edgekit deploy config --out /etc/edgekit/serve.toml
    edgekit deploy prometheus alerts --out /etc/prometheus/
    edgekit deploy config --out -                    # print to stdout

Files are written through a temporary file and a rename; an existing one is kept unless
``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from edgekit.deploy_files import DEPLOY_FILES, deploy_names, read_deploy_file, write_deploy_file
from edgekit.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``edgekit deploy``'s arguments."""
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"which files: {', '.join(DEPLOY_FILES)} or all "
                        "(none: list them)").completer = lambda **_: [*DEPLOY_FILES, "all"]
    parser.add_argument("--out", "-o", metavar="DIR_OR_FILE",
                        help="a directory (files keep their names), a file path (one NAME), or '-' for stdout")
    parser.add_argument("--force", action="store_true", help="replace files that exist")
    parser.add_argument("--json", action="store_true", help="list (or report what was written) as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    """List the shipped files, or write the named ones."""
    names = deploy_names(args.names)
    if not names:
        rows = [{"name": n, "file": f.file, "summary": f.summary, "usual_place": f.usual_place}
                for n, f in DEPLOY_FILES.items()]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            width = max(len(n) for n in DEPLOY_FILES)
            for r in rows:
                print(f"{r['name'].ljust(width)}  {r['file']:20}  {r['summary']} (usually {r['usual_place']})")
            print("write them: edgekit deploy NAME... --out DIR")
        return 0
    if not args.out:
        raise UsageError("where to? no --out given", "add --out DIR (or --out - to print one file)")
    if args.out == "-":
        if len(names) != 1:
            raise UsageError("--out - prints one file", "name one file, or give --out DIR")
        print(read_deploy_file(names[0]), end="")
        return 0
    out = Path(args.out)
    if (len(names) > 1 or args.out.endswith(("/", os.sep))) and not out.exists():
        try:  # several files, or a path written as a folder ('deploy-out/'): a folder to make
            out.mkdir(parents=True)
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot make the folder: {exc.strerror or exc}",
                             "give a folder you can write in") from exc
    if len(names) > 1 and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder", "give a folder for several files")
    targets = [out / DEPLOY_FILES[n].file if out.is_dir() else out for n in names]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not args.force:  # check all first: write everything or nothing
        raise UsageError(f"{', '.join(existing)}: already there; not overwriting",
                         "give --force to replace, or another --out")
    written = [write_deploy_file(name, target, args.force) for name, target in zip(names, targets)]
    if args.json:
        print(json.dumps([str(p) for p in written]))
    elif not args.quiet:
        for path in written:
            print(f"wrote {path}")
    return 0
