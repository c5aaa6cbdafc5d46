"""Which builders a target file may name: edgekit's own, an installed package's, or one the user trusts.

A target file names a ``package.module:name`` that a build imports and calls on this machine, so
(as a bundle's adapter must be a row of :mod:`edgekit.runtime.registry`) the builder is checked
against this allowlist before anything is imported: at build time, by
:func:`edgekit.builders.targets.resolve_targets`. The list lives on the build side, beside what
it names: in ``edgekit.target`` its rows made the target reader and the builders import each
other (a table row is an edge of the cycle check).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from edgekit.errors import TargetError

#: edgekit's own builders
BUILDERS = ("edgekit.builders.tflite:build", "edgekit.builders.onnx:build")
#: the entry-point group through which an installed package offers a builder (pyproject:
#: ``[project.entry-points."edgekit.builders"] mine = "mypkg.build:build"``)
BUILDER_ENTRY_POINTS = "edgekit.builders"
#: comma-separated "package.module:name" builders the user trusts (a builder under development)
TRUSTED_BUILDERS_ENV = "EDGEKIT_TRUSTED_BUILDERS"


def known_builders() -> list[str]:
    """Every builder a target file may name: edgekit's, installed packages' and the user's."""
    import os
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
