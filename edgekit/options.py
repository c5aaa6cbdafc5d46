"""Runtime options on the command line: one set of flags for run, bench, serve and the robot demo.

The same knob has one name everywhere (``--device``, ``--backend``, ``--threads``,
``--delegate``, ``--providers``, ``--allow-fallback``); :func:`runtime_options` turns the parsed
flags into the keyword overrides :func:`edgekit.model.open_model` takes. Imports argparse only.
"""

from __future__ import annotations

import argparse
from typing import Any


def at_least(minimum: float, kind: type = int):
    """An argparse type accepting numbers >= ``minimum`` (a clear message instead of odd results)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    return parse


def add_runtime_options(parser: argparse.ArgumentParser, several_backends: bool = False) -> None:
    """Options shared by run and bench that override a bundle's runtime options."""
    g = parser.add_argument_group("runtime")
    g.add_argument("--device", help="LiteRT Edge TPU device: usb, usb:N, pci, pci:N (default: the bundle's)")
    g.add_argument(
        "--threads", type=at_least(1), metavar="N", help="CPU threads (LiteRT interpreter; ONNX Runtime intra-op)"
    )
    g.add_argument(
        "--delegate",
        choices=["xnnpack", "none", "edgetpu"],
        help="LiteRT delegate (default: the bundle's; 'none' = plain built-in kernels); ignored by ONNX Runtime",
    )
    g.add_argument(
        "--providers", help="ONNX Runtime providers in order, comma-separated (cpu,cuda,tensorrt); ignored by LiteRT"
    )
    g.add_argument(
        "--allow-fallback",
        action="store_true",
        default=None,
        help="accept ONNX Runtime dropping a requested provider (refused by default)",
    )
    g.add_argument("--labels", metavar="FILE", help="labels file for a bare model (a bundle has its own)")
    g.add_argument(
        "--allow-rejected",
        action="store_true",
        default=None,
        help="run a bundle that failed its accuracy gate at build time (for inspection)",
    )
    g.add_argument(
        "--backend",
        choices=["litert", "onnxruntime", "onnxruntime-cuda", "onnxruntime-trt", "tensorrt"],
        action="append" if several_backends else "store",
        help="run with this backend instead of the bundle's (applies to models of its format)"
        + ("; repeat to compare backends" if several_backends else ""),
    )


def runtime_options(args: argparse.Namespace) -> dict[str, Any]:
    """The runtime keyword overrides given on the command line (None = keep the bundle's)."""
    return {
        "num_threads": args.threads,
        "delegate": args.delegate,
        "device": args.device,
        "providers": args.providers,
        "allow_fallback": args.allow_fallback,
        "backend": getattr(args, "backend", None),
        "allow_rejected": getattr(args, "allow_rejected", None),
    }
