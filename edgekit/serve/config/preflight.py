"""Checks a configuration must pass before the daemon starts (and ``serve --print-config``).

:mod:`edgekit.serve.config.load` checks each value by itself (types, ranges, choices). This
module checks what the values point at, without opening anything: the model path exists
and a bundle's manifest reads; the HTTP host resolves; the camera URI and options match a
row of :data:`edgekit.camera.SCHEMES`, and an ``imx500`` camera pairs only with its own imx500
model (:mod:`edgekit.serve.config.sensor`); the MQTT password and TLS files are regular files that
read (the TLS ones load into an SSL context, the certificate matching its key); the results
file's directory can exist. A configuration ``--print-config`` approves then starts, and a
malformed camera URI (``synthetic:320x240@-5``) is a start-up error, not a camera fault
retried forever while systemd believes the service is up.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError, ModelError, UsageError
from edgekit.serve.config.load import ServeConfig, parse_address
from edgekit.serve.config.sensor import check_pairing


def preflight(config: ServeConfig, model: bool = True, camera: bool = True) -> None:
    """Raise UsageError (one line, with what to do) for a configuration that cannot start.

    ``model``/``camera`` False skip those checks (a caller that opens them its own way).
    """
    for check in _checks(config, model, camera):
        check()


def preflight_problems(config: ServeConfig) -> list[EdgekitError]:
    """Every problem that would stop the daemon at start, each check run (``--print-config``
    shows them all, under the configuration, rather than stopping at the first)."""
    problems = []
    for check in _checks(config, True, True):
        try:
            check()
        except EdgekitError as exc:
            problems.append(exc)
    return problems


def _checks(config: ServeConfig, model: bool, camera: bool) -> list:
    where = "" if config.source == "defaults" else f"{config.source}: "
    checks = []
    if model and config.model.source:  # a fleet device: its model comes from the store
        checks.append(lambda: check_fleet(config.model, where))
    elif model:
        checks.append(lambda: check_model(config.model.path, where))
    if camera:  # every camera, each named in its message
        checks += [lambda c=c: check_camera(c.uri, c.options, where, c.name) for c in config.camera_list]
        checks.append(lambda: check_pairing(config, where, model))  # the AI Camera serves its own network only
    if config.http.listen:
        checks.append(lambda: check_listen(config.http.listen, where))
    if config.mqtt.host and config.mqtt.password_file:
        checks.append(lambda: check_readable(config.mqtt.password_file, "[mqtt] password_file", where))
    if config.mqtt.host and config.mqtt.tls:
        checks.append(lambda: check_tls(config.mqtt, where))
    if config.output.jsonl not in ("", "-", "auto"):  # auto: stdout, or the unit's StateDirectory
        checks.append(lambda: check_output(config.output.jsonl, where))
    return checks


def check_fleet(model: Any, where: str) -> None:
    """Every trusted key reads as an Ed25519 public key (the store is not asked: it may be down)."""
    from edgekit.fleet.keys import read_trusted

    try:
        read_trusted(list(model.trusted_keys), "[model] trusted_keys")
    except UsageError as exc:
        raise UsageError(f"{where}{exc.message}", exc.hint) from exc


def check_model(path: str, where: str) -> None:
    """The model path is set and exists; a bundle's manifest reads (hashes are checked at load)."""
    if not path:
        raise UsageError(f"{where}no model to serve",
                         "give the bundle first (edgekit serve BUNDLE[:VARIANT]) or set [model] path")
    from edgekit.model import split_model_spec

    target, _variant = split_model_spec(path)
    if not target.exists():
        raise ModelError(f"{where}[model] path {target} does not exist", "copy the bundle there or fix the path")
    if target.is_dir():
        from edgekit.bundle import load_bundle

        try:
            load_bundle(target, check_hashes=False, allow_rejected=True)
        except EdgekitError as exc:
            raise UsageError(f"{where}[model] path: {exc.message}", exc.hint) from exc


def check_camera(uri: str, options: dict, where: str, name: str = "") -> None:
    """The URI names a known scheme in a valid form and every option is one it takes (``name``:
    the camera's, in the message)."""
    from edgekit.camera import check_options, locate_scheme, redact_uri

    label = redact_uri(uri)
    try:
        scheme, _target = locate_scheme(uri.strip())
        check_options(scheme, dict(options), label)
    except EdgekitError as exc:
        raise UsageError(f"{where}[camera{' ' + name if name else ''}] {exc.message}", exc.hint) from exc


def check_listen(listen: str, where: str) -> None:
    """``[http] listen`` is host:port with a host this machine can resolve."""
    host, port = parse_address(listen, 9100, "[http] listen", where.removesuffix(": "))
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"{where}[http] listen {listen!r}: cannot resolve host {host!r} ({exc})",
                         "use an address, e.g. 127.0.0.1:9100, or 'off'") from exc


def check_readable(path: str, what: str, where: str) -> None:
    """A file the daemon must read at start exists, is a regular file (a FIFO would block the
    start for ever) and can be read."""
    from edgekit.util.safe_open import NotARegularFile, check_regular

    if not Path(path).exists():
        raise UsageError(f"{where}{what} {path} does not exist", "create it or fix the path")
    try:
        check_regular(path)
    except NotARegularFile as exc:
        raise UsageError(f"{where}{what} {exc}", "name the file itself (PEM or text), not a pipe or device") from exc
    except OSError as exc:
        raise UsageError(f"{where}{what} {path} cannot be read: {exc.strerror or exc}",
                         "give the service user read access") from exc


def check_tls(mqtt: Any, where: str) -> None:
    """``[mqtt]`` TLS files load as the MQTT client will load them at start (paho's ``tls_set``: a
    CA bundle, a certificate with its key): garbage, a key of another certificate or an encrypted
    key is refused here, so ``--print-config`` approves only what starts."""
    import ssl

    files = [(key, getattr(mqtt, key)) for key in ("ca_file", "cert_file", "key_file") if getattr(mqtt, key)]
    for key, path in files:
        check_readable(path, f"[mqtt] {key}", where)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    step = "ca_file"
    try:
        if mqtt.ca_file:
            context.load_verify_locations(cafile=mqtt.ca_file)
        step = "cert_file/key_file" if mqtt.key_file else "cert_file"
        if mqtt.cert_file:
            # a passphrase would be asked on a terminal the service does not have: refused instead
            context.load_cert_chain(mqtt.cert_file, mqtt.key_file or None, password=_no_passphrase)
    except (ssl.SSLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None)
        reason = str(reason).lower().replace("_", " ") if reason else getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"{where}[mqtt] {step}: cannot load it for TLS ({reason})",
                         "give PEM files: the broker's CA certificate, and a client certificate with its own "
                         "unencrypted key") from exc


def _no_passphrase() -> bytes:
    raise ValueError("the key is encrypted; the service cannot type its passphrase")


def check_output(path: str, where: str) -> None:
    """The results file is not a directory and its nearest existing ancestor is a writable directory."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{where}[output] jsonl {path} is a directory", "name a file inside it")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{where}[output] jsonl {path}: {parent} is a file, not a directory",
                         "choose another path for the results")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{where}[output] jsonl {path}: cannot write in {parent}",
                         "give the service user write access or choose another path")
