"""``edgekit serve``: argparse and start-up for the on-device service (:mod:`edgekit.serve.daemon`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from edgekit.errors import UsageError
from edgekit.options import (
    add_camera_options,
    add_cascade_options,
    add_deprecated_alias,
    add_runtime_options,
    at_least,
    camera_help,
    camera_options,
    config_values,
    runtime_options,
)
from edgekit.serve.config.load import ServeConfig, load_config, override, parse_address

log = logging.getLogger("edgekit.serve")


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``edgekit serve``; every one overrides the matching key of --config."""
    parser.add_argument("--config", metavar="TOML",
                        help="configuration file (write a documented example with --write-example-config)")
    parser.add_argument("bundle", nargs="?", metavar="BUNDLE[:VARIANT]",
                        help="bundle directory (optionally :variant), .tflite or .onnx (config: [model] path)")
    parser.add_argument("--variant", help="variant inside the bundle (config: [model] name)")
    add_deprecated_alias(parser, "--model-name", "--variant")
    for old in ("--bundle", "--model"):
        add_deprecated_alias(parser, old, "BUNDLE[:VARIANT] as the first argument", dest="model_path")
    parser.add_argument("--labels", help="labels file for a bare model (config: [model] labels)")
    parser.add_argument("--source", metavar="s3://BUCKET/PREFIX",
                        help="pull signed versions of a channel from an object store or https:// URL instead of "
                        "BUNDLE (config: [model] source; docs/fleet.md)")
    parser.add_argument("--channel", help="the channel to follow, e.g. stable (config: [model] channel)")
    parser.add_argument("--trusted-key", metavar="PUB", action="append",
                        help="public key a version must be signed by; repeat for key rotation "
                        "(config: [model] trusted_keys)")
    parser.add_argument("--poll-interval", type=at_least(0.05, float), metavar="S",
                        help="seconds between looks at the channel (config: [model] poll_interval_s)")
    parser.add_argument("--watch", action="store_true", default=None,
                        help="hot-swap the bundle when a new one is moved into place (config: [model] watch)")
    add_runtime_options(parser, config_table="model")
    add_deprecated_alias(parser, "--edgetpu-device", "--device")
    parser.add_argument("--top-k", type=int, help="classes per result (config: [model] top_k)")
    parser.add_argument("--camera", metavar="[NAME=]URI", action="append",
                        help=camera_help("v4l2:0, picamera2, a file") + "; repeat it as NAME=URI for several "
                        "cameras sharing the model (config: [camera] uri, [[camera]] name and uri)")
    add_camera_options(parser, config_table="camera")
    parser.add_argument("--motion", action="store_true", default=None,
                        help="infer only frames with motion, a still scene every motion_refresh_s "
                        "(config: [camera] motion)")
    parser.add_argument("--output", metavar="PATH",
                        help="JSON lines: '-' stdout, 'off', or a file (config: [output] jsonl)")
    parser.add_argument("--mqtt", metavar="HOST[:PORT]",
                        help="MQTT broker, 'off' to disable (config: [mqtt] host, port)")
    parser.add_argument("--mqtt-topic", help="topic prefix, {device} is replaced (config: [mqtt] topic)")
    parser.add_argument("--node-name", help="this machine's name in topics and results (config: [mqtt] device); "
                        "--device is the accelerator")
    add_deprecated_alias(parser, "--device-name", "--node-name")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="metrics endpoint (127.0.0.1 unless told), 'off' to disable (config: [http] listen)")
    parser.add_argument("--json", action="store_true",
                        help="results as JSON lines on stdout (same as --output -)")
    add_deprecated_alias(parser, "--log-level", "-v/-vv/-q (config: [log] level)", dest="log_level")
    parser.add_argument("--max-frames", type=at_least(1), help="stop after this many results (tests, benchmarks)")
    parser.add_argument("--duration", type=at_least(0.0, float), metavar="S", help="stop after this many seconds")
    parser.add_argument("--print-config", action="store_true",
                        help="validate, print the effective configuration as JSON and exit")
    parser.add_argument("--write-example-config", metavar="PATH",
                        help="write the example configuration (every key documented) to PATH ('-': stdout) and exit")
    parser.add_argument("--force", action="store_true", help="with --write-example-config: replace an existing file")
    add_cascade_options(parser, tracking=False)


def build_config(args: argparse.Namespace) -> ServeConfig:
    """The configuration file (if any) with every given flag applied on top."""
    if getattr(args, "config", None):
        from edgekit.util.safe_open import NotARegularFile, check_regular

        try:  # a FIFO given as --config would block the start for ever
            check_regular(args.config)
        except NotARegularFile as exc:
            raise UsageError(f"config file {exc}", "give the TOML file (edgekit serve --write-example-config PATH "
                             "writes one)") from exc
        except OSError:
            pass  # missing or unreadable: load_config says which
    config = load_config(getattr(args, "config", None))

    def flag(name: str) -> Any:
        return getattr(args, name, None)

    def off(value: str | None) -> str | None:
        return "" if value in ("off", "none") else value

    path, variant = _model_spec(args)
    config = override(config, "model", path=path, name=variant, labels=flag("labels"),
                      top_k=flag("top_k"), watch=flag("watch"), **config_values(runtime_options(args)))
    keys = tuple(flag("trusted_key")) if flag("trusted_key") else None
    config = override(config, "model", source=flag("source"), channel=flag("channel"), trusted_keys=keys,
                      poll_interval_s=flag("poll_interval"))
    if flag("camera"):  # the flags replace the file's cameras; each keeps the file's other [camera] keys
        config = _with_camera_flags(config, flag("camera"))
    config = override(config, "camera", motion=flag("motion"))
    if camera_options(args):  # each flag replaces one key of the file's [camera] options
        config = override(config, "camera", options={**config.camera.options, **camera_options(args)})
    if flag("json") and flag("output") not in (None, "-"):
        raise UsageError(f"--json prints results on stdout, --output {flag('output')} sends them elsewhere",
                         "give one of them")
    output = off(flag("output"))
    config = override(config, "output", jsonl="-" if flag("json") and output is None else output)
    mqtt = off(flag("mqtt"))
    if mqtt:
        host, port = parse_address(mqtt, 1883, "--mqtt")
        config = override(config, "mqtt", host=host, port=port)
    elif mqtt == "":
        config = override(config, "mqtt", host="")
    config = override(config, "mqtt", topic=flag("mqtt_topic"), device=flag("node_name"))
    config = override(config, "http", listen=off(flag("http")))
    level = flag("log_level")
    if level is not None and level not in ("debug", "info", "warning", "error"):
        raise UsageError(f"--log-level {level!r}: not debug, info, warning or error", "use -v, -vv or -q")
    config = override(config, "log", level=level or _verbosity_level(args))
    return _with_stage_flags(config, args)


def _with_stage_flags(config: ServeConfig, args: argparse.Namespace) -> ServeConfig:
    """``--then SECOND --roi JSON`` (and the second model's task flags): a [[stage]] replacing the file's."""
    import dataclasses

    then = getattr(args, "then", None)
    if not then:
        if getattr(args, "roi", None):
            raise UsageError("--roi without --then", "add --then SECOND[:VARIANT], the model to run on each region")
        return config
    from edgekit.options import cascade_model_options
    from edgekit.serve.config.stages import stage_from

    second = cascade_model_options(args)
    try:
        roi = json.loads(args.roi) if getattr(args, "roi", None) else {}
    except ValueError as exc:
        raise UsageError(f"--roi is not JSON: {exc}",
                         "e.g. --roi '{\"scale_x\": 1.5, \"square_long\": true}'") from None
    table = {"model": then, "roi": roi, "task": second.get("task", ""), "labels": second.get("labels", ""),
             "task_options": second.get("task_options", {})}
    return dataclasses.replace(config, stages=(stage_from(table, "--then"),))


def _with_camera_flags(config: ServeConfig, flags: list[str]) -> ServeConfig:
    """``--camera [NAME=]URI``, repeated: several cameras each need a name (UsageError otherwise)."""
    import dataclasses

    from edgekit.serve.config.cameras import check_names, split_camera_flag
    from edgekit.serve.config.load import check, with_cameras

    specs = [split_camera_flag(text) for text in flags]
    if len(specs) > 1 and not all(name for name, _ in specs):
        raise UsageError(f"--camera given {len(specs)} times, not every one named",
                         "name each camera: --camera door=v4l2:0 --camera yard=rtsp://...")
    template = dataclasses.replace(config.camera, name="")
    cameras = tuple(override(ServeConfig(camera=template), "camera", name=name, uri=uri).camera
                    for name, uri in specs)  # each URI checked as a [camera] uri flag is
    check_names(cameras, "--camera")  # named after the flags, not the file they replace
    return check(with_cameras(config, cameras))


def _print_config(config: ServeConfig) -> int:
    """The effective configuration as JSON on stdout, even when it cannot start (that is when it
    is most wanted); then what would stop the daemon at start: the first problem as the error
    (exit 2), any others each on an ``also:`` line before it."""
    import sys

    from edgekit.serve.config.preflight import preflight_problems

    problems = preflight_problems(config)
    print(json.dumps(config.to_dict(), indent=2), flush=True)
    for exc in problems[1:]:
        print(f"edgekit serve: also: {exc.message}" + (f" (fix: {exc.hint})" if exc.hint else ""), file=sys.stderr)
    if problems:
        raise problems[0]
    return 0


def _model_spec(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The model path and variant from ``BUNDLE[:VARIANT]`` (or the old ``--bundle PATH``) and
    ``--variant``; two different paths or variants are a usage error."""
    from edgekit.model import split_model_spec

    given = getattr(args, "bundle", None)
    old = getattr(args, "model_path", None)
    if given and old and given != old:
        raise UsageError(f"two models given: {given} and --bundle {old}", "give the bundle once, as BUNDLE[:VARIANT]")
    spec = given or old
    if not spec:
        return None, getattr(args, "variant", None)
    path, variant = split_model_spec(spec)
    flag = getattr(args, "variant", None)
    if variant and flag and variant != flag:
        raise UsageError(f"two variants asked for: {spec} and --variant {flag}", "give one")
    return str(path), variant or flag


def _verbosity_level(args: argparse.Namespace) -> str | None:
    """-v/-vv/-q as a [log] level (None: the file's, or the default); --log-level wins over both."""
    if getattr(args, "quiet", False):
        return "error"
    verbose = getattr(args, "verbose", 0) or 0
    return {0: None, 1: "info"}.get(verbose, "debug")


def _setup_logging(level: str) -> None:
    logger = logging.getLogger("edgekit")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        # journald stamps lines itself; elsewhere a timestamp helps.
        fmt = "%(levelname)s %(message)s"
        if not os.environ.get("INVOCATION_ID"):
            fmt = "%(asctime)s " + fmt
        handler.setFormatter(logging.Formatter(fmt))
        logger.addHandler(handler)
        logger.propagate = False


def main(args: argparse.Namespace) -> int:
    """``edgekit serve``: run until SIGTERM/SIGINT (exit 0), ``--max-frames`` or ``--duration``."""
    if getattr(args, "write_example_config", None):
        return _write_example_config(args.write_example_config, args.force)
    config = build_config(args)
    if getattr(args, "print_config", False):
        return _print_config(config)
    if not config.model.path and not config.model.source:
        raise UsageError("no model to serve", "give BUNDLE (a bundle folder or model file), --source s3://... "
                         "or [model] path in --config")
    from edgekit.camera import redact_uri
    from edgekit.runtime import describe_runtime
    from edgekit.serve.daemon import Daemon  # the service itself only when it is started

    _setup_logging(config.log.level)
    daemon = Daemon(config)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("%s: finishing the current frame and stopping", signal.Signals(signum).name)
        daemon.stop()
        # A second signal interrupts at once (the operator means it).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    # SIGHUP (systemctl reload) hot-swaps the bundle; its default action would kill the daemon silently.
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda _s, _f: daemon.request_reload("SIGHUP"))
    try:
        daemon.start()
        log.info("serving %s from %s", daemon.config.model.path, ", ".join(
            f"{c.name} ({redact_uri(c.uri)})" if c.name else redact_uri(c.uri) for c in config.camera_list))
        # What really runs (delegate, providers), not what was asked: a fallback shows here.
        log.info("runtime: %s", describe_runtime(daemon.stats().get("runtime") or {}))
        daemon.run(max_frames=args.max_frames, duration_s=args.duration)
    finally:
        daemon.close()  # idempotent; covers a start() that failed half-way
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


def _write_example_config(dest: str, force: bool) -> int:
    """``--write-example-config PATH``: the shipped example (package data), atomically."""
    from edgekit.deploy_files import read_deploy_file, write_text_atomic

    if dest == "-":
        print(read_deploy_file("config"), end="")
        return 0
    path = write_text_atomic(Path(dest), read_deploy_file("config"), force)
    print(f"wrote {path}; edit [model] and [camera], then: edgekit serve --config {path} --print-config")
    return 0

