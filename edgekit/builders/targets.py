"""A build's targets, resolved once: each ``--target`` read, checked and paired with its builder
and options, then handed down as it is.

:func:`resolve_targets` reads every target file (``edgekit.target``), refuses what cannot work
before any model is loaded (a target named twice, a builder this machine lacks, variants the
builder does not make) and returns one :class:`BuildTarget` per target: the target, its builder
(imported once) and its builder options (the ``[build]`` table with the request's laid over,
merged once). The build, the publisher and ``BuildContext.options_for`` read those; nothing
after this module looks the target up, checks it or merges its options again.

A target file names a ``package.module:name`` that a build imports and calls on this machine, so
(as a bundle's adapter must be a row of :mod:`edgekit.runtime.registry`) the builder is checked
against :func:`known_builders` before anything is imported. The list lives on the build side, beside
what it names: in ``edgekit.target`` its rows made the target reader and the builders import each
other (a table row is an edge of the cycle check).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.errors import TargetError, UsageError
from edgekit.target import Target, load_target
from edgekit.util.plugins import resolve

if TYPE_CHECKING:
    from edgekit.builders.context import Builder
    from edgekit.builders.request import BuildRequest


#: edgekit's own builders
BUILDERS = ("edgekit.builders.tflite:build", "edgekit.builders.onnx:build", "edgekit.builders.rknn:build",
            "edgekit.builders.imx500:build")
#: the entry-point group through which an installed package offers a builder (pyproject:
#: ``[project.entry-points."edgekit.builders"] mine = "mypkg.build:build"``)
BUILDER_ENTRY_POINTS = "edgekit.builders"
#: comma-separated "package.module:name" builders the user trusts (a builder under development)
TRUSTED_BUILDERS_ENV = "EDGEKIT_TRUSTED_BUILDERS"


def known_builders() -> list[str]:
    """Every builder a target file may name: edgekit's, installed packages' and the user's."""
    from importlib.metadata import entry_points

    found = list(BUILDERS)
    # a broken installed distribution's metadata: its builders are not offered (refused as unknown)
    with contextlib.suppress(Exception):
        found += [ep.value.replace(" ", "") for ep in entry_points(group=BUILDER_ENTRY_POINTS)]
    found += [b.strip() for b in os.environ.get(TRUSTED_BUILDERS_ENV, "").split(",") if b.strip()]
    return found


def check_builder(builder: str, path: Path | str) -> None:
    """Refuse (before anything is imported) a builder that is not in :func:`known_builders`."""
    if builder in known_builders():
        return
    raise TargetError(f"target file {path}: builder {builder!r} is not an edgekit builder (known: "
                      f"{', '.join(BUILDERS)})"[:400],
                      f"use one of those; for your own builder, declare it in the '{BUILDER_ENTRY_POINTS}' "
                      f"entry-point group of its package or name it in {TRUSTED_BUILDERS_ENV}")


@dataclass(frozen=True)
class BuildTarget:
    """One target of one build: the target file's :class:`~edgekit.target.Target`, the builder
    it names (resolved) and its builder options (``[build]`` with the request's overrides)."""

    target: Target
    builder: Builder
    options: Mapping[str, Any]

    @property
    def name(self) -> str:
        """The target's name (``edgetpu``, ``rpi``, ...)."""
        return self.target.name


def resolve_targets(request: BuildRequest) -> list[BuildTarget]:
    """The targets asked for, each once, buildable here, with the variants asked for checked
    against its builder; TargetError or UsageError (one line and its fix) otherwise."""
    targets = [load_target(t) for t in request.targets]
    if not targets:
        raise UsageError("no target given", "pass --target edgetpu,rpi,cpu,jetson")
    names = [t.name for t in targets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # the second build would replace the first bundle: twice the time for one result
        raise UsageError(f"target {', '.join(twice)} given more than once", "name each target once in --target")
    resolved = []
    overrides = request.builder_overrides()
    for target in targets:
        # the allowlist first: can_build's lookup of a dotted module imports its parent package
        check_builder(target.builder, target.source)
        ok, why = target.can_build()
        if not ok:  # before the model is loaded, not after minutes of work
            raise TargetError(f"cannot build {target.name} here: {why}",
                              "install what it needs, or build on a machine that has it (edgekit targets lists them)")
        planned = BuildTarget(target, resolve(target.builder, target.build_hint), target.build_options(overrides))
        _check_variants(planned, request)
        resolved.append(planned)
    return resolved


def _check_variants(planned: BuildTarget, request: BuildRequest) -> None:
    """Refuse variants the target's builder does not make, before any work: none is dropped silently.

    A builder module lists what it makes in ``VARIANTS``; a custom builder without the list is
    trusted. With the list, ``--io-dtype`` must come with an int8 variant.
    """
    name, variants = planned.name, planned.options.get("variants")
    if variants is None:
        return
    if not isinstance(variants, (list, tuple)) or not variants or not all(isinstance(v, str) for v in variants):
        raise UsageError(f"target {name}: variants {variants!r} is not a list of names",
                         'give a list such as variants = ["fp32", "int8"] in the target file')
    known = getattr(sys.modules.get(getattr(planned.builder, "__module__", ""), None), "VARIANTS", None)
    if known is None:  # a custom builder: its options are its own business
        return
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise UsageError(f"the {name} target cannot build {', '.join(unknown)} (it builds {', '.join(known)})",
                         f"choose --variants from {', '.join(known)}, or another --target")
    if request.io_dtype is not None and "int8" not in variants:
        raise UsageError(f"--io-dtype {request.io_dtype} applies to int8 models; the {name} target "
                         f"builds {', '.join(variants)}", "add int8 to --variants, or leave out --io-dtype")
