"""Doctor checks of the Edge TPU: libedgetpu, a Coral on USB (by vendor/product id in sysfs) or
PCIe (``/dev/apex_0``), and the host-side ``edgetpu_compiler``."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from edgekit.doctor.base import MISSING, OK, WARN, Check, Env, read_text, run_program

EDGETPU_USB_IDS = {
    ("1a6e", "089a"): "Coral USB Accelerator (before first use: the runtime loads its firmware)",
    ("18d1", "9302"): "Coral USB Accelerator (initialised)",
}
EDGETPU_LIBRARY = "libedgetpu.so.1"
CORAL_APT = (
    "add Coral's apt repository (https://coral.ai/software/#debian-packages), then "
    "sudo apt install libedgetpu1-std (a build matching your LiteRT version)"
)


def _dpkg_version(env: Env, packages: list[str]) -> str | None:
    dpkg = env.which("dpkg-query")
    if not dpkg:
        return None
    for pkg in packages:
        code, text = run_program([dpkg, "-W", "-f=${Version}", pkg])
        if code == 0 and text:
            return f"{pkg} {text.splitlines()[0]}"
    return None


def _loaded_path(fragment: str) -> str | None:
    maps = read_text(Path("/proc/self/maps")) or ""
    for line in maps.splitlines():
        if fragment in line and "/" in line:
            return line[line.index("/") :]
    return None


def check_edgetpu(env: Env) -> list[Check]:
    """libedgetpu, an Edge TPU on USB or PCIe, and edgetpu_compiler."""
    return [_libedgetpu(env), _usb(env), _pcie(env), _compiler(env)]


def _libedgetpu(env: Env) -> Check:
    try:
        ctypes.CDLL(EDGETPU_LIBRARY)
    except OSError:
        return Check("edgetpu", "libedgetpu", MISSING, f"{EDGETPU_LIBRARY} not found", CORAL_APT)
    where = _loaded_path("libedgetpu") or EDGETPU_LIBRARY
    version = _dpkg_version(env, ["libedgetpu1-std", "libedgetpu1-max"]) or "version unknown (not from dpkg)"
    return Check("edgetpu", "libedgetpu", OK, f"{where}; {version}")


def _usb(env: Env) -> Check:
    found = []
    for dev in sorted(env.p("sys", "bus", "usb", "devices").glob("*")):
        ids = (read_text(dev / "idVendor") or "", read_text(dev / "idProduct") or "")
        if ids in EDGETPU_USB_IDS:
            speed = read_text(dev / "speed") or "?"
            found.append((dev.name, ids, speed))
    if not found:
        return Check(
            "edgetpu",
            "Edge TPU (USB)",
            MISSING,
            "no device 1a6e:089a or 18d1:9302 on USB",
            "plug in the Coral USB Accelerator (lsusb shows 1a6e:089a, then 18d1:9302 once used)",
        )
    name, ids, speed = found[0]
    slow = speed not in ("5000", "10000", "20000")  # Mb/s: USB 3 and up
    return Check(
        "edgetpu",
        "Edge TPU (USB)",
        WARN if slow else OK,
        f"{EDGETPU_USB_IDS[ids]} {ids[0]}:{ids[1]} at {name}, {speed} Mb/s"
        + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""),
        "plug it into a USB 3 port (blue): USB 2 makes every inference slower" if slow else "",
    )


def _pcie(env: Env) -> Check:
    apex = env.p("dev", "apex_0")
    if not apex.exists():
        return Check(
            "edgetpu",
            "Edge TPU (PCIe)",
            MISSING,
            "no /dev/apex_0",
            "M.2/Mini PCIe Coral: sudo apt install gasket-dkms libedgetpu1-std, then reboot",
        )
    ok = os.access(apex, os.R_OK | os.W_OK)
    return Check(
        "edgetpu",
        "Edge TPU (PCIe)",
        OK if ok else WARN,
        f"{apex}" + ("" if ok else ": no read/write permission"),
        "" if ok else "sudo usermod -aG apex $USER (then log in again)",
    )


def _compiler(env: Env) -> Check:
    compiler = env.which("edgetpu_compiler")
    if not compiler:
        return Check(
            "edgetpu",
            "edgetpu_compiler",
            MISSING,
            "not on PATH (host-side tool)",
            "x86-64 Linux only: sudo apt install edgetpu-compiler from Coral's apt repository "
            "(to build Edge TPU bundles; devices do not need it)",
        )
    code, text = run_program([compiler, "--version"])
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if code != 0:
        return Check("edgetpu", "edgetpu_compiler", WARN, f"{compiler} --version fails: {'; '.join(lines)[:160]}",
                     "reinstall it: sudo apt install --reinstall edgetpu-compiler")
    version = next((ln for ln in lines if ln.startswith("Edge TPU Compiler version")), None)
    if version is None:  # a wrapper or another program under that name
        return Check("edgetpu", "edgetpu_compiler", WARN,
                     f"{compiler} --version does not print 'Edge TPU Compiler version': {'; '.join(lines)[:160]}",
                     "put Coral's compiler first on PATH (sudo apt install edgetpu-compiler)")
    return Check("edgetpu", "edgetpu_compiler", OK, version)
