# PYTHON_ARGCOMPLETE_OK
"""The ``edgekit`` command: a thin layer over the Python API.

Each verb lives in its own module exposing ``configure(parser)`` and ``main(args) -> int``;
those modules import heavy libraries (TensorFlow, ONNX) only inside ``main``, so
``edgekit run`` on a device never pays for the build side. Errors raised as
:class:`~edgekit.errors.EdgekitError` become one line on stderr and a non-zero exit code;
``--debug`` shows the traceback instead.

Every verb takes ``-v/--verbose`` (repeat for DEBUG: library chatter such as LiteRT's delegate
banner and OpenCV's warnings) and ``-q/--quiet`` (errors only); ``--json`` always means "JSON
on stdout" and ``--json-file FILE`` the same JSON in FILE. Shell completion: ``pip install
argcomplete`` (the ``completion`` extra), then ``eval "$(register-python-argcomplete edgekit)"``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Iterator

from edgekit.errors import EdgekitError, print_error
from edgekit.util.logs import log_to_stderr

VERBS = {
    "build": ("edgekit.commands.build", "convert a model into verified bundles for one or more targets"),
    "inspect": ("edgekit.commands.inspect", "show which ops of a model run where (Edge TPU, XNNPACK, RK3588 NPU)"),
    "run": ("edgekit.commands.run", "run a bundle on a camera and print results and stage latencies"),
    "bench": ("edgekit.commands.bench", "benchmark bundles/models side by side with honest statistics"),
    "serve": ("edgekit.commands.serve", "on-device service: camera -> model -> MQTT/HTTP metrics"),
    "doctor": ("edgekit.commands.doctor", "report what this machine can build and run, and what is missing"),
    "targets": ("edgekit.commands.targets", "list targets and whether this machine can build/run each"),
    "toolchain": ("edgekit.commands.toolchain", "install or list vendor toolchains (rk3588, imx500), each in a venv"),
    "deploy": ("edgekit.commands.deploy", "write the shipped deployment files (serve config, systemd, Prometheus)"),
    "diff": ("edgekit.commands.diff", "compare two bundles: target, variants, gate figures, file hashes, provenance"),
    "keygen": ("edgekit.commands.keygen", "make an Ed25519 key pair for signing bundles"),
    "sign": ("edgekit.commands.sign", "sign a bundle (a detached signature over its manifest)"),
    "verify": ("edgekit.commands.verify", "check a bundle's signature, every sha256 and that nothing is unlisted"),
    "push": ("edgekit.commands.push", "upload a signed bundle to an object store and point a channel at it"),
    "versions": ("edgekit.commands.versions", "list the versions in an object store and what each channel points at"),
    "promote": ("edgekit.commands.promote", "point a channel at a version already in the store (canary, rollback)"),
}


EXAMPLES = {
    "build": ["edgekit build --model models/demo.keras --target cpu,rpi,edgetpu --calib calib/fashion "
              "--eval eval/fashion --out dist",
              "edgekit build --model models/detector.keras --task detect --target cpu --calib calib/detect "
              "--eval eval/detect --out dist",
              "edgekit build --model models/demo.onnx --target jetson --calib calib/fashion --out dist"],
    "inspect": ["edgekit inspect dist/demo-edgetpu", "edgekit inspect dist/detector-cpu:int8 --json"],
    "run": ["edgekit run dist/demo-cpu --camera folder:eval/fashion/bag",
            "edgekit run dist/detector-cpu:int8 --camera synthetic:640x360@30 --duration 5 --json",
            "edgekit run dist/detector-cpu --camera file:dist/demo_clip.avi --save boxes.mp4"],
    "bench": ["edgekit bench dist/demo-cpu dist/demo-rpi --variants all --min-duration 1",
              "edgekit bench dist/detector-cpu --eval eval/detect",
              "edgekit bench dist/demo-cpu:fp32 dist/demo-cpu:int8 --json-file bench.json --plot bench.png"],
    "serve": ["edgekit serve dist/demo-cpu --camera synthetic:320x240@30 --duration 10",
              "edgekit serve dist/detector-cpu --camera v4l2:0 --mqtt 127.0.0.1:1883 --http 127.0.0.1:9100",
              "edgekit serve --write-example-config serve.toml"],
    "doctor": ["edgekit doctor", "edgekit doctor --json"],
    "targets": ["edgekit targets", "edgekit targets --json"],
    "toolchain": ["edgekit toolchain list", "edgekit toolchain install rk3588", "edgekit toolchain install imx500"],
    "deploy": ["edgekit deploy", "edgekit deploy systemd prometheus alerts --out deploy-out/"],
    "diff": ["edgekit diff dist/demo-cpu dist/demo-rpi", "edgekit diff dist/demo-cpu dist/demo-cpu --json"],
    "keygen": ["edgekit keygen --out keys/", "edgekit keygen --out keys/ --name release-2026"],
    "sign": ["edgekit sign dist/demo-cpu --key keys/edgekit.key",
             "edgekit sign dist/detector-cpu --key keys/edgekit.key"],
    "verify": ["edgekit verify dist/demo-cpu --trusted-key keys/edgekit.pub",
               "edgekit verify dist/demo-cpu --trusted-key keys/edgekit.pub --trusted-key keys/release-2026.pub"],
    "push": ["edgekit push dist/demo-cpu s3://models/demo --channel canary --key keys/edgekit.key",
             "edgekit push dist/demo-cpu s3://models/demo --key keys/edgekit.key --json"],
    "versions": ["edgekit versions s3://models/demo", "edgekit versions s3://models/demo --json"],
    "promote": ["edgekit promote 3f2a9c1b7d4e s3://models/demo --channel stable",
                "edgekit promote 3f2a9c1b7d4e s3://models/demo --channel stable --trusted-key keys/edgekit.pub"],
}
"""2-4 real examples per verb, shown at the end of its --help (each runs after ``make demo``;
tests/test_cli_grammar.py parses every one)."""

EXIT_CODES = ("exit codes: 0 ok; 1 runtime failure (a camera that cannot be opened or was lost, a missing "
              "accelerator or its runtime: Edge TPU, libedgetpu, CUDA device or provider, TensorRT, cuda-python, "
              "onnxruntime-gpu; a full disk or unwritable output; also a bench run that missed its minimums or "
              "had nothing this machine can run); 2 usage or input error, in one line with a fix (arguments, "
              "camera URI, model, images, bundle, a missing edgekit extra such as LiteRT or ONNX Runtime); "
              "3 accuracy gate failed (build); 130/143 interrupted")
"""The exit codes, as each error class carries them (edgekit.errors: EXIT_RUNTIME, EXIT_USAGE, EXIT_GATE)."""


def _epilog(verb: str) -> str:
    lines = ["examples:", *(f"  {e}" for e in EXAMPLES.get(verb, []))] if verb in EXAMPLES else []
    return "\n".join([*lines, "", EXIT_CODES] if lines else [EXIT_CODES])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (verbs whose module is missing are left out).

    With ``only``, just that verb's module is imported and configured: ``edgekit run`` on a
    device then never imports the build side's modules, not even to describe ``build``.
    ``only=""`` configures no verb (``edgekit --version``, ``edgekit --help``: the verbs are
    listed from :data:`VERBS` without importing any of them).
    """
    from edgekit._version import __version__

    parser = argparse.ArgumentParser(prog="edgekit", description=__doc__.splitlines()[0], epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"edgekit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        if only is not None and verb != only:
            sub.add_parser(verb, help=help_text, description=help_text)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # verb not shipped in this build
            raise
        p = sub.add_parser(verb, help=help_text, description=help_text, epilog=_epilog(verb),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        add_verbosity(p)
        module.configure(p)
        add_json_file(p)
        p.set_defaults(_main=module.main, _parser=p)
    return parser


def add_json_file(parser: argparse.ArgumentParser) -> None:
    """``--json-file FILE`` on a verb that has ``--json`` and no file form of its own: what ``--json``
    prints, written to FILE instead of stdout (one grammar on every verb; bench has its own)."""
    options = parser._option_string_actions
    if "--json" in options and "--json-file" not in options:
        parser.add_argument("--json-file", dest="json_to_file", metavar="FILE",
                            help="write the JSON that --json prints to FILE instead of stdout")


@contextlib.contextmanager
def json_to_file(args: argparse.Namespace) -> Iterator[None]:
    """Within the block, stdout is ``args.json_to_file`` (and ``--json`` is on) when it was given."""
    path = getattr(args, "json_to_file", None)
    if not path:
        yield
        return
    from edgekit.outputs.outpath import open_output  # a regular file only: a FIFO must not hang us

    args.json = True
    stream = open_output(path, "--json-file")
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.close()


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    """``-v/--verbose`` (repeatable) and ``-q/--quiet``, the same on every verb."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help="more detail on stderr (-v: INFO, -vv: DEBUG incl. library messages)")
    g.add_argument("-q", "--quiet", action="store_true", help="errors only on stderr (no progress lines)")


def _setup_logging(args: argparse.Namespace) -> None:
    """One stderr handler on the ``edgekit`` logger (serve configures its own: [log] level)."""
    if args.verb == "serve":
        return
    log_to_stderr(args)


def _verb_of(words: list[str]) -> str | None:
    """The verb on a command line: the first word that is not an option."""
    if os.environ.get("_ARGCOMPLETE"):  # completing: argcomplete passes the line in COMP_LINE
        words = os.environ.get("COMP_LINE", "").split()[1:]
    return next((w for w in words if not w.startswith("-")), None)


def _complete(parser: argparse.ArgumentParser) -> None:
    """Shell completion when argcomplete is installed (it exits the process while completing)."""
    if not os.environ.get("_ARGCOMPLETE"):
        return
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(parser)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``edgekit`` console script."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ logs off the user's screen
    verb = _verb_of(sys.argv[1:] if argv is None else list(argv))
    # No verb on the command line (--version, --help, a typo): import none of the verb modules.
    parser = build_parser(verb if verb in VERBS else "")
    _complete(parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the verb's usage, not the top level's: its options are what the user needs to see
        (getattr(args, "_parser", None) or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "verb", None):
        parser.print_help()
        return 2
    _setup_logging(args)
    from edgekit.outputs.outstream import guarded_stdout  # stdout on a full disk: an EdgekitError, not a traceback

    try:
        with json_to_file(args), guarded_stdout():
            return int(args._main(args) or 0)
    except EdgekitError as exc:
        if args.debug:
            traceback.print_exc()
        return print_error(f"edgekit {args.verb}", exc)
    except BrokenPipeError:
        # `edgekit inspect --json | head`: the reader left; that is not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as exc:
        if args.debug:
            traceback.print_exc()
        print(f"edgekit {args.verb}: interrupted; nothing half-written was left behind", file=sys.stderr)
        return 128 + (getattr(exc, "signum", None) or 2)  # 130 for Ctrl-C, 143 for SIGTERM (build)


if __name__ == "__main__":
    sys.exit(main())
