"""Runtime options on the command line: one set of flags for run, bench, serve and the robot demo.

The same knob has one name everywhere (``--device``, ``--backend``, ``--threads``,
``--delegate``, ``--providers``, ``--allow-fallback``); :func:`runtime_options` is the one
mapping from parsed flags to the keyword overrides :func:`edgekit.model.open_model` takes.
Old spellings stay as hidden aliases that still work and print a one-line deprecation note
(:func:`add_deprecated_alias`). Imports argparse only (the backend names are read lazily).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Flag destination -> open_model keyword. The [model] table of `edgekit serve` uses the
# destination names as its keys, so a flag, a config key and a Python keyword line up.
RUNTIME_FLAGS: dict[str, str] = {
    "device": "device",
    "backend": "backend",
    "threads": "num_threads",
    "delegate": "delegate",
    "providers": "providers",
    "allow_fallback": "allow_fallback",
    "allow_rejected": "allow_rejected",
    "input_size": "input_size",
    "task": "task",
    "task_option": "task_options",
}
DELEGATES = ("xnnpack", "none", "edgetpu")


def at_least(minimum: float, kind: type = int):
    """An argparse type accepting numbers >= ``minimum`` (a clear message instead of odd results)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
        if value != value or value in (float("inf"), float("-inf")):  # nan/inf: no timer or count can use them
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    return parse


def backend_names() -> list[str]:
    """The ``--backend`` choices: the keys of :data:`edgekit.runtime.BACKENDS`."""
    from edgekit.runtime import BACKENDS  # the table only; no backend library is imported

    return list(BACKENDS)


def add_runtime_options(
    parser: argparse.ArgumentParser, several_backends: bool = False, config_table: str | None = None
) -> None:
    """Add the runtime knobs that override a bundle's runtime options.

    Args:
        parser: the verb's parser.
        several_backends: ``--backend`` may be repeated (bench compares backends).
        config_table: the configuration table whose keys the flags override (serve's
            ``model``); named in each help line, and ``--threads 0`` is then accepted
            (the file's "runtime default").
    """

    def note(key: str) -> str:
        return f" (config: [{config_table}] {key})" if config_table else ""

    g = parser.add_argument_group("runtime")
    g.add_argument(
        "--device", help="Edge TPU device: usb, usb:N, pci, pci:N (default: the bundle's)" + note("device")
    )
    g.add_argument(
        "--backend",
        choices=backend_names(),
        action="append" if several_backends else "store",
        help="run with this backend instead of the bundle's (applies to models of its format)"
        + ("; repeat to compare backends" if several_backends else "")
        + note("backend"),
    )
    g.add_argument(
        "--threads",
        type=at_least(0 if config_table else 1),
        metavar="N",
        help="CPU threads (LiteRT interpreter; ONNX Runtime intra-op)" + note("threads"),
    )
    g.add_argument(
        "--delegate",
        choices=DELEGATES,
        help="LiteRT delegate (default: the bundle's; 'none' = plain built-in kernels); LiteRT models only"
        + note("delegate"),
    )
    g.add_argument(
        "--providers",
        help="ONNX Runtime providers in order, comma-separated (cpu,cuda,tensorrt); ONNX models only"
        + note("providers"),
    )
    g.add_argument(
        "--allow-fallback",
        action="store_true",
        default=None,
        help="accept ONNX Runtime dropping a requested provider (refused by default)" + note("allow_fallback"),
    )


def add_bundle_options(parser: argparse.ArgumentParser) -> None:
    """``--labels`` and ``--allow-rejected``: how run and bench take a bare model or a rejected bundle."""
    g = parser.add_argument_group("model")
    g.add_argument("--labels", metavar="FILE", help="labels file for a bare model (a bundle has its own)")
    g.add_argument(
        "--allow-rejected",
        action="store_true",
        default=None,
        help="run a bundle that failed its accuracy gate at build time (for inspection)",
    )
    g.add_argument("--input-size", metavar="HxW",
                   help="image size for a bare ONNX model whose input height/width are symbolic (refused without)")
    g.add_argument("--task", metavar="TASK",
                   help="task head that decodes the outputs: classify, detect or raw (default: the bundle's; "
                        "a bare model: classify for one vector output, raw otherwise)")
    g.add_argument("-T", "--task-option", dest="task_option", action="append", type=key_value, metavar="KEY=VALUE",
                   help="an option of the task head, e.g. -T score_threshold=0.4 -T layout=yolo (values are JSON: "
                        "numbers, true/false, lists); repeatable, laid over the bundle's")


class _DeprecatedAlias(argparse.Action):
    """Store like the new flag, after a one-line note on stderr naming the new spelling."""

    def __init__(self, option_strings, dest, replacement: str = "", **kwargs):
        self.replacement = replacement
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: note: {option_string} is deprecated; use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_deprecated_alias(parser: Any, old: str, new: str, flag: bool = False, dest: str | None = None) -> None:
    """Accept ``old`` as a hidden spelling of the option ``new`` (same destination).

    ``flag``: the option takes no value (a ``store_true`` switch). ``dest``: where the value
    goes when ``new`` is not an option's name (a positional argument, say "BUNDLE (the first
    argument)").
    """
    dest = dest or new.lstrip("-").replace("-", "_")
    extra: dict[str, Any] = {"nargs": 0, "const": True} if flag else {}
    parser.add_argument(old, dest=dest, action=_DeprecatedAlias, replacement=new, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, **extra)


def camera_help(fallback: str) -> str:
    """``--camera`` help listing the URI forms :mod:`edgekit.camera` knows (``fallback`` if it cannot say)."""
    import edgekit.camera

    forms_of = getattr(edgekit.camera, "camera_uri_forms", None)  # newer camera packages generate the list
    forms = forms_of() if callable(forms_of) else None
    text = forms if isinstance(forms, str) else ", ".join(forms) if forms else fallback
    return "camera URI: " + text.replace("%", "%%")  # argparse formats help with %


def key_value(text: str) -> tuple[str, str]:
    """An argparse type for ``KEY=VALUE`` (the value may itself hold '=')."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def add_camera_options(parser: Any, config_table: str | None = None) -> None:
    """``--camera-option KEY=VALUE`` / ``-O``: options for :func:`edgekit.camera.open_camera`, repeatable."""
    parser.add_argument(
        "-O",
        "--camera-option",
        dest="camera_option",
        action="append",
        type=key_value,
        metavar="KEY=VALUE",
        help="camera source option, e.g. -O fps=30 -O size=640x480; repeatable"
        + (f" (config: [{config_table}] options)" if config_table else ""),
    )


def camera_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``--camera-option`` items as keyword arguments for ``open_camera`` (strings; the source
    coerces them). A key given twice keeps its last value, as on any command line."""
    return dict(getattr(args, "camera_option", None) or [])


def runtime_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`~edgekit.model.open_model` keyword overrides the user gave on the command line.

    A flag the user did not give (None) is left out, so the bundle's own option stands.
    """
    given = {keyword: getattr(args, dest, None) for dest, keyword in RUNTIME_FLAGS.items()}
    if given.get("task_options") is not None:
        given["task_options"] = {key: option_value(value) for key, value in given["task_options"]}
    return {k: v for k, v in given.items() if v is not None}


def option_value(text: str) -> Any:
    """A ``KEY=VALUE`` value as JSON when it parses (``0.4``, ``true``, ``[1, 2]``), else the text
    itself (``yolo``): the task head checks the type and range of every option. A value nested
    deeper than :data:`edgekit.util.userjson.MAX_DEPTH` stays text (the head refuses it in one line)
    instead of recursing into a RecursionError."""
    from edgekit.util.userjson import loads

    try:
        return loads(text)
    except ValueError:
        return text


def config_values(options: dict[str, Any]) -> dict[str, Any]:
    """:func:`runtime_options` renamed to the keys of serve's ``[model]`` table (``num_threads`` -> ``threads``)."""
    to_key = {keyword: dest for dest, keyword in RUNTIME_FLAGS.items()}
    return {to_key[k]: v for k, v in options.items()}


def target_completer(prefix: str = "", **_: Any) -> list[str]:
    """Shell completion (argcomplete) for ``--target``: the shipped targets, after any
    comma-separated ones already typed (``cpu,ed`` -> ``cpu,edgetpu``)."""
    from edgekit.target import available_targets

    done, _, last = prefix.rpartition(",")
    head = f"{done}," if done else ""
    return [head + name for name in available_targets() if name.startswith(last)]


def add_cascade_options(parser: argparse.ArgumentParser, tracking: bool = True) -> Any:
    """``--then``, ``--roi`` and the second model's task flags: a detector feeding a second model
    (:mod:`edgekit.cascade`; docs/pipelines.md). Returns the argument group (a verb adds its own there)."""
    g = parser.add_argument_group("cascade (a detector feeding a second model)")
    g.add_argument("--then", metavar="SECOND[:VARIANT]",
                   help="run this model on each detection's region (landmarks, or a classifier's sub-label)")
    g.add_argument("--roi", metavar="JSON",
                   help="the region options (MediaPipe names): rotation_vector_start_keypoint_index, "
                        "..._end_keypoint_index, rotation_vector_target_angle_degrees, scale_x, scale_y, shift_x, "
                        "shift_y, square_long, square_short, alignment_points, max_regions (default 4)")
    if tracking:  # serve shares one second stage among its cameras: no per-camera track to follow
        g.add_argument("--track-roi", metavar="JSON",
                       help="MediaPipe's tracking: the region options applied to last frame's landmarks (their box; "
                            "the landmarks as keypoints); the detector runs again only when a landmark model's "
                            "presence drops (face: keypoints 33 -> 263, scale 1.5, square_long)")
    g.add_argument("--then-task", metavar="TASK", help="the second model's task head (default: its bundle's)")
    g.add_argument("--then-option", action="append", type=key_value, metavar="KEY=VALUE",
                   help="an option of the second model's task head (values are JSON), repeatable")
    g.add_argument("--then-labels", metavar="FILE", help="labels file for a bare second model")
    return g


def cascade_model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`~edgekit.model.open_model` keywords of the second model (``--then-*``)."""
    options: dict[str, Any] = {"labels": getattr(args, "then_labels", None),
                               "task": getattr(args, "then_task", None),
                               "allow_rejected": getattr(args, "allow_rejected", None)}
    given = getattr(args, "then_option", None)
    if given:
        options["task_options"] = {key: option_value(value) for key, value in given}
    for flag, keyword in (("device", "device"), ("threads", "num_threads")):  # one accelerator for both
        if getattr(args, flag, None) is not None:
            options[keyword] = getattr(args, flag)
    return {k: v for k, v in options.items() if v is not None}


def add_motion_options(parser: argparse.ArgumentParser) -> None:
    """``--motion`` and its thresholds: infer only frames where something moved (edgekit.camera.motion)."""
    g = parser.add_argument_group("motion gating")
    g.add_argument("--motion", action="store_true",
                   help="infer only frames with motion (a cheap difference on a small grey copy); a still scene "
                        "is still inferred every --motion-refresh seconds")
    g.add_argument("--motion-threshold", type=at_least(1), metavar="GREY",
                   help="a pixel moved when it differs by more than this many grey levels (default 25)")
    g.add_argument("--motion-min-area", type=at_least(0.0, float), metavar="FRACTION",
                   help="motion when more than this fraction of the small copy moved (default 0.005)")
    g.add_argument("--motion-refresh", type=at_least(0.0, float), metavar="S",
                   help="infer a still scene at least every S seconds of frame time (default 5)")


class MotionFilter:
    """``--motion`` for a frame loop: :meth:`frames` passes only what the gate wants, :meth:`summarise`
    puts its counts in the run's summary (gated frames are not "skipped")."""

    def __init__(self, gate: Any = None):
        self.gate = gate

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MotionFilter:
        """The filter the flags ask for (a pass-through without ``--motion``)."""
        if not getattr(args, "motion", False):
            return cls()
        from edgekit.camera.motion import motion_gate_from

        given = {"threshold": args.motion_threshold, "min_area": args.motion_min_area,
                 "refresh_s": args.motion_refresh}
        return cls(motion_gate_from({k: v for k, v in given.items() if v is not None}))

    def frames(self, source: Any) -> Any:
        """``source`` itself, or only its frames with motion."""
        if self.gate is None:
            return source
        from edgekit.camera.motion import motion_gated

        return motion_gated(source, self.gate)

    def summarise(self, summary: dict[str, Any]) -> None:
        """Add ``motion`` (seen, inferred, gated) to ``summary``; gated frames leave ``skipped``."""
        if self.gate is None:
            return
        counts = self.gate.counts()
        summary["motion"] = counts
        summary["skipped"] = max(0, summary.get("skipped", 0) - counts.get("gated", 0))
