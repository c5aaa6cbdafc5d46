"""Which variants a bench runs and how each is opened: ``BUNDLE`` / ``BUNDLE:VARIANT`` / model
files expanded (:func:`expand_variants`), each opened once per backend asked for (:func:`open_all`),
runtime flags applied where an adapter takes them, and with ``--skip-unavailable`` what this machine
cannot run left out with the reason: a runtime, delegate or device that is missing, and a bundle
built for an accelerator that would run without it (an Edge TPU bundle whose model would run on
the CPU: its figures would be this host's, not the device's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgekit.errors import BackendUnavailable, DeviceError, EdgekitError, ModelError, UnknownOptionError, UsageError
from edgekit.model import OpenModel, open_model, split_model_spec


def expand_variants(specs: Sequence[str], variants: str = "default") -> list[tuple[str, str | None]]:
    """Expand model arguments into ``(path, variant)`` pairs, in order.

    ``BUNDLE:fp16`` names one model of a bundle; a plain bundle gives its default model,
    every model with ``variants="all"``, or the listed ones with ``variants="fp32,int8"``.
    Bare model files give themselves.
    """
    from edgekit.bundle import load_bundle

    out: list[tuple[str, str | None]] = []
    for spec in specs:
        path, named = split_model_spec(spec)
        if named or not path.is_dir() or variants in ("", "default"):
            out.append((str(path), named))
            continue
        models = [m.name for m in load_bundle(path, allow_rejected=True).models]
        wanted = models if variants == "all" else [v.strip() for v in variants.split(",") if v.strip()]
        missing = [v for v in wanted if v not in models]
        if missing:
            raise UsageError(f"bundle {path} has no variant {', '.join(missing)}", f"choose from: {', '.join(models)}")
        out.extend((str(path), m) for m in wanted)
    if not out:
        raise UsageError("nothing to benchmark", "give at least one bundle or model file")
    return out


def _backends_for(path: str, variant: str | None, backends: list[str | None]) -> list[str | None]:
    """The requested backends that can run this model's format (``[None]``: the bundle's own)."""
    from edgekit.bundle import load_bundle
    from edgekit.runtime import BACKENDS

    if backends == [None]:
        return [None]
    p = Path(path)
    try:
        if p.is_dir():
            fmt = load_bundle(p, check_hashes=False, allow_rejected=True).model(variant).format
        else:
            fmt = p.suffix.lstrip(".")
    except EdgekitError:
        return [None]  # let open_model report what is wrong with it
    usable = [b for b in backends if b is None or fmt in BACKENDS[b].formats]
    return usable or [None]


def open_all(pairs: list[tuple[str, str | None]], config: Any) -> tuple[list[OpenModel], list[str]]:
    """Open every variant of a :class:`~edgekit.bench.runner.BenchConfig`'s run; with
    ``skip_unavailable``, variants this machine cannot run (no Edge TPU, no CUDA, a model compiled
    for other hardware, a bundle for an accelerator that would run without it) are left out with a reason.

    A runtime flag applies to the variants whose adapter takes it (``--delegate`` to the LiteRT
    ones of a TFLite-vs-ONNX comparison) and is listed as not applied to the others; a flag no
    variant takes is an error, never silently nothing."""
    options = dict(config.runtime_options)
    backends = options.pop("backend", None) or [None]
    backends = [backends] if isinstance(backends, str) else list(backends)
    if config.profile:
        options["profile"] = True
    opened: list[OpenModel] = []
    notes: list[str] = []
    untaken: dict[str, UnknownOptionError] = {}
    applied: set[str] = set()  # flags at least one opened variant took
    try:
        for path, variant in pairs:
            for backend in _backends_for(path, variant, backends):
                name = f"{Path(path).name}{':' + variant if variant else ''}{'@' + backend if backend else ''}"
                m, taken = _open_one(path, variant, backend, options, config, name, notes, untaken)
                if m is not None:
                    if backend and len(backends) > 1:
                        m.name = f"{m.name}@{backend}"
                    opened.append(m)
                    applied |= taken
        for m, label in zip(opened, distinct_labels([(m.path, m.name, m.variant) for m in opened],
                                                    getattr(config, "names", None))):
            m.name = label
    except BaseException:
        for m in opened:
            m.close()
        raise
    if not opened:  # the command was right, this machine has nothing that runs them: exit 1
        raise DeviceError("none of the models can run on this machine: " + "; ".join(notes),
                          "run the bench where their accelerator is, or leave out --skip-unavailable to "
                          "measure them on this host")
    taken_nowhere = [exc for key, exc in untaken.items() if key not in applied]
    if taken_nowhere:
        for m in opened:
            m.close()
        raise taken_nowhere[0]
    return opened, notes


def _open_one(path: str, variant: str | None, backend: str | None, options: dict[str, Any], config: Any,
              name: str, notes: list[str], untaken: dict[str, UnknownOptionError]) -> tuple[OpenModel | None, set]:
    """Open one variant, leaving out the flags its adapter does not take (recorded in ``notes``);
    returns it (None when skipped as unavailable) and the flags it took."""
    options = dict(options)
    while True:
        try:
            m = open_model(path, variant, config.labels, backend=backend, **options)
        except UnknownOptionError as exc:
            if exc.key not in options or exc.key == "profile":
                raise
            untaken.setdefault(exc.key, exc)
            options.pop(exc.key)
            notes.append(f"{exc.key} not applied to {name}: its runtime does not take it")
            continue
        except (BackendUnavailable, ModelError) as exc:
            if not config.skip_unavailable or not Path(path).exists():
                raise
            notes.append(f"skipped {name}: {exc.message}")
            return None, set()
        off = off_its_accelerator(m, backend, options) if config.skip_unavailable else None
        if off:
            m.close()
            notes.append(f"skipped {name}: {off}")
            return None, set()
        return m, set(options)


def off_its_accelerator(m: OpenModel, backend: str | None, options: dict[str, Any]) -> str | None:
    """Why a bundle built for an accelerator would run without it here, or None.

    An Edge TPU bundle built without edgetpu_compiler holds only its plain int8 model, which the
    bundle runs with XNNPACK: it opens fine on any machine, so nothing raised and
    ``--skip-unavailable`` benched it on the CPU. A runtime the caller chose (``--backend``,
    ``--delegate``) is kept: measuring the CPU was asked for."""
    from edgekit.bench.caveats import ACCELERATORS, ran_on_accelerator
    from edgekit.bench.report import short_runtime

    if backend is not None or "delegate" in options or m.target not in ACCELERATORS:
        return None
    info = m.runtime.describe()
    if ran_on_accelerator(info):
        return None
    return f"built for {m.target}, it would run on {short_runtime(info)} here, not on {ACCELERATORS[m.target]}"


def distinct_labels(models: Sequence[tuple[Path, str, str | None]], names: dict[str, str] | None = None) -> list[str]:
    """Labels for the rows, progress lines and plot groups of ``models`` (path, the name open_model
    gave it, variant), told apart: a ``--label NAME=PATH`` first (NAME replaces
    the bundle or file name, ``:VARIANT`` kept when PATH names no variant), then for names still
    shared the shortest trailing part of the path that differs (``dist/demo-cpu:int8``,
    ``other/demo-cpu:int8``), and ``#2``, ``#3`` for one model given twice.

    Raises UsageError for a ``--label`` PATH that names none of the models.
    """
    labels = [name for _, name, _ in models]
    for label, spec in (names or {}).items():
        path, variant = split_model_spec(spec)
        hits = [i for i, (p, _, v) in enumerate(models)
                if _same(p, path) and (variant is None or v == variant)]
        if not hits:
            raise UsageError(f"--label {label}={spec}: no model of this bench is {spec}",
                             "give PATH as the bundle (BUNDLE or BUNDLE:VARIANT) or model file is given")
        for i in hits:
            p, name, _ = models[i]
            labels[i] = label if variant else label + name[len(p.name):]
    for shared in sorted({name for name in labels if labels.count(name) > 1}):
        group = [i for i, name in enumerate(labels) if name == shared]
        parts = [models[i][0].resolve().parts if shared.startswith(models[i][0].name) else () for i in group]
        for k in range(2, max(len(p) for p in parts) + 1):
            tails = ["/".join(p[-k:]) for p in parts]
            if all(parts) and len(set(tails)) == len(tails):
                for i, tail in zip(group, tails):
                    labels[i] = tail + shared[len(models[i][0].name):]
                break
        else:  # one path given twice (or --label twice): numbered in order
            for n, i in enumerate(group[1:], 2):
                labels[i] = f"{shared}#{n}"
    return labels


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False
