"""Resolve "package.module:attr" strings lazily, turning a missing extra into a hint.

Targets name their builder and runtime adapter this way (as fsspec names its
filesystems), so importing edgekit never imports a backend it will not use.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgekit.errors import BackendUnavailable


def resolve(dotted: str, install_hint: str | None = None) -> Any:
    """Import and return the object named by ``"package.module:attr"``.

    Raises BackendUnavailable with ``install_hint`` when the import fails because a
    dependency is missing.
    """
    module_name, _, attr = dotted.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise BackendUnavailable(
            f"{dotted} needs the missing module {missing!r}",
            install_hint or "install the extra that provides it",
        ) from exc
    try:
        return getattr(module, attr) if attr else module
    except AttributeError as exc:
        raise BackendUnavailable(f"{module_name} has no attribute {attr!r}",
                                 "check the 'package.module:name' spelling") from exc
