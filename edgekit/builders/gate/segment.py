"""The ``segment`` task in a build: the head's options checked before any model loads, and the gate
by mask IoU.

Cosine is the wrong ruler for a mask: selfie segmentation's int8 reached cosine 0.982 while one frame
in 40 kept 39 % of the person (issue 37). So each converted variant is compared with the original on
the images the gate judges (the eval set, else the held-back calibration images), both models'
outputs decoded by the bundle's own head (:class:`edgekit.heads.segment.SegmentDecoder`, the same
options, on the model's grid): per image the intersection over union of the two masks at the head's
threshold, averaged over the reported classes either mask holds (an image where both masks are empty
counts as IoU 1: nothing to miss); then the mean, the 5th percentile and the minimum over images.

Near-empty masks agree: a class whose masks BOTH cover under :data:`NEAR_EMPTY` of the grid (0.5 %,
``--mask-near-empty``) counts as IoU 1, as both empty does. Strictly, an empty original against a
converted speck scores 0, as if the variant had missed a whole object, and one such image in 40 moves
the mean by 0.025 (issue 37: MediaPipe's selfie segmenter on beach photos). Under 0.5 % both models say
"nothing there" at the scale a user reads the mask by (its area, its box: 184 pixels of selfie's
256 x 144 grid, a 14-pixel blob); a person, a hand, a road is more. An empty original against a larger
converted mask (or the reverse) is still judged strictly: one side is over the share (that beach photo's
int8 mask is 0.9 % at the head's ``>= 0.5``, 5 % before builders/int8/sigmoid_clamp.py: it scores 0;
its mirror image's 0.1 % is counted near-empty). The figure
stays honest: the images the rule decided are counted (``mask_iou.near_empty``) with the strict figures
beside (``mask_iou.strict``), in the build log and the table (``1 near-empty``); 0 turns the rule off.

Default limits (:class:`Limits`): mean >= 0.9, 5th percentile >= 0.7 (``--min-mask-iou``,
``--min-mask-iou-p5``); a figure equal to its limit passes. Each figure that misses is one line
naming its limit and where the masks part (``gate_failures``, flag -> line, as
builders/gate/landmarks.py's), which the build's reason quotes:
``int8 mask IoU 0.851 mean < 0.9 (--min-mask-iou); worst 0.388 on eval image people/x.jpg``. Cosine per
output is still reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgekit.builders.gate.verdict import Verdict
from edgekit.builders.request import head_config
from edgekit.errors import UsageError
from edgekit.heads.segment import SegmentDecoder, grid_of

MIN_MEAN_IOU = 0.9
"""Default least mean IoU over images."""
MIN_P5_IOU = 0.7
"""Default least 5th percentile of IoU over images (one frame in twenty may be this bad, no worse)."""
NEAR_EMPTY = 0.005
"""Default share of the grid under which a class's masks, both of them, agree whatever they hold (see above)."""
WORST_SHOWN = 3
"""Images named in a result's ``worst`` (the lowest IoU first)."""

FLAGS = {"mean": "--min-mask-iou", "p5": "--min-mask-iou-p5"}


@dataclass(frozen=True)
class Limits:
    """The gate's limits: the least mean IoU and the least 5th percentile over images, and the share of
    the grid under which two masks of a class both count as empty (:data:`NEAR_EMPTY`)."""

    mean: float = MIN_MEAN_IOU
    p5: float = MIN_P5_IOU
    near_empty: float = NEAR_EMPTY

    def to_dict(self) -> dict[str, Any]:
        """The manifest's ``mask_gate`` (also in each judged result, for recovery and the calibration check)."""
        return {"min_mean_iou": self.mean, "min_p5_iou": self.p5, "near_empty_share": self.near_empty}


def _where(iou: Mapping[str, Any], limit: float) -> str:
    """Where the masks part: how many images are under ``limit`` and the worst of them, by name when known."""
    worst = (iou.get("worst") or [{}])[0]
    name = worst.get("image")
    at = f" on {name}" if name else ""
    under = iou.get("under", {}).get(f"{limit:g}")
    count = f"{under} of {iou.get('images', '?')} images under {limit:g}, " if under is not None else ""
    return f"{count}worst {iou.get('min', 0):.3f}{at}"


def judge(res: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """``passed`` of one result (:meth:`Tally.result`'s figures) and, when a figure misses its limit,
    ``gate_failures``: flag -> one line. A figure equal to its limit passes (``>=``)."""
    iou = res.get("mask_iou") or {}
    lines = {}
    if iou.get("mean") is None:
        lines[FLAGS["mean"]] = "mask IoU not measured (no images)"
    else:
        for which, limit in (("mean", limits.mean), ("p5", limits.p5)):
            if iou[which] < limit:
                lines[FLAGS[which]] = (f"mask IoU {iou[which]:.3f} {which} < {limit:g} ({FLAGS[which]}); "
                                       + _where(iou, limit))
    return Verdict.judged(lines).fields()


def iou(a: np.ndarray, b: np.ndarray, near_empty: float = 0.0) -> float:
    """Mean over the classes (axis 0) either boolean mask holds of their IoU; 1.0 when both are empty. A
    class whose two masks both cover under ``near_empty`` of the grid counts as IoU 1 (module doc)."""
    a, b = np.asarray(a, bool).reshape(len(a), -1), np.asarray(b, bool).reshape(len(b), -1)
    union = (a | b).sum(axis=1)
    held = union > 0
    if not held.any():
        return 1.0
    per_class = (a & b).sum(axis=1)[held] / union[held]
    return float(np.mean(np.where(_both_near_empty(a, b, near_empty)[held], 1.0, per_class)))


def near_empty_classes(a: np.ndarray, b: np.ndarray, near_empty: float) -> int:
    """How many classes either mask holds that :func:`iou` counts as agreeing only by the near-empty rule."""
    a, b = np.asarray(a, bool).reshape(len(a), -1), np.asarray(b, bool).reshape(len(b), -1)
    return int((((a | b).sum(axis=1) > 0) & _both_near_empty(a, b, near_empty)).sum())


def _both_near_empty(a: np.ndarray, b: np.ndarray, share: float) -> np.ndarray:
    """Per class (rows of flat masks): both masks cover under ``share`` of the grid."""
    cells = max(a.shape[1], 1)
    return (a.sum(axis=1) < share * cells) & (b.sum(axis=1) < share * cells)


@dataclass
class Tally:
    """Per image: the IoU of the two models' masks and each one's mask area, a chunk at a time."""

    decoder: SegmentDecoder
    names: Sequence[str] | None = None  # the images' names (an eval folder's), for where the masks part
    limits: Limits = field(default_factory=Limits)  # how many images are under each is counted
    output: str | None = None  # the mask output's name: its cosine is the one the table shows
    ious: list[float] = field(default_factory=list)
    strict: list[float] = field(default_factory=list)  # the same without the near-empty rule
    areas: list[tuple[float, float]] = field(default_factory=list)  # (original, variant) share of the grid

    def add(self, reference: Sequence[np.ndarray], converted: Sequence[np.ndarray]) -> None:
        """One chunk: per output, the original's and the variant's (batch first, float)."""
        for i in range(len(reference[0])):
            ref = self.decoder.class_masks([r[i] for r in reference])[1]
            conv = self.decoder.class_masks([c[i] for c in converted])[1]
            if ref.shape != conv.shape:
                raise UsageError(f"segment: the converted mask grid {list(conv.shape)} is not the original's "
                                 f"{list(ref.shape)}", "use --task raw for this model")
            self.ious.append(iou(ref, conv, self.limits.near_empty))
            self.strict.append(iou(ref, conv) if near_empty_classes(ref, conv, self.limits.near_empty) else
                               self.ious[-1])
            self.areas.append((float(ref.mean()), float(conv.mean())))

    def result(self) -> dict[str, Any]:
        """``mask_iou``: mean, p5 and min over images, their count, how many are under each limit, and the
        worst images (index, name when known, IoU), how many images the near-empty rule judged
        (``near_empty``) and, when any, the figures without it (``strict``); ``mask_area``: the mean share of
        the grid either model's masks cover (a variant that shrinks or grows every mask shows there)."""
        values, strict = np.asarray(self.ious, np.float64), np.asarray(self.strict, np.float64)
        out: dict[str, Any] = {"mean": None, "p5": None, "min": None, "images": int(values.size)}
        if values.size:
            out.update(mean=round(float(values.mean()), 4), p5=round(float(np.percentile(values, 5)), 4),
                       min=round(float(values.min()), 4))
            out["under"] = {f"{x:g}": int((values < x).sum()) for x in sorted({self.limits.mean, self.limits.p5})}
            order = np.argsort(values, kind="stable")[:WORST_SHOWN]
            out["worst"] = [{"index": int(i), **({"image": str(self.names[i])} if self.names else {}),
                             "iou": round(float(values[i]), 4)} for i in order]
            out["near_empty"] = int((strict != values).sum())  # the images the rule decided, under this share:
            out["near_empty_share"] = self.limits.near_empty
            if out["near_empty"]:
                out["strict"] = {"mean": round(float(strict.mean()), 4),
                                 "p5": round(float(np.percentile(strict, 5)), 4)}
        areas = np.asarray(self.areas, np.float64).reshape(-1, 2)
        area = {"original": round(float(areas[:, 0].mean()), 4), "converted": round(float(areas[:, 1].mean()), 4)} \
            if len(areas) else None
        return {"mask_iou": out, "mask_area": area, **({"mask_output": self.output} if self.output else {})}


@dataclass(frozen=True)
class SegmentGate:
    """The build's segment head (its options checked against the model) and the gate's limits."""

    options: dict[str, Any]
    decoder: SegmentDecoder
    limits: Limits
    output_names: tuple[str, ...]

    @classmethod
    def for_model(cls, request: Any, source: Any) -> SegmentGate:
        """The gate for ``source`` (UsageError, one line, for an output it does not have or one that is no
        grid, or channels the grid lacks)."""
        decoder = head_config("segment", request.task_options)
        outputs = source.outputs
        names = ", ".join(f"{i}: {o.name} {list(o.shape)}" for i, o in enumerate(outputs))
        if decoder.output >= len(outputs):
            raise UsageError(f"segment output {decoder.output}: the model has {len(outputs)} outputs ({names})",
                             f"give -T output= one of 0-{len(outputs) - 1}")
        shape = [d if isinstance(d, int) else 1 for d in outputs[decoder.output].shape]
        try:
            grid = np.zeros([1, *shape], np.uint8)  # a shape-only grid: the head's own layout rule
            decoder.reported(decoder.probabilities([grid] * len(outputs)).shape[-1])
        except UsageError as exc:
            raise UsageError(f"{exc.message} (output {decoder.output}: {outputs[decoder.output].name} "
                             f"{list(outputs[decoder.output].shape)})", exc.hint) from None
        limits = Limits(request.min_mask_iou, request.min_mask_iou_p5, request.mask_near_empty)
        return cls(dict(request.task_options), decoder, limits, tuple(o.name for o in outputs))

    def tally(self, names: Sequence[str] | None = None) -> Tally:
        """A new :class:`Tally` for one variant on one data set (``names``: its images', when known)."""
        return Tally(self.decoder, names, self.limits, self.output_names[self.decoder.output])

    def judge(self, res: Mapping[str, Any]) -> dict[str, Any]:
        """:func:`judge` with this build's limits, and the limits themselves (``mask_gate``)."""
        return {**judge(res, self.limits), "mask_gate": self.limits.to_dict()}

    def check_reference(self, outputs: Sequence[np.ndarray]) -> None:
        """UsageError when the original's mask output on the first images cannot be what ``activation``
        says: values outside [0, 1] read as probabilities (a logit needs ``sigmoid`` or ``softmax``)."""
        values = np.asarray(outputs[self.decoder.output])
        low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
        if self.decoder.activation == "none" and (low < -0.01 or high > 1.01):
            several = grid_of(values[:1]).shape[-1] > 1
            raise UsageError(f"segment: the original's mask output spans [{low:.3g}, {high:.3g}], not probabilities "
                             "(activation none)",
                             f"give -T activation={'softmax' if several else 'sigmoid'} (it gives logits)")

    def task_options(self, outputs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A model entry's ``task_options``: the options as given, ``output`` pointing at the entry's own
        output of that name (a converter may reorder outputs)."""
        names = [o.get("name") for o in outputs]
        name = self.output_names[self.decoder.output]
        mapped = dict(self.options)
        if name in names and (names.index(name) != self.decoder.output or "output" in mapped):
            mapped["output"] = names.index(name)
        return mapped

    def summary(self, res: Mapping[str, Any]) -> dict[str, Any]:
        """What the manifest's ``verification`` says of the default model: the limits and its figures."""
        return {"mask_gate": self.limits.to_dict(), "mask_iou": res.get("mask_iou"), "mask_area": res.get("mask_area")}


def log_text(res: Mapping[str, Any]) -> str:
    """The mask figures of one verification for the build log line (empty without them)."""
    m = res.get("mask_iou")
    if not isinstance(m, dict) or m.get("mean") is None:
        return ""
    worst = m["worst"][0] if m.get("worst") else {}
    at = f" ({worst['image']})" if worst.get("image") and m["min"] < 1 else ""
    near = ""
    if m.get("near_empty"):
        strict = m.get("strict") or {}
        near = (f" ({m['near_empty']} with both masks near-empty, under {m.get('near_empty_share', NEAR_EMPTY):.2%} "
                "of the grid, counted as "
                f"agreeing; strictly {strict.get('mean', 0):.4f} mean, {strict.get('p5', 0):.4f} p5)")
    return (f"mask IoU vs the original {m['mean']:.4f} mean, {m['p5']:.4f} p5, {m['min']:.4f} min{at} on "
            f"{m['images']} images{near}; ")


def table_figure(res: Mapping[str, Any]) -> str:
    """The summary table's cell: ``IoU 0.95 mean, 0.88 p5`` ('-' when not measured), and how many images
    the near-empty rule judged when any (``, 2 near-empty``)."""
    m = res.get("mask_iou") or {}
    if m.get("mean") is None:
        return "-"
    near = f", {m['near_empty']} near-empty" if m.get("near_empty") else ""
    return f"IoU {m['mean']:.3f} mean, {m['p5']:.3f} p5{near}"


def judged_iou(verification: Mapping[str, Any]) -> tuple[float, float] | None:
    """(mean IoU, its limit) of the result the gate judged (eval, else held back), or None."""
    for dataset in ("eval", "holdout"):
        res = verification.get(dataset)
        m = (res or {}).get("mask_iou") if isinstance(res, dict) else None
        if isinstance(m, dict) and m.get("mean") is not None and "mask_gate" in res:
            return float(m["mean"]), float(res["mask_gate"]["min_mean_iou"])
    return None
