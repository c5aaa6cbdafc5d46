"""``make pi-check``'s aarch64 userland: Debian bookworm's arm64 Python 3.11 unpacked into a folder, and the
project's wheel installed for aarch64 by the host's pip; both cached under the user's cache dir.

No binfmt_misc, no chroot, no root needed past qemu-user-static: the emulator is called explicitly
(``qemu-aarch64-static -L ROOT ROOT/usr/bin/python3.11``), apt runs with a private state folder and
arm64 as its only architecture (it only downloads), and ``dpkg-deb -x`` unpacks without maintainer scripts.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SUITE = "bookworm"
MIRROR = os.environ.get("EDGEKIT_PI_MIRROR", "http://deb.debian.org/debian")
SECURITY = os.environ.get("EDGEKIT_PI_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# python3.11 pulls libc, libssl, zlib... by its Depends; the wheels' C++ extensions (LiteRT, OpenCV) need libstdc++
PACKAGES = ("python3.11", "libstdc++6", "libgcc-s1")
# what pip on bookworm (glibc 2.36) accepts; pip does not widen one --platform to the older glibcs, so all are named
PLATFORMS = [f"manylinux_2_{v}_aarch64" for v in range(36, 16, -1)] + ["manylinux2014_aarch64"]
CPUS = {  # qemu CPU model -> the /proc/cpuinfo a Raspberry Pi with that core shows (MIDR part, features)
    "cortex-a72": ("0xd08", "fp asimd evtstrm crc32 cpuid", "Raspberry Pi 4 Model B"),
    "cortex-a76": ("0xd0b", "fp asimd evtstrm crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp",
                   "Raspberry Pi 5 Model B"),
}


class PiCheckError(RuntimeError):
    """Something pi-check cannot do here; the message is one line with what to do."""


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/edgekit/pi-check``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgekit" / "pi-check"


def qemu() -> str:
    """The emulator's path; installs Debian's qemu-user-static when root, else says the one line to run."""
    found = shutil.which("qemu-aarch64-static")
    if found:
        return found
    if os.geteuid() != 0:
        raise PiCheckError("qemu-aarch64-static is missing: sudo apt-get install qemu-user-static")
    print("installing qemu-user-static (apt-get)", flush=True)
    subprocess.run([_tool("apt-get"), "install", "-y", "-q", "qemu-user-static"], check=True, stdout=subprocess.DEVNULL)
    return shutil.which("qemu-aarch64-static") or "/usr/bin/qemu-aarch64-static"


def _tool(name: str) -> str:
    """The full path of a Debian tool (apt-get, dpkg-deb)."""
    found = shutil.which(name)
    if not found:
        raise PiCheckError(f"pi-check needs {name}: run it on Debian or Ubuntu")
    return found


def _apt_options(apt: Path) -> list[str]:
    opts = {"APT::Architecture": "arm64", "APT::Architectures::": "arm64", "Dir::State": apt / "state",
            "Dir::State::status": apt / "state/status", "Dir::Cache": apt / "cache",
            "Dir::Etc::SourceList": apt / "sources.list", "Dir::Etc::SourceParts": apt / "none",
            "Dir::Etc::Preferences": apt / "none/prefs", "Dir::Etc::PreferencesParts": apt / "none",
            "Debug::NoLocking": "1"}  # a private state folder: nothing to lock against
    if os.geteuid() == 0:
        opts["APT::Sandbox::User"] = "root"  # the _apt user cannot write into root's cache dir
    return [x for key, value in opts.items() for x in ("-o", f"{key}={value}")]


def _download_debs(apt: Path) -> list[Path]:
    """The arm64 .debs of PACKAGES and everything they depend on (recommends left out), downloaded by apt."""
    if not Path(KEYRING).is_file() or not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise PiCheckError(f"pi-check needs apt-get and {KEYRING}: run it on Debian/Ubuntu "
                           "(sudo apt-get install debian-archive-keyring)")
    for sub in ("state/lists/partial", "cache/archives/partial", "none"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "state/status").touch()  # an empty dpkg database: every dependency is downloaded
    signed = f"[arch=arm64 signed-by={KEYRING}]"
    (apt / "sources.list").write_text(f"deb {signed} {MIRROR} {SUITE} main\n"
                                      f"deb {signed} {MIRROR} {SUITE}-updates main\n"
                                      f"deb {signed} {SECURITY} {SUITE}-security main\n")
    opts = _apt_options(apt)
    for step in (["update"], ["install", "-y", "--no-install-recommends", "--download-only", *PACKAGES]):
        done = subprocess.run([_tool("apt-get"), *opts, "-q", *step], capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
            raise PiCheckError(f"apt-get {step[0]} (arm64, {MIRROR}) failed: {' '.join(last)}")
    return sorted((apt / "cache/archives").glob("*.deb"))


def userland(cpu: str) -> Path:
    """The cached aarch64 root (built once: about 16 MB of .debs), with a Pi's /proc/cpuinfo for ``cpu``."""
    key = hashlib.sha256(f"{SUITE} {MIRROR} {SECURITY} {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
    root = cache_dir() / f"root-{SUITE}-{key}"
    if not (root / "usr/bin/python3.11").is_file():
        cache_dir().mkdir(parents=True, exist_ok=True)
        print(f"building the aarch64 {SUITE} userland in {root} ...", flush=True)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            debs = _download_debs(Path(tmp) / "apt")
            new = Path(tmp) / "root"
            for deb in debs:  # no maintainer scripts: none is needed to run python3.11
                subprocess.run([_tool("dpkg-deb"), "-x", str(deb), str(new)], check=True)
            shutil.rmtree(root, ignore_errors=True)
            new.rename(root)  # appears whole or not at all
    _write_cpuinfo(root, cpu)
    return root


def _write_cpuinfo(root: Path, cpu: str) -> None:
    # qemu 7.2 passes the host's x86 /proc/cpuinfo through, and the cpuinfo library inside LiteRT
    # (XNNPACK) then crashes with a NULL dereference while creating the interpreter; `-L ROOT` makes
    # qemu open ROOT/proc/cpuinfo first, so the emulated program reads what a Pi shows.
    part, features, model = CPUS[cpu]
    block = ("processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: " + features + "\nCPU implementer\t: 0x41\n"
             "CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: " + part + "\nCPU revision\t: 1\n\n")
    text = "".join(block.format(i=i) for i in range(os.cpu_count() or 1)) + f"Model\t\t: {model}\n"
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/cpuinfo").write_text(text)


def build_wheel(repo: Path, out: Path) -> Path:
    """The project's wheel, built from the checkout without isolation (offline, like the tests)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(repo)], check=True, stdout=subprocess.DEVNULL)
    wheels = sorted(out.glob("edgekit_vision-*.whl"))
    if not wheels:
        raise PiCheckError(f"pip wheel made no edgekit_vision wheel in {out}")
    return wheels[-1]


def _requires(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return "\n".join(line for line in z.read(meta).decode().splitlines() if line.startswith("Requires-Dist"))


def install(wheel: Path, extras: str, arch: str) -> tuple[Path, bool]:
    """(site folder of the wheel's dependencies for ``[extras]`` on ``arch``, whether it came from the cache).

    Installed as a user would, ``pip install '<wheel>[extras]'``, for aarch64 with ``--platform``; the
    dependencies are cached by the wheel's Requires-Dist, and edgekit itself is dropped from this folder:
    :func:`edgekit_layer` lays the current checkout's wheel over it on every run.
    """
    key = hashlib.sha256(f"{arch} {extras} {PLATFORMS} {_requires(wheel)}".encode()).hexdigest()[:12]
    site = cache_dir() / f"site-{arch}-{extras.replace(',', '-')}-{key}"
    if site.is_dir():
        return site, True
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-warn-conflicts", "--no-compile", "--target"]
    if arch == "aarch64":
        cmd[-1:-1] = [*(x for tag in PLATFORMS for x in ("--platform", tag)), "--only-binary=:all:",
                      "--python-version", "3.11", "--implementation", "cp"]
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        done = subprocess.run([*cmd, str(Path(tmp) / "site"), f"{wheel}[{extras}]"], capture_output=True, text=True)
        if done.returncode != 0:
            raise PiCheckError(f"pip install '[{extras}]' for {arch} failed: "
                               + " ".join(done.stderr.strip().splitlines()[-1:]))
        for own in (Path(tmp) / "site").glob("edgekit*"):
            shutil.rmtree(own)
        shutil.rmtree(Path(tmp) / "site/bin", ignore_errors=True)  # console scripts with this host's shebang
        (Path(tmp) / "site").rename(site)
    return site, False


def edgekit_layer(wheel: Path, into: Path) -> Path:
    """The wheel's files unpacked into ``into`` (a pure-Python wheel: unpacking is installing)."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into)
    return into


def tree_size(*folders: Path) -> int:
    """Bytes of the files under the folders (links not followed), leaving out ``__pycache__``: runs write
    bytecode into the cached install, and the figure must not grow from one run to the next."""
    return sum(p.lstat().st_size for f in folders for p in f.rglob("*")
               if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts)


def python_command(arch: str, root: Path | None, emulator: str | None, cpu: str) -> list[str]:
    """The interpreter to run: the emulated aarch64 python3.11 or this host's. ``-S``: no site-packages
    of the host's venv can leak in (PYTHONPATH alone says what is installed); ``-P``: nor the cwd."""
    if arch == "aarch64":
        return [emulator or "qemu-aarch64-static", "-cpu", cpu, "-L", str(root), str(root / "usr/bin/python3.11"),
                "-S", "-P"]
    return [sys.executable, "-S", "-P"]
