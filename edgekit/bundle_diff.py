"""Two bundles compared by their manifests: what ``edgekit diff A B`` prints.

Each bundle is read into flat facts (``target``, ``variants``, ``int8 sha256``, ``int8 gate
eval.ratio``, ``provenance calibration.sha256``...), and the facts that differ are listed with
both values. Compared: name, target, task, default variant, labels (their sha256), the runtime,
the variants and, per variant, its file's sha256, size, precision, input (preprocessing and
quantisation) and every gate figure of ``verification.models`` (per-class rows and per-output
details aside: the summary figures carry them); the gate's dataset and threshold; the open-set
fit; provenance (source model and its sha256, calibration set, library versions). When and where
it was built (``created``, ``host``, seconds, memory) is shown, never counted: two builds of one
model at different times are the same bundle.

Both bundles are loaded with their hashes checked, so a fact that matches is backed by the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.bundle import Bundle, load_bundle

SKIPPED_GATE_KEYS = frozenset({"per_class", "outputs", "energy_note"})
SHOWN_NOT_COMPARED = ("created", "host", "build_seconds", "total_seconds_so_far", "peak_rss_bytes_so_far")


@dataclass
class BundleDiff:
    """What differs between bundles ``a`` and ``b``: ``(fact, a's value, b's value)`` rows (None
    where one has no such fact), how many facts were compared, and each bundle's build context."""

    a: str
    b: str
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)
    compared: int = 0
    built: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        """True when no compared fact differs."""
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``identical``, ``compared``, ``differences`` [{fact, a, b}], ``built`` per bundle."""
        return {"a": self.a, "b": self.b, "identical": self.identical, "compared": self.compared,
                "differences": [{"fact": k, "a": va, "b": vb} for k, va, vb in self.differences],
                "built": self.built}


def diff_bundles(a: str | Path, b: str | Path) -> BundleDiff:
    """Compare the bundles at ``a`` and ``b`` (BundleError when either cannot be loaded or a file's
    sha256 does not match; a rejected bundle is compared too)."""
    left, right = (load_bundle(p, allow_rejected=True) for p in (a, b))
    fa, fb = facts(left), facts(right)
    keys = list(fa) + [k for k in fb if k not in fa]
    out = BundleDiff(str(a), str(b), compared=len(keys))
    va, vb = ({e.name for e in bundle.models} for bundle in (left, right))
    alone = va ^ vb  # a variant in one bundle only: one row, not one per figure it has
    for k in keys:
        variant = k.split(" ", 1)[0]
        if variant in alone and k != f"{variant} file":
            continue
        if fa.get(k) != fb.get(k):
            out.differences.append((k, fa.get(k), fb.get(k)))
    for label, bundle in ((str(a), left), (str(b), right)):
        provenance = bundle.manifest.get("provenance") or {}
        out.built[label] = {k: provenance.get(k) for k in SHOWN_NOT_COMPARED if k in provenance}
    return out


def facts(bundle: Bundle) -> dict[str, Any]:
    """The compared facts of one bundle, flat, in a stable order."""
    m = bundle.manifest
    files = m.get("files") or {}
    out: dict[str, Any] = {
        "name": m.get("name"), "target": m.get("target"), "task": bundle.task,
        "default variant": m.get("default_model"),
        "variants": ", ".join(e.name for e in bundle.models),
        "labels sha256": files.get(m["labels"]) if isinstance(m.get("labels"), str) else None,
        "runtime": _short(m.get("runtime")),
    }
    verification = m.get("verification") or {}
    for key in ("metric", "min_ratio", "gated", "passed"):
        out[f"gate {key}"] = verification.get(key)
    _flatten("gate dataset", verification.get("dataset"), out)
    gates = verification.get("models") or {}
    for entry in bundle.models:
        v = entry.name
        out[f"{v} file"] = entry.file
        out[f"{v} sha256"] = files.get(entry.file)
        out[f"{v} bytes"] = entry.extra.get("bytes")
        out[f"{v} precision"] = entry.precision
        _flatten(f"{v} input", entry.input.to_dict(), out)
        out[f"{v} task options"] = _short(entry.extra.get("task_options"))
        _flatten(f"{v} gate", gates.get(v), out)
    _flatten("open-set", m.get("openset"), out)
    provenance = {k: v for k, v in (m.get("provenance") or {}).items() if k not in SHOWN_NOT_COMPARED}
    _flatten("provenance", provenance, out)
    return out


def _flatten(prefix: str, value: Any, out: dict[str, Any], path: str = "") -> None:
    """Scalars of nested dicts as ``prefix a.b.c`` facts (lists kept whole, as text)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in SKIPPED_GATE_KEYS:
                _flatten(prefix, item, out, f"{path}.{key}" if path else str(key))
    elif value is not None:
        out[f"{prefix} {path}" if path else prefix] = _short(value) if isinstance(value, list) else value


def _short(value: Any) -> Any:
    """A list or dict as compact JSON text (compared and printed whole)."""
    import json

    return value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(
        value, sort_keys=True, separators=(",", ":"), default=str)


def format_diff(d: BundleDiff, width: int = 40) -> str:
    """The text form: a headline, one row per differing fact (sha256 shortened), the build contexts."""
    if d.identical:
        head = f"{d.a} and {d.b} are the same bundle ({d.compared} facts compared: files, variants, gate, provenance)"
    else:
        head = f"{d.a} and {d.b} differ in {len(d.differences)} of {d.compared} facts:"
    rows = [head]
    if d.differences:
        name_w = min(max(len(k) for k, _, _ in d.differences), 44)
        rows.append(f"  {'fact':<{name_w}}  {_cell(d.a, width):<{width}}  {_cell(d.b, width)}")
        rows += [f"  {k:<{name_w}}  {_cell(a, width):<{width}}  {_cell(b, width)}" for k, a, b in d.differences]
    for label, built in d.built.items():
        if built:  # when and where: shown so two builds can be placed, never a difference
            rows.append(f"  built {label}: {built.get('created', '?')} on {built.get('host', '?')} (not compared)")
    return "\n".join(rows) + "\n"


def _cell(value: Any, width: int) -> str:
    """One value in a column: a sha256 to 12 hex digits, ``-`` for none, long text cut."""
    text = "-" if value is None else str(value)
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text[:12]
    return text if len(text) <= width else text[: width - 3] + "..."
