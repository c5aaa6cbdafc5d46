"""Doctor checks of the vendor toolchains (``edgekit toolchain install rk3588|imx500``) and the Java
Sony's IMX500 converter runs. Reads each toolchain's ``toolchain.json``; runs nothing of the vendors'."""

from __future__ import annotations

from edgekit.doctor.base import INFO, MISSING, OK, Check, Env


def check_toolchains(env: Env) -> list[Check]:
    """One line per known toolchain (installed: where and its versions; else the install command),
    and Java where a toolchain needs it."""
    from edgekit.errors import TargetError
    from edgekit.toolchain.install import JAVA_FIX, java_major
    from edgekit.toolchain.specs import TOOLCHAINS
    from edgekit.toolchain.store import find_toolchain, toolchains_root

    out = []
    for name, spec in TOOLCHAINS.items():
        try:
            found = find_toolchain(name)
        except TargetError as exc:  # not installed, or its venv is gone: information, with the fix
            out.append(Check("toolchain", f"{name} toolchain", INFO,
                             f"not installed in {toolchains_root()}: {exc.hint} (to build --target {name})",
                             exc.hint or ""))
            continue
        versions = ", ".join(f"{k} {v}" for k, v in found.versions.items())
        out.append(Check("toolchain", f"{name} toolchain", OK, f"{versions} ({found.size_mb / 1000:.1f} GB)"))
        if spec.needs_java:
            java = env.which("java")
            major, text = java_major(java) if java else (0, "no java on PATH")
            ok = major >= spec.needs_java
            out.append(Check("toolchain", "Java", OK if ok else MISSING,
                             text if ok else f"{name} needs Java {spec.needs_java}+: {text}", "" if ok else JAVA_FIX))
    return out
