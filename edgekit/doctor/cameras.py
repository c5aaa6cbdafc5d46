"""Doctor checks of cameras: V4L2 devices (``/dev/video*``) and picamera2."""

from __future__ import annotations

import os

from edgekit.doctor.base import MISSING, OK, WARN, Check, Env, dist_version, has_module, read_text


def check_cameras(env: Env) -> list[Check]:
    """V4L2 camera devices and picamera2."""
    out = []
    devices = sorted(env.p("dev").glob("video*"), key=lambda p: (len(p.name), p.name))
    if devices:
        names = []
        unreadable = []
        for d in devices:
            label = read_text(env.p("sys", "class", "video4linux", d.name, "name"))
            names.append(f"{d.name}" + (f" ({label})" if label else ""))
            if not os.access(d, os.R_OK | os.W_OK):
                unreadable.append(d.name)
        out.append(
            Check(
                "camera",
                "cameras (V4L2)",
                WARN if unreadable else OK,
                ", ".join(names),
                f"sudo usermod -aG video $USER (no access to {', '.join(unreadable)})" if unreadable else "",
            )
        )
    else:
        out.append(
            Check(
                "camera",
                "cameras (V4L2)",
                MISSING,
                "no /dev/video* devices",
                "connect a USB camera (it appears as /dev/video0); or use --camera file:VIDEO / folder:DIR",
            )
        )
    pc = has_module("picamera2")
    out.append(
        Check(
            "camera",
            "picamera2",
            OK if pc else MISSING,
            (dist_version("picamera2") or "installed") if pc else "not importable",
            ""
            if pc
            else "Raspberry Pi OS only: sudo apt install python3-picamera2 (with a venv, create "
            "it with --system-site-packages)",
        )
    )
    return out
