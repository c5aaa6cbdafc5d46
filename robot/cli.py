"""The robot demo's scripts speak edgekit's grammar (issue 27): the bundle is the first argument as
``BUNDLE[:VARIANT]``, ``--json`` is JSON on stdout and ``--json-file FILE`` the same in a file
(finite JSON only: NaN is written as null), ``-q/-v`` set the verbosity, a wrong flag prints the
script's own usage, and every ``--help`` ends with real examples and the exit codes.

The old spellings still work with a one-line note on stderr, as edgekit's verbs do:
``--bundle DIR`` and ``--json FILE`` (a FILE ending in ``.json``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from edgekit.options import add_deprecated_alias

EXIT_CODES = ("exit codes: 0 ok; 1 runtime failure (the robot or camera cannot be reached or was lost, a missing "
              "accelerator, a full disk; robot.signs: an announcement the robot did not say or show); 2 usage or "
              "input error, in one line with a fix (arguments, bundle, images, robot configuration); "
              "130 interrupted")


def script_parser(prog: str, doc: str | None, examples: list[str]) -> argparse.ArgumentParser:
    """A parser for ``python -m robot.<prog>`` whose help ends with ``examples`` and the exit codes."""
    epilog = "\n".join(["examples:", *(f"  {e}" for e in examples), "", EXIT_CODES])
    p = argparse.ArgumentParser(prog=f"python -m robot.{prog}", description=(doc or "").splitlines()[0],
                                epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help="more detail on stderr (-v: INFO, -vv: DEBUG incl. library messages)")
    g.add_argument("-q", "--quiet", action="store_true", help="print only the summary and errors")
    return p


def add_bundle(p: argparse.ArgumentParser, help_text: str) -> None:
    """The bundle as the first argument (``--bundle`` kept as a deprecated alias)."""
    p.add_argument("bundle", nargs="?", metavar="BUNDLE[:VARIANT]", help=help_text)
    # its own destination: the optional positional, matched empty, would overwrite a shared one with None
    add_deprecated_alias(p, "--bundle", "BUNDLE[:VARIANT] as the first argument", dest="bundle_flag")


def add_json(p: argparse.ArgumentParser, what: str) -> None:
    """``--json`` (stdout) and ``--json-file FILE``; ``--json FILE.json`` is the deprecated spelling."""
    p.add_argument("--json", nargs="?", const=True, default=False, metavar="",
                   help=f"print {what} as one JSON line on stdout")
    p.add_argument("--json-file", metavar="FILE", help=f"write {what} as JSON to FILE")


def parse(p: argparse.ArgumentParser, argv: Any, bundle_required: bool = False) -> argparse.Namespace:
    """Parse ``argv`` and settle the deprecated spellings; a missing bundle prints the usage (exit 2)."""
    args = p.parse_args(argv)
    if getattr(args, "bundle_flag", None):
        if args.bundle:
            p.error(f"two bundles: {args.bundle} and --bundle {args.bundle_flag}")
        args.bundle = args.bundle_flag
    value = getattr(args, "json", False)
    if isinstance(value, str):  # `--json WORD`: the old `--json FILE`, or the bundle after a bare --json
        if value.lower().endswith(".json") and not Path(value).is_dir():
            print(f"{p.prog}: note: --json FILE is deprecated; use --json-file {value}", file=sys.stderr)
            args.json_file, args.json = args.json_file or value, False
        elif hasattr(args, "bundle") and not args.bundle:
            args.bundle, args.json = value, True
        else:
            p.error(f"--json takes no value (got {value!r}); use --json-file FILE to write a file")
    if bundle_required and not getattr(args, "bundle", None):
        p.error("the bundle is required: give BUNDLE[:VARIANT] as the first argument")
    _setup_logging(args)
    return args


def _setup_logging(args: argparse.Namespace) -> None:
    """The ``edgekit`` logger at the level ``-v/-q`` ask for (WARNING by default), as edgekit's verbs set it."""
    from edgekit.util.logs import log_to_stderr

    log_to_stderr(args)


def emit_json(args: argparse.Namespace, data: Any, out: TextIO | None = None) -> None:
    """``data`` as finite JSON: one line on ``out`` (stdout) for ``--json``, indented in ``--json-file``."""
    from edgekit.util.finite_json import strict_dumps

    if getattr(args, "json_file", None):
        from edgekit.util.atomic import write_text_atomic

        write_text_atomic(args.json_file, strict_dumps(data, default=str, indent=2) + "\n", force=True)
    if getattr(args, "json", False) is True:
        print(strict_dumps(data, default=str), file=out or sys.stdout, flush=True)
