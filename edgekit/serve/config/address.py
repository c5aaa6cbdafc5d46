"""Addresses in the serve configuration: ``host:port`` ([http] listen) and camera URIs that
name a file or folder relative to the configuration file."""

from __future__ import annotations

from pathlib import Path

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


def camera_uri_relative_to(base_dir: Path, uri: str) -> str:
    """Make a file/folder camera URI relative to the config file, like the other paths in it."""
    for prefix in ("file:", "folder:"):
        if uri.startswith(prefix):
            rest = uri[len(prefix):]
            return prefix + (rest if Path(rest).is_absolute() else str(base_dir / rest))
    looks_like_path = "/" in uri or Path(uri).suffix.lower() in (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v")
    if uri and ":" not in uri and looks_like_path:  # a bare video file or image folder (not "synthetic")
        return uri if Path(uri).is_absolute() else str(base_dir / uri)
    return uri
