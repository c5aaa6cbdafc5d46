"""How a task head checks its options: one :class:`~edgekit.util.optionspec.Option` list per head.

The table (:mod:`edgekit.heads.table`) and the head's factory read the same list, so a head's
option names, types, ranges and defaults are written once. Head options come from a bundle's
``task_options`` or from ``-T KEY=VALUE`` (parsed as JSON), so values are typed: ``"0.5"`` is
not a number here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from edgekit.errors import UsageError
from edgekit.util.optionspec import Option, OptionValueError, by_name, did_you_mean


def unknown_option(task: str, key: str, names: Iterable[str]) -> UsageError:
    """The one-line error for an option ``task`` does not take, with a did-you-mean."""
    names = list(names)
    fix = did_you_mean(key, names)
    return UsageError(f"task {task!r} has no option {key!r}",
                      fix if fix.startswith("did you mean") else f"{task} accepts: {', '.join(names)}")


def head_value(task: str, option: Option, value: Any, example: Any = None) -> Any:
    """``value`` checked against ``option`` (typed, no text); UsageError ``{task} {name} must be ...``
    whose fix shows ``example`` (default: the option's default) as a ``-T`` flag."""
    try:
        return option.coerce(value, text=False)
    except OptionValueError as exc:
        shown = option.default if example is None else example
        text = shown if isinstance(shown, str) else json.dumps(shown)  # as typed after -T (JSON, bare words)
        fix = f"e.g. -T {option.name}={text}" if shown is not None else option.describe()
        raise UsageError(f"{task} {option.name} must be {exc.what}, not {value!r}",
                         fix + (f" ({option.help})" if option.help and shown is None else "")) from None


def check_head_options(task: str, spec: Iterable[Option], given: Mapping[str, Any],
                       skip: tuple[str, ...] = (), examples: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``given`` checked against ``spec``: the first unknown key (sorted) refused with a did-you-mean,
    each value coerced (None passes: the head's default); keys in ``skip`` pass unchecked (a head
    checks those itself: anchors, tables of sub-options); ``examples`` are shown in fixes where an
    option's default is None."""
    declared = by_name(spec)
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise unknown_option(task, unknown[0], declared)
    examples = examples or {}
    return {key: value if key in skip else head_value(task, declared[key], value, examples.get(key))
            for key, value in given.items()}
