"""What went wrong with a Vector, and what to do: :class:`VectorError` and SDK-error translation.

:func:`translate` turns an SDK exception into a VectorError whose ``reason`` says what went
wrong and whose hint says what to do; :func:`diagnose_unreachable` tells "nothing answers"
from "something answers with the wrong certificate" with a TCP connect and a TLS handshake.
Imports the SDK only inside :func:`translate` (whose argument already came from it).
"""

from __future__ import annotations

import contextlib
import socket
import ssl

from edgekit.errors import EXIT_RUNTIME, EXIT_USAGE, CameraError, first_line

CONFIGURE_HINT = "run: python -m anki_vector.configure (wire-pod users: python -m anki_vector.configure_pod)"
RETRYABLE = frozenset({"not_found", "disconnected", "stalled", "control"})


class VectorError(CameraError):
    """A Vector that cannot be reached, refuses us, or stopped streaming.

    ``reason`` is one of: ``config`` (sdk_config.ini missing or incomplete), ``not_found``
    (nothing answers at the configured address), ``certificate`` (something answers but
    not with this robot's certificate/name), ``unauthenticated`` (wrong or expired guid),
    ``control`` (behaviour control not granted), ``version``, ``disconnected``, ``stalled``
    (no new camera image for too long), ``image`` (camera images that cannot be decoded),
    ``sdk`` (anything else the SDK raised).
    """

    def __init__(self, reason: str, message: str, hint: str | None = None):
        super().__init__(message, hint)
        self.reason = reason

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        """1 for a robot that is asleep, away or stopped streaming (runtime); 2 for a setup the user must fix."""
        return EXIT_RUNTIME if self.retryable or self.reason in ("sdk", "image") else EXIT_USAGE

    @property
    def retryable(self) -> bool:
        """True when waiting and reconnecting may help (robot asleep, moved, busy)."""
        return self.reason in RETRYABLE


def translate(
    exc: BaseException,
    serial: str,
    section: dict[str, str] | None = None,
    timeout_s: float | None = None,
    connected: bool = False,
) -> VectorError:
    """Turn an SDK exception into a VectorError with a reason and a fix hint.

    ``connected``: the error came from a working session (so an unreachable robot means a
    lost connection, and no network probe is made: this may run on the SDK's own thread).
    """
    from anki_vector import exceptions as ex

    section = section or {}
    where = f"{section.get('ip', '?')}:{section.get('port', '443')}"
    name = section.get("name", "?")
    if isinstance(exc, ex.VectorUnauthenticatedException):
        return VectorError(
            "unauthenticated",
            f"Vector {name} ({serial}) refused the SDK's credentials (guid)",
            f"the guid in sdk_config.ini is wrong or expired: {CONFIGURE_HINT}",
        )
    if isinstance(exc, ex.VectorControlTimeoutException):
        return VectorError(
            "control",
            f"Vector {name} did not grant behaviour control within {timeout_s or '?'} s",
            "another SDK program or the app holds control, or Vector is busy (charging, on its side): "
            "close the other program and try again",
        )
    if isinstance(exc, (ex.VectorNotFoundException, ex.VectorUnavailableException)):
        if connected:
            return VectorError(
                "disconnected",
                f"lost the connection to Vector {name}: {first_line(exc)}",
                "check the robot is on and on the network, then reconnect",
            )
        return diagnose_unreachable(serial, section)
    return _translate_other(exc, name, where)


def _translate_other(exc: BaseException, name: str, where: str) -> VectorError:
    """The rest of :func:`translate`: protocol version, control, configuration, event stream,
    unimplemented calls, and anything else the SDK raised."""
    from anki_vector import exceptions as ex

    if isinstance(exc, ex.VectorInvalidVersionException):
        return VectorError(
            "version",
            f"Vector {name} and this SDK speak different protocol versions",
            "update the robot (wire-pod) or pip install -U wirepod_vector_sdk",
        )
    if isinstance(exc, ex.VectorControlException):
        return VectorError(
            "control",
            f"Vector {name}: {first_line(exc)}",
            "connect with behavior_control=True to speak or use the face",
        )
    if isinstance(exc, ex.VectorConfigurationException):
        return VectorError("config", f"Vector SDK configuration: {first_line(exc)}", CONFIGURE_HINT)
    if isinstance(exc, ex.VectorUnreliableEventStreamException):
        return VectorError(
            "disconnected",
            f"Vector {name} at {where} accepted the connection but its event stream sent no robot state",
            "close the Vector app if it is connected; if this persists, restart the robot (or wire-pod)",
        )
    if isinstance(exc, ex.VectorUnimplementedException):
        return VectorError(
            "sdk",
            f"Vector {name} at {where} does not implement a call the SDK needs: {first_line(exc)}",
            "update the robot's firmware or wire-pod (or the program standing in for the robot)",
        )
    return VectorError("sdk", f"Vector {name} at {where}: {type(exc).__name__}: {first_line(exc)}",
                       "if it persists, restart the robot (or wire-pod) and try again")


def diagnose_unreachable(serial: str, section: dict[str, str]) -> VectorError:
    """Tell "nothing answers" from "something answers with the wrong certificate".

    The SDK reports both as VectorNotFoundException after its timeout. A TCP connect and
    a TLS handshake against the pinned certificate tell them apart in milliseconds.
    """
    ip, port, name = section.get("ip", ""), int(section.get("port", 443)), section.get("name", "?")
    where = f"{ip}:{port}"
    try:
        with socket.create_connection((ip, port), timeout=2.0) as sock:
            problem = _certificate_problem(sock, section)
    except OSError as exc:
        return VectorError(
            "not_found",
            f"Vector {name} ({serial}) is not reachable at {where} ({exc.strerror or exc})",
            "check it is switched on, awake and on this network; if its IP changed, " + CONFIGURE_HINT,
        )
    if problem:
        return VectorError(
            "certificate",
            f"the robot at {where} is not {name} as configured: {problem}",
            "the name or certificate in sdk_config.ini is wrong or stale: " + CONFIGURE_HINT,
        )
    return VectorError(
        "not_found",
        f"Vector {name} ({serial}) at {where} accepts connections but did not complete the SDK handshake",
        "restart the robot (or wire-pod) and try again",
    )


def _certificate_problem(sock: socket.socket, section: dict[str, str]) -> str | None:
    """Why the pinned certificate and robot name do not match what the peer presents, or None."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.set_alpn_protocols(["h2"])
    # the SDK pins the robot's own certificate; compare names ourselves, as the CN alone may carry it
    ctx.check_hostname = False
    try:
        ctx.load_verify_locations(cafile=section["cert"])
        with ctx.wrap_socket(sock, server_hostname=section.get("name")) as tls:
            peer = tls.getpeercert() or {}
    except ssl.SSLCertVerificationError as exc:
        return f"its certificate does not match the pinned one ({exc.verify_message})"
    except (ssl.SSLError, OSError) as exc:
        return f"TLS handshake failed ({exc})"
    # As gRPC checks it (RFC 6125): the subjectAltName DNS names when there are any, else the CN.
    names = {v for k, v in peer.get("subjectAltName", ()) if k == "DNS"}
    field = "subjectAltName"
    if not names:
        names = {v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"}
        field = "common name"
    if section.get("name") not in names:
        return f"its certificate's {field} is {', '.join(sorted(names)) or 'empty'}, not {section.get('name')}"
    return None


def describe_error(exc: BaseException) -> str:
    """One line for an exception; grpc errors as ``CODE: details``."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        with contextlib.suppress(Exception):
            return f"{code().name}: {details()}"
    return first_line(exc)
