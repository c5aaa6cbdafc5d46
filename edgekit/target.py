"""Targets: one flat TOML file each, read into a frozen dataclass.

A target says how an artifact is made (builder + build options) and how it is run
(runtime adapter + options). The files ship inside the package (edgekit/targets/) so an
installed edgekit knows them; ``--target path/to/file.toml`` loads a custom one.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import TargetError, first_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 devices only
    import tomli as tomllib

TARGETS_DIR = Path(__file__).parent / "targets"


def merge_options(defaults: Mapping[str, Any], overrides: Mapping[str, Any],
                  keys: Iterable[str] | None = None) -> dict[str, Any]:
    """The one precedence rule for layered options: what was given wins over the file, key by key.

    ``defaults`` come from a file (a target's ``[build]`` or ``[runtime.options]`` table, the
    ``preprocess.json`` beside a model); ``overrides`` hold only what was given (command-line
    flags, keyword arguments, a builder's choice for its bundle). A key absent from
    ``overrides`` keeps its default; a key present wins even when its value is None
    (``--crop none`` replaces a saved crop). ``keys``, when given, keeps only those keys.

    >>> merge_options({"variants": ["fp32"], "default": "fp32"}, {"variants": ["int8"]})
    {'variants': ['int8'], 'default': 'fp32'}
    """
    merged = {**defaults, **overrides}
    if keys is not None:
        wanted = set(keys)
        merged = {k: v for k, v in merged.items() if k in wanted}
    return merged


@dataclass(frozen=True)
class Target:
    """A deployment target as declared in ``targets/<name>.toml``."""

    name: str
    summary: str
    builder: str
    adapter: str
    build_requires: tuple[str, ...]
    run_requires: tuple[str, ...]
    build_hint: str
    run_hint: str
    build: dict[str, Any] = field(default_factory=dict)
    runtime_options: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    toolchain: str = ""  # a vendor toolchain the build runs in (edgekit toolchain install NAME), if any

    def build_options(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """This target's ``[build]`` table with ``overrides`` (the user's) laid over it."""
        return merge_options(self.build, overrides)

    def can_build(self) -> tuple[bool, str]:
        """Whether this machine has the Python modules the builder needs (and its vendor toolchain), and why not."""
        ok, why = _have_modules(self.build_requires, self.build_hint)
        if not ok or not self.toolchain:
            return ok, why
        from edgekit.toolchain.store import has_toolchain

        name = self.toolchain
        installed, where = has_toolchain(name)
        if not installed:
            return False, f"the {name} toolchain is not installed (edgekit toolchain install {name})"
        return True, f"ok (toolchain {where})"

    def can_run(self) -> tuple[bool, str]:
        """Whether this machine has what the runtime adapter needs, and why not."""
        ok, why = _have_modules(self.run_requires, self.run_hint)
        if not ok:
            return ok, why
        needs_lib = self.runtime_options.get("delegate") == "edgetpu"
        if needs_lib and not _have_shared_library("libedgetpu.so.1"):
            return False, "libedgetpu.so.1 not found (install libedgetpu1-std from Coral's apt repository)"
        return True, "ok"


def _have_modules(names: tuple[str, ...], hint: str) -> tuple[bool, str]:
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        return False, f"missing {', '.join(missing)} ({hint})"
    return True, "ok"


def _have_shared_library(name: str) -> bool:
    import ctypes.util

    if ctypes.util.find_library(name.split(".so")[0].removeprefix("lib")):
        return True
    for d in ("/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/lib"):
        if (Path(d) / name).exists():
            return True
    return shutil.which(name) is not None


def available_targets() -> list[str]:
    """Names of the targets shipped with edgekit, sorted."""
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


@dataclass(frozen=True)
class UnbuildableTarget:
    """An accelerator edgekit knows of but cannot build for here: what it is, why not, what to do."""

    name: str
    summary: str
    why: str
    fix: str


UNBUILDABLE: dict[str, UnbuildableTarget] = {t.name: t for t in (
    UnbuildableTarget(
        "hailo", "Hailo-8/8L (Raspberry Pi AI HAT+): a HEF from Hailo's Dataflow Compiler",
        "Hailo's Dataflow Compiler is not on PyPI (hailo_dataflow_compiler, hailort: no versions)",
        "compile with Hailo's Dataflow Compiler from hailo.ai; build --target rpi or cpu meanwhile"),
)}
"""Targets ``edgekit targets`` lists as not buildable here, and ``--target`` refuses with the reason."""


def load_target(name_or_path: str) -> Target:
    """Load a shipped target by name, or a custom target from a ``.toml`` path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = TARGETS_DIR / f"{name_or_path}.toml"
    if not path.is_file() and name_or_path in UNBUILDABLE:
        planned = UNBUILDABLE[name_or_path]
        raise TargetError(f"cannot build {planned.name} here: {planned.why}", planned.fix)
    if not path.is_file():
        known = ", ".join(available_targets())
        raise TargetError(f"unknown target {name_or_path!r}", f"choose one of: {known}, or give a .toml path")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise TargetError(f"target file {path} is not valid TOML: {first_line(exc)}",
                          "fix the file (edgekit/targets/cpu.toml is an example)") from exc
    except RecursionError as exc:  # tomllib recurses once per nested array or inline table
        raise TargetError(f"target file {path} nests arrays or tables too deeply to be a target file",
                          "fix the file (edgekit/targets/cpu.toml is an example)") from exc
    return _target_from(raw, path)


def _target_from(raw: dict[str, Any], path: Path) -> Target:
    """A Target from a parsed target file, every key's type checked (TargetError names the key)."""

    def get(key: str, kind: type, default: Any = None) -> Any:
        value = raw.get(key, default)
        if value is None:
            raise TargetError(f"target file {path} lacks the required key {key!r}", _TARGET_FIX)
        if not isinstance(value, kind) or (kind is list and not all(isinstance(v, str) for v in value)):
            raise TargetError(f"target file {path}: {key!r} must be {_KINDS[kind]}, not {value!r}"[:300], _TARGET_FIX)
        return value

    name, summary = get("name", str), get("summary", str)
    runtime = get("runtime", dict, {})
    options = runtime.get("options", {})
    if not isinstance(options, dict):
        raise TargetError(f"target file {path}: [runtime.options] must be a table", _TARGET_FIX)
    for key in ("builder", "adapter"):
        if ":" not in get(key, str):
            raise TargetError(f"target file {path}: {key} {raw[key]!r} is not 'package.module:name'", _TARGET_FIX)
    check_adapter(raw["adapter"], path)
    requires = {key: tuple(get(key, list, [])) for key in ("build_requires", "run_requires")}
    for key, names in requires.items():
        bad = [n for n in names if not _MODULE.fullmatch(n)]
        if bad:
            raise TargetError(f"target file {path}: {key} names {bad[0]!r}, not a Python module", _TARGET_FIX)
    return Target(
        name=name, summary=summary, builder=get("builder", str),
        adapter=get("adapter", str), build_requires=requires["build_requires"],
        run_requires=requires["run_requires"],
        build_hint=get("build_hint", str, "pip install 'edgekit-vision[build]'"),
        run_hint=get("run_hint", str, "pip install 'edgekit-vision[litert]'"),
        build=dict(get("build", dict, {})), runtime_options=dict(options), source=str(path),
        toolchain=_toolchain(raw.get("toolchain", ""), path),
    )


def _toolchain(name: Any, path: Path) -> str:
    """A target file's ``toolchain``: one ``edgekit toolchain install`` knows (TargetError otherwise)."""
    if name == "":
        return ""
    from edgekit.toolchain.specs import TOOLCHAINS

    if not isinstance(name, str) or name not in TOOLCHAINS:
        raise TargetError(f"target file {path}: toolchain {name!r} is not one edgekit installs",
                          f"use one of: {', '.join(TOOLCHAINS)}, or leave it out")
    return str(name)


def check_adapter(adapter: str, path: Path | str) -> None:
    """Refuse an adapter no bundle could be opened with (not a row of the backends table)."""
    from edgekit.runtime.registry import known_adapters

    if adapter not in known_adapters():
        raise TargetError(f"target file {path}: adapter {adapter!r} is not an edgekit runtime adapter"[:400],
                          f"use one of: {', '.join(known_adapters())}")


_TARGET_FIX = "compare with a shipped target file (edgekit/targets/cpu.toml)"
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_KINDS = {str: "a string", list: "a list of strings", dict: "a table"}
