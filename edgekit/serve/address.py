"""``host:port`` parsing for the addresses in the serve configuration ([http] listen)."""

from __future__ import annotations

from edgekit.errors import UsageError


def parse_address(text: str, default_port: int, what: str = "address", where: str = "") -> tuple[str, int]:
    """Split ``host``, ``host:port``, ``:port`` or ``[v6addr]:port`` into ``(host, port)``."""
    prefix = f"{where}: " if where else ""
    host, port_text = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise UsageError(f"{prefix}{what} {text!r} has a bad port", "write host:port, e.g. 127.0.0.1:9100")
    return host or "127.0.0.1", port
