"""The ``landmarks`` task in a build: the head's options checked before any model loads, and the
gate in pixels.

A converted variant is compared with the original on the images the gate judges (the eval set,
else the held-back calibration images), both models' outputs decoded by the bundle's own head
(:class:`edgekit.heads.landmarks.LandmarkDecoder`, the same options): per image, the mean over
landmarks of the x, y distance between the two models' points in pixels of the model input
(fraction of the input x its size); then the mean, the 95th percentile and the max over images.
With a presence output, the share of images whose presence score lies on the same side of the
threshold as the original's (``presence_agreement``: a face the original sees and the variant
drops, or the reverse, is a disagreement) is gated too, and the pixel error is measured on the
images the original says present (on all of them when it says present on none, noted).

Default limits (:class:`Limits`): mean <= 1 % of the input's longer side, p95 <= 2.5 %, presence
agreement >= 0.97; ``--max-landmark-error``, ``--max-landmark-p95`` and
``--min-presence-agreement`` set them. Each figure that misses is one line naming its limit
(``gate_failures``, flag -> line, as builders/gate/fidelity.py's), which the build's reason quotes:
``int8 landmark error 3.10 px mean > 1.92 px (1 % of 192)``. Cosine per output is still reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgekit.builders.gate.verdict import Verdict
from edgekit.builders.request import head_config
from edgekit.errors import UsageError
from edgekit.heads.landmarks import LandmarkConfig, LandmarkDecoder

MEAN_SHARE = 0.01
"""Default limit of the mean error over images: this share of the input's longer side."""
P95_SHARE = 0.025
"""Default limit of the 95th percentile over images: this share of the input's longer side."""
MIN_PRESENCE_AGREEMENT = 0.97
"""Default least share of images on the same side of the presence threshold as the original."""
BROKEN_SHARE = 0.1
"""A mean error over this share of the input's longer side (ten times the default limit: points a
tenth of the image off) is a broken conversion, not rounding: recovery and the calibration check
leave it alone (builders/int8/recovery.py, builders/int8/stability.py)."""

FLAGS = {"mean": "--max-landmark-error", "p95": "--max-landmark-p95", "presence": "--min-presence-agreement"}


def _num(value: float) -> str:
    """A pixel figure for a line: two decimals, or two significant digits under 0.01."""
    return f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.1e}"


@dataclass(frozen=True)
class Limits:
    """The gate's limits: pixels of the model input (``side``: its longer side) and the presence share."""

    side: int
    mean_px: float
    p95_px: float
    min_presence_agreement: float = MIN_PRESENCE_AGREEMENT
    given: tuple[bool, bool] = (False, False)  # (mean, p95) set by a flag

    @classmethod
    def of(cls, side: int, max_mean: float | None = None, max_p95: float | None = None,
           min_presence: float = MIN_PRESENCE_AGREEMENT) -> Limits:
        """The limits for an input whose longer side is ``side`` px; None: the default share of it."""
        return cls(side, max_mean if max_mean is not None else round(MEAN_SHARE * side, 4),
                   max_p95 if max_p95 is not None else round(P95_SHARE * side, 4), min_presence,
                   (max_mean is not None, max_p95 is not None))

    def why(self, which: str) -> str:
        """Where a limit comes from: ``(1 % of 192)``, or the flag that set it."""
        given, share = (self.given[0], MEAN_SHARE) if which == "mean" else (self.given[1], P95_SHARE)
        return f"({FLAGS[which]})" if given else f"({share * 100:g} % of {self.side})"

    def to_dict(self) -> dict[str, Any]:
        """The manifest's ``landmark_gate`` (also in each judged result, for recovery and the calibration check)."""
        return {"max_mean_px": self.mean_px, "max_p95_px": self.p95_px,
                "min_presence_agreement": self.min_presence_agreement, "input_side_px": self.side}


def judge(res: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """``passed`` of one result (:meth:`Tally.result`'s figures) and, when a figure misses its limit,
    ``gate_failures``: flag -> one line. A figure equal to its limit passes (``<=``, ``>=``)."""
    px = res.get("landmark_error_px") or {}
    lines = {}
    if px.get("mean") is None:
        lines[FLAGS["mean"]] = "landmark error not measured (no images)"
    else:
        for which, limit in (("mean", limits.mean_px), ("p95", limits.p95_px)):
            if px[which] > limit:
                lines[FLAGS[which]] = f"landmark error {_num(px[which])} px {which} > {limit:g} px {limits.why(which)}"
    agreement = res.get("presence_agreement")
    if agreement is not None and agreement < limits.min_presence_agreement:
        p = res.get("presence") or {}
        lines[FLAGS["presence"]] = (
            f"presence on the original's side of {p.get('threshold', 0.5):g} on {agreement:.4f} of the "
            f"{p.get('images', '?')} images < {limits.min_presence_agreement:g} ({p.get('missed', '?')} of the "
            f"{p.get('original_present', '?')} the original says present dropped, {p.get('extra', '?')} added) "
            f"({FLAGS['presence']})")
    return Verdict.judged(lines).fields()


@dataclass
class Tally:
    """Per image: the pixel error between the two models' points and each one's presence, a chunk at a time."""

    decoder: LandmarkDecoder
    size: tuple[int, int]  # the model input's (width, height): fractions -> pixels
    errors: list[float] = field(default_factory=list)
    present: list[tuple[bool, bool]] = field(default_factory=list)  # (original, variant)

    def add(self, reference: Sequence[np.ndarray], converted: Sequence[np.ndarray]) -> None:
        """One chunk: per output, the original's and the variant's (batch first, float)."""
        scale = np.float64(self.size)
        for i in range(len(reference[0])):
            ref, conv = [r[i] for r in reference], [c[i] for c in converted]
            self.present.append((self._present(ref), self._present(conv)))
            a, b = (self.decoder.normalized(outs)[0][:, :2].astype(np.float64) * scale for outs in (ref, conv))
            self.errors.append(float(np.mean(np.hypot(*(a - b).T))) if len(a) else 0.0)

    def _present(self, outputs: Sequence[np.ndarray]) -> bool:
        score = self.decoder.presence(outputs)
        return score is None or score >= self.decoder.config.presence_threshold

    def result(self) -> dict[str, Any]:
        """``landmark_error_px`` (mean, p95, max over the images judged, their count) and, with a presence
        output, ``presence_agreement`` and ``presence`` (threshold, original present, dropped, added)."""
        errors = np.asarray(self.errors, np.float64)
        both = np.asarray(self.present, bool).reshape(-1, 2)
        original, variant = both[:, 0], both[:, 1]
        judged = errors[original] if original.any() else errors
        px: dict[str, Any] = {"mean": None, "p95": None, "max": None, "images": int(judged.size)}
        if judged.size:
            px.update(mean=round(float(judged.mean()), 4), p95=round(float(np.percentile(judged, 95)), 4),
                      max=round(float(judged.max()), 4))
        out: dict[str, Any] = {"landmark_error_px": px}
        if self.decoder.config.presence_output is None:
            return out
        if not original.any() and errors.size:
            px["on"] = "all images: the original says present on none"
        out["presence_agreement"] = round(float(np.mean(original == variant)), 4) if both.size else None
        out["presence"] = {"threshold": self.decoder.config.presence_threshold, "images": int(len(both)),
                           "original_present": int(original.sum()), "missed": int((original & ~variant).sum()),
                           "extra": int((~original & variant).sum())}
        return out


@dataclass(frozen=True)
class LandmarkGate:
    """The build's landmarks head (its options checked against the model) and the gate's limits."""

    options: dict[str, Any]
    config: LandmarkConfig
    spec: Any  # the float InputSpec: the model input's width and height
    limits: Limits
    output_names: tuple[str, ...]

    @classmethod
    def for_model(cls, request: Any, source: Any, spec: Any) -> LandmarkGate:
        """The gate for ``source`` (UsageError, one line, for an output index or count it does not have)."""
        config = head_config("landmarks", request.task_options)
        outputs = source.outputs
        names = ", ".join(f"{i}: {o.name} {list(o.shape)}" for i, o in enumerate(outputs))
        for what, index in (("landmarks.output", config.output), ("presence.output", config.presence_output)):
            if index is not None and index >= len(outputs):
                raise UsageError(f"landmarks {what} {index}: the model has {len(outputs)} outputs ({names})",
                                 f"give -T with {what} one of 0-{len(outputs) - 1}")
        size = outputs[config.output].size
        count = config.num_landmarks or (size // 3 if size and size % 3 == 0 else None)
        if size and count and size % count:
            raise UsageError(f"landmarks: output {config.output} ({outputs[config.output].name}) holds {size} values, "
                             f"not a multiple of num_landmarks {count}",
                             "set -T 'landmarks={\"num_landmarks\": N}' to the model's count")
        limits = Limits.of(max(spec.width, spec.height), request.max_landmark_error, request.max_landmark_p95,
                           request.min_presence_agreement)
        return cls(dict(request.task_options), config, spec, limits, tuple(o.name for o in outputs))

    def tally(self, names: Sequence[str] | None = None) -> Tally:
        """A new :class:`Tally` for one variant on one data set (``names``, the images', are not needed)."""
        return Tally(LandmarkDecoder(self.config, self.spec), (self.spec.width, self.spec.height))

    def judge(self, res: Mapping[str, Any]) -> dict[str, Any]:
        """:func:`judge` with this build's limits, and the limits themselves (``landmark_gate``)."""
        return {**judge(res, self.limits), "landmark_gate": self.limits.to_dict()}

    def summary(self, res: Mapping[str, Any]) -> dict[str, Any]:
        """What the manifest's ``verification`` says of the default model: the limits and its figures."""
        return {"landmark_gate": self.limits.to_dict(), "landmark_error_px": res.get("landmark_error_px"),
                "presence_agreement": res.get("presence_agreement")}

    def task_options(self, outputs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A model entry's ``task_options``: the options as given, each output index pointing at the
        entry's own output of that name (a converter may reorder outputs)."""
        names = [o.get("name") for o in outputs]
        mapped = dict(self.options)
        for table, index in (("landmarks", self.config.output), ("presence", self.config.presence_output)):
            if index is None:
                continue
            name = self.output_names[index]
            mapped[table] = {**(mapped.get(table) or {}), "output": names.index(name) if name in names else index}
        return mapped


def log_text(res: Mapping[str, Any]) -> str:
    """The landmark figures of one verification for the build log line (empty without them)."""
    px = res.get("landmark_error_px")
    if not isinstance(px, dict) or px.get("mean") is None:
        return ""
    text = (f"landmark error vs the original {_num(px['mean'])} px mean, {_num(px['p95'])} px p95, "
            f"{_num(px['max'])} px max on {px['images']} images" + (f" ({px['on']})" if px.get("on") else "") + "; ")
    p = res.get("presence")
    if res.get("presence_agreement") is not None and p:
        text += (f"presence agreement {res['presence_agreement']:.4f} ({p['original_present']}/{p['images']} present "
                 f"in the original, {p['missed']} dropped, {p['extra']} added); ")
    return text


def table_figure(res: Mapping[str, Any]) -> str:
    """The summary table's cell: ``0.50 px mean, 1.20 px p95`` ('-' when not measured)."""
    px = res.get("landmark_error_px") or {}
    if px.get("mean") is None:
        return "-"
    return f"{_num(px['mean'])} px mean, {_num(px['p95'])} px p95"


def judged_px(verification: Mapping[str, Any]) -> tuple[float, float, float] | None:
    """(mean px error, its limit, the error over which the conversion is broken: :data:`BROKEN_SHARE`)
    of the result the gate judged (eval, else held back), or None."""
    for dataset in ("eval", "holdout"):
        res = verification.get(dataset)
        px = (res or {}).get("landmark_error_px") if isinstance(res, dict) else None
        if isinstance(px, dict) and px.get("mean") is not None and "landmark_gate" in res:
            gate = res["landmark_gate"]
            return float(px["mean"]), float(gate["max_mean_px"]), BROKEN_SHARE * float(gate["input_side_px"])
    return None
