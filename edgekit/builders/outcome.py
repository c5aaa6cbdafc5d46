"""How a build ends: the results when every target was written, else one error whose line says
what was written, rejected and failed, and whose fix fits the gate that judged it.

A target whose variants did not all pass the gate but some did is written with those (a
partial bundle, builders/publish.py); the build still exits 3 unless ``--allow-partial``.
"""

from __future__ import annotations

from edgekit.builders.contract import TargetBuild
from edgekit.builders.gate.figures import GATE_FLAG, RAISE_FLAG, RAISE_FLAGS
from edgekit.builders.gate.verdict import Verdict
from edgekit.builders.log import BuildLog
from edgekit.errors import EdgekitError, VerificationFailed


def finish(results: list[TargetBuild], failures: dict[str, EdgekitError], allow_partial: bool,
           log: BuildLog) -> list[TargetBuild]:
    """``results`` when every target was written whole (or, with ``allow_partial``, written with
    the variants that passed); else the error the build ends with: a failed conversion's first
    (exit 2), or VerificationFailed (exit 3). Either one's message ends with :func:`outcome`."""
    if failures:
        name, first = next(iter(failures.items()))
        if not first.message.startswith(f"{name}:"):
            first.message = f"{name}: {first.message}"
        first.message += f" {outcome(results, failures)}"
        first.results = results  # type: ignore[attr-defined]  # for the summary table (commands/build.py)
        raise first
    missed = [r for r in results if not r.passed]
    if not missed:
        return results
    if allow_partial and all(r.partial for r in missed):
        for r in missed:
            lost = ", ".join(r.rejected)
            log.warn(f"{r.target}: bundle {r.bundle} written without {lost} ({r.error}; {lost} kept in "
                     f"{r.bundle}.rejected); exit 0 as --allow-partial asks (3 without it)")
        return results
    raise VerificationFailed(
        "; ".join(f"{r.target}: {r.error}" for r in missed) + f" {outcome(results, {}, allow_partial)}",
        gate_fix(missed, allow_partial)).with_results(results)


def outcome(results: list[TargetBuild], failures: dict[str, EdgekitError], allow_partial: bool = False) -> str:
    """What the build left, target by target: ``(written: cpu without int8, rpi; rejected: edgetpu;
    failed: jetson)``, and when a bundle lacks a variant, the exit code unless ``--allow-partial``."""
    written = [r.target + (f" without {', '.join(r.rejected)}" if r.partial else "") for r in results if r.bundle]
    parts = [f"written: {', '.join(written) or 'none'}"]
    rejected = [r.target for r in results if r.bundle is None]
    if rejected:
        parts.append(f"rejected: {', '.join(rejected)}")
    if failures:
        parts.append(f"failed: {', '.join(failures)}")
    elif any(r.partial for r in results) and not allow_partial:
        parts.append("exit 3 unless --allow-partial")
    return f"({'; '.join(parts)})"


def failed_flags(result: TargetBuild) -> list[str]:
    """The flags governing the figures that failed in ``result``'s verifications (a detector's
    ``gate_failures``: builders/gate/fidelity.py), else its task's :data:`GATE_FLAG`."""
    ver = result.manifest.get("verification") or {}
    found = [*(ver.get("models") or {}).values(), *((v or {}).get("verification") or {}
                                                     for v in (ver.get("rejected") or {}).values())]
    flags = [flag for v in found if isinstance(v, dict) for res in v.values() if isinstance(res, dict)
             for flag in Verdict.of(res).failures]
    return flags or [GATE_FLAG.get(result.manifest.get("task") or "classify", "--min-accuracy-ratio")]


def gate_fix(missed: list[TargetBuild], allow_partial: bool = False) -> str:
    """The fix line of a gate failure: calibration only when an int8 model missed it (it alone is
    calibrated), the flag of the gate that judged it, where the evidence is, and --allow-partial."""
    variants = {v for r in missed for v in r.rejected}
    ways = []
    if any(v.startswith("int8") for v in variants):
        ways.append("calibrate int8 with more representative images (--calib)")
    flags = sorted({flag for r in missed if (r.manifest.get("verification") or {}).get("gated")
                    for flag in failed_flags(r)})
    lower = [f for f in flags if f not in RAISE_FLAGS]
    if lower:
        ways.append(f"lower {' or '.join(lower)}")
    if RAISE_FLAG in flags:
        ways.append(f"raise {RAISE_FLAG} (check the scores first)")
    raised = [f for f in flags if f in RAISE_FLAGS[1:]]
    if raised:
        ways.append(f"raise {' or '.join(raised)} (pixels of the model input)")
    if not flags or variants - {"int8", "int8_edgetpu"}:
        ways.append("build other --variants")
    rejected = [r.target for r in missed if r.bundle is None]
    partial = [r.target for r in missed if r.partial]
    text = (f"no bundle was written for {', '.join(rejected)}; " if rejected else "") + ", ".join(ways[:-1])
    text += (" or " if len(ways) > 1 else "") + ways[-1] + "; see the .rejected bundle's edgekit.json"
    if partial and not allow_partial:
        text += f"; or pass --allow-partial to accept {', '.join(partial)} without the variants that missed"
    return text
