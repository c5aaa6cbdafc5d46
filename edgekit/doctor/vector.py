"""Doctor checks of the Anki Vector robot: the SDK and its configuration (secrets never printed)."""

from __future__ import annotations

import configparser
from pathlib import Path

from edgekit.doctor.base import MISSING, OK, WARN, Check, Env, dist_version, has_module
from edgekit.errors import first_line


def check_vector(env: Env) -> list[Check]:
    """The Vector SDK (wirepod_vector_sdk) and ~/.anki_vector/sdk_config.ini (secrets are never printed)."""
    out = []
    sdk = dist_version("wirepod_vector_sdk", "wirepod-vector-sdk") if has_module("anki_vector") else None
    out.append(
        Check(
            "vector",
            "Vector SDK",
            OK if sdk else MISSING,
            f"wirepod_vector_sdk {sdk}" if sdk else "anki_vector not installed",
            "" if sdk else "pip install 'edgekit-vision[vector]'",
        )
    )
    ini = env.home_dir / ".anki_vector" / "sdk_config.ini"
    configure = "python -m anki_vector.configure (asks for the wire-pod address and the robot's name, IP and serial)"
    if not ini.is_file():
        out.append(Check("vector", "Vector configuration", MISSING, "no ~/.anki_vector/sdk_config.ini", configure))
        return out
    parser = configparser.ConfigParser()
    try:
        parser.read(ini)
    except configparser.Error as exc:
        out.append(Check("vector", "Vector configuration", WARN, f"unreadable: {first_line(exc)}", configure))
        return out
    robots, problems = [], []
    for serial in parser.sections():
        sec = parser[serial]
        lacking = [k for k in ("cert", "ip", "name", "guid") if not sec.get(k)]
        cert = sec.get("cert")
        if cert and not Path(cert).is_file():  # the SDK opens the path as written (no ~ expansion)
            lacking.append(f"cert file {cert}")
        robots.append(f"{sec.get('name', '?')} (serial {serial}, {sec.get('ip', '?')})")
        if lacking:
            problems.append(f"{serial} lacks {', '.join(lacking)}")
    if not robots:
        out.append(Check("vector", "Vector configuration", MISSING, f"{ini} lists no robot", configure))
    else:
        out.append(
            Check(
                "vector",
                "Vector configuration",
                WARN if problems else OK,
                "; ".join(robots) + (f"; {'; '.join(problems)}" if problems else ""),
                configure if problems else "",
            )
        )
    return out
