"""The cascade gate of ``edgekit bench DET --then SECOND --eval DIR`` (issue 35): every variant pair's
cascade against the original float cascade on the same images, and which stage loses.

    edgekit bench dist/bf-cpu --then dist/fl-cpu --roi '{"scale_x": 1.5, "scale_y": 1.5}' \\
        --variants all --eval photos/

Pairs: every variant of the detector x every variant of the second model (``--variants`` expands
both; ``SECOND:VARIANT`` or a bare file is just itself). The reference pair is the first of each
(normally fp32 x fp32). On each image a pair's detections are matched to the reference pair's
greedily by IoU >= 0.5; the figures are the detection agreement (matched / reference detections)
and, over the matched detections, for a landmarks head the mean distance of the points in widths
of the reference box (mean and p90 over detections) and the presence agreement, for a classifier
the sub-label agreement. The mixed pairs (a detector variant x the reference second model, the
reference detector x a second-model variant) isolate each stage's loss, so each full pair's
verdict says which stage loses. The gate fails (exit 3 on the command line) when a pair's p90
landmark error is over ``max_error`` box widths or an agreement is under ``min_agreement``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bench.runner import expand_variants
from edgekit.errors import CalibrationError, UsageError

MAX_ERROR = 0.05  # p90 landmark error, in widths of the reference box
MIN_AGREEMENT = 0.95  # detections, presence, sub-labels
MATCH_IOU = 0.5


@dataclass
class PairFigures:
    """One (detector variant, second variant) pair against the reference pair."""

    detector: str
    second: str
    images: int
    reference_detections: int
    matched: int
    extra: int  # detections the reference pair does not have
    detection_agreement: float
    landmark_mean: float | None = None  # box widths, mean over matched, present detections
    landmark_p90: float | None = None
    presence_agreement: float | None = None
    sub_label_agreement: float | None = None
    loss: float = 0.0  # the worst figure as a share of its limit (1.0: at the gate)
    passed: bool = True
    failures: list[str] = field(default_factory=list)
    verdict: str = ""

    @property
    def name(self) -> str:
        """``DET x SECOND``, e.g. ``int8 x int8``."""
        return f"{self.detector} x {self.second}"


@dataclass
class CascadeEval:
    """Every pair's figures, the reference pair and the gate's limits."""

    detector: str
    second: str
    second_task: str
    directory: str
    images: int
    reference: str
    max_error: float
    min_agreement: float
    pairs: list[PairFigures]

    @property
    def failed(self) -> list[PairFigures]:
        """The pairs that missed the gate."""
        return [p for p in self.pairs if not p.passed]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, each pair with its name."""
        d = asdict(self)
        d["pairs"] = [{"pair": p.name, **asdict(p)} for p in self.pairs]
        d["passed"] = not self.failed
        return d


def image_files(directory: str | Path) -> list[Path]:
    """The image files under ``directory`` (recursively, sorted). CalibrationError (exit 2) for a
    folder that is not there or holds no image."""
    from edgekit.imaging.image import IMAGE_SUFFIXES

    root = Path(directory)
    if not root.is_dir():
        raise CalibrationError(f"evaluation folder {root} does not exist", "give a folder of images")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise CalibrationError(f"{root} holds no images ({', '.join(IMAGE_SUFFIXES)})",
                               "give a folder of photos of what the detector finds")
    return files


def read_frames(files: Sequence[Path]) -> list[np.ndarray]:
    """Every file decoded (BGR); CalibrationError (exit 2) naming the first unreadable one: every
    pair must see the same images, so none is skipped."""
    from edgekit.imaging.image import ImageReadError, read_image

    frames = []
    for f in files:
        try:
            frames.append(read_image(f))
        except ImageReadError as exc:
            raise CalibrationError(f"unreadable image {f}: {exc}", "remove or replace it") from None
    return frames


def _short(model: Any) -> str:
    """A model's name in a pair: its variant, or a bare file's name."""
    return model.variant or model.name


def _detections(model: Any, frames: Sequence[np.ndarray]) -> list[Any]:
    """The detector's Detections for each frame, through the pipeline the device runs."""
    from edgekit.camera import Frame
    from edgekit.pipeline import Pipeline

    if model.task != "detect":
        raise UsageError(f"--then needs a detector first; {model.name} is a {model.task} model",
                         "give a detect bundle first: edgekit bench DETECTOR --then SECOND --eval DIR")
    pipeline = Pipeline(model.runtime, model.labels, warmup=0, task="detect", task_options=model.task_options)
    out = []
    for i, frame in enumerate(frames):
        result = pipeline.step(Frame(frame, time.perf_counter_ns(), i))
        if result is None:
            raise CalibrationError(f"image {i} of the evaluation folder cannot be used (an empty or broken frame)",
                                   "remove it")
        out.append(result.result)
    return out


def _boxes(dets: Sequence[Any]) -> np.ndarray:
    """``[N, 4]`` boxes (x1, y1, x2, y2)."""
    return np.array([d.box for d in dets], np.float64).reshape(-1, 4)


def match(reference: Sequence[Any], other: Sequence[Any], min_iou: float = MATCH_IOU) -> list[tuple[int, int]]:
    """Greedy matching by IoU: ``(reference index, other index)`` pairs, the highest IoU first,
    each detection used once, none under ``min_iou``."""
    if not reference or not other:
        return []
    a, b = _boxes(reference)[:, None], _boxes(other)[None]
    w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = w * h
    area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])  # noqa: E731
    iou = inter / np.maximum(area(a) + area(b) - inter, 1e-12)
    pairs, used_r, used_o = [], set(), set()
    for flat in np.argsort(-iou, axis=None, kind="stable"):
        r, o = np.unravel_index(flat, iou.shape)
        if iou[r, o] < min_iou:
            break
        if r not in used_r and o not in used_o:
            pairs.append((int(r), int(o)))
            used_r.add(r)
            used_o.add(o)
    return pairs


def landmark_error(reference: Any, other: Any) -> float:
    """Mean distance of ``other``'s points to ``reference``'s (x, y), in widths of the reference box."""
    a = np.asarray(reference.landmarks, np.float64)[:, :2]
    b = np.asarray(other.landmarks, np.float64)[:, :2]
    width = max(reference.box[2] - reference.box[0], 1e-9)
    return float(np.linalg.norm(a - b, axis=1).mean() / width)


def compare(reference: Sequence[Any], results: Sequence[Any], regions: int) -> dict[str, Any]:
    """The figures of one pair's per-image results against the reference pair's: only the best
    ``regions`` detections of each image (those the second stage saw) count."""
    n_ref = matched = extra = 0
    errors: list[float] = []
    presence: list[bool] = []
    labels: list[bool] = []
    for ref_image, image in zip(reference, results):
        ref, got = list(ref_image.detections[:regions]), list(image.detections[:regions])
        pairs = match(ref, got)
        n_ref, matched, extra = n_ref + len(ref), matched + len(pairs), extra + len(got) - len(pairs)
        for r, o in pairs:
            a, b = ref[r], got[o]
            if a.landmarks is not None or b.landmarks is not None:
                present = (bool(a.landmarks), bool(b.landmarks))
                presence.append(present[0] == present[1])
                if all(present):
                    errors.append(landmark_error(a, b))
            elif a.sub_label is not None or b.sub_label is not None or a.second is not None:
                labels.append((a.sub_label, a.second) == (b.sub_label, b.second))
    figures: dict[str, Any] = {"reference_detections": n_ref, "matched": matched, "extra": extra,
                               "detection_agreement": matched / n_ref if n_ref else 1.0}
    if errors:
        figures["landmark_mean"] = float(np.mean(errors))
        figures["landmark_p90"] = float(np.percentile(errors, 90))
    if presence:
        figures["presence_agreement"] = float(np.mean(presence))
    if labels:
        figures["sub_label_agreement"] = float(np.mean(labels))
    return figures


def judge(pair: PairFigures, max_error: float, min_agreement: float) -> None:
    """Set ``pair``'s ``loss`` (its worst figure as a share of that figure's limit), ``passed`` and
    ``failures`` (one phrase per figure over its limit)."""
    room = max(1.0 - min_agreement, 1e-9)
    shares = []
    for key, what in (("detection_agreement", "detections"), ("presence_agreement", "presence"),
                      ("sub_label_agreement", "sub-labels")):
        value = getattr(pair, key)
        if value is None:
            continue
        shares.append((1.0 - value) / room)
        if value < min_agreement:
            pair.failures.append(f"{what} agree {value:.1%} < {min_agreement:.0%}")
    if pair.landmark_p90 is not None:
        shares.append(pair.landmark_p90 / max(max_error, 1e-12))
        if pair.landmark_p90 > max_error:
            pair.failures.append(f"landmarks {pair.landmark_p90:.3f} box widths p90 > {max_error:g}")
    pair.loss = max(shares, default=0.0)
    pair.passed = not pair.failures


def _headline(pair: PairFigures) -> str:
    """The pair's main figure in words."""
    if pair.landmark_p90 is not None:
        text = f"landmarks {pair.landmark_p90:.3f} box widths p90"
    elif pair.sub_label_agreement is not None:
        text = f"sub-labels {pair.sub_label_agreement:.1%} agree"
    else:
        text = f"detections {pair.detection_agreement:.1%} agree"
    return text


def _figure(pair: PairFigures) -> str:
    """The main figure alone, as the verdict quotes a mixed pair's."""
    if pair.landmark_p90 is not None:
        return f"{pair.landmark_p90:.3f}"
    if pair.sub_label_agreement is not None:
        return f"{pair.sub_label_agreement:.1%} agree"
    return f"{pair.detection_agreement:.1%} detections"


def verdict(pair: PairFigures, alone_detector: PairFigures, alone_second: PairFigures, second_kind: str) -> str:
    """One line: the pair's main figure, each stage's alone, and which stage loses (the one whose
    mixed pair has the larger share of its limit)."""
    gate = "" if pair.passed else "; over the gate: " + ", ".join(pair.failures)
    head = f"{pair.name}: {_headline(pair)}"
    if pair is alone_detector and pair is alone_second:
        return f"{head} (the reference pair)"
    if pair is alone_detector or pair is alone_second:
        stage = "the detector" if pair is alone_detector else f"the {second_kind}"
        return f"{head} ({stage} alone{': no loss' if pair.loss <= 1e-9 else ''}){gate}"
    d, s = alone_detector.loss, alone_second.loss
    if max(d, s, pair.loss) <= 1e-9:
        who = "no stage loses"
    elif d > 1 and s > 1:
        who = "both stages lose"
    else:
        who = f"the {second_kind} loses" if s > d else "the detector loses"
    return (f"{head} (detector alone {_figure(alone_detector)}, {second_kind} alone {_figure(alone_second)}: "
            f"{who}){gate}")


def _second_kind(task: str) -> str:
    """What the verdict calls the second model."""
    return {"landmarks": "landmark model", "classify": "classifier"}.get(task, "second model")


def _open_all(specs: Sequence[tuple[str, str | None]], options: Mapping[str, Any]) -> list[Any]:
    """Every ``(path, variant)`` opened once with ``options`` (open_model's keywords, ``labels``
    among them); all closed again when one fails to open."""
    from edgekit.model import open_model

    opened: list[Any] = []
    try:
        for path, variant in specs:
            opened.append(open_model(path, variant, **dict(options)))
    except BaseException:
        for m in opened:
            m.close()
        raise
    return opened


def evaluate_cascade(detector: str, second: str, directory: str | Path, variants: str = "default",
                     roi: Any = None, detector_options: Mapping[str, Any] | None = None,
                     second_options: Mapping[str, Any] | None = None, labels: Any = None,
                     max_error: float = MAX_ERROR, min_agreement: float = MIN_AGREEMENT) -> CascadeEval:
    """Run every (detector variant, second variant) cascade on the images of ``directory`` and judge
    it against the first x first (the reference pair). Each model is opened once; each detector
    variant detects once per image, every second variant then works on those detections."""
    from edgekit.cascade import second_stage

    files = image_files(directory)
    frames = read_frames(files)
    dets = _open_all(expand_variants([detector], variants), {**(detector_options or {}), "labels": labels})
    try:
        seconds = _open_all(expand_variants([second], variants), second_options or {})
    except BaseException:
        for m in dets:
            m.close()
        raise
    try:
        found = [_detections(m, frames) for m in dets]
        stages = [second_stage(m, roi) for m in seconds]
        results = [[[stage(f, r) for f, r in zip(frames, found_d)] for stage in stages] for found_d in found]
        names = ([_short(m) for m in dets], [_short(m) for m in seconds])
        det_name, second_name, task = dets[0].name, seconds[0].name, seconds[0].task
    finally:
        for m in dets + seconds:
            m.close()
    regions = stages[0].roi.max_regions
    if not any(len(r.detections) for r in results[0][0]):
        raise CalibrationError(f"the reference pair found nothing in the {len(frames)} image(s) of {directory}",
                               "give photos of what the detector finds (a gate on no detection would pass anything)")
    grid = [[PairFigures(names[0][i], names[1][j], len(frames), **compare(results[0][0], results[i][j], regions))
             for j in range(len(seconds))] for i in range(len(dets))]
    kind = _second_kind(task)
    for pair in (p for row in grid for p in row):
        judge(pair, max_error, min_agreement)
    for i, row in enumerate(grid):
        for j, pair in enumerate(row):
            pair.verdict = verdict(pair, grid[i][0], grid[0][j], kind)
    pairs = [p for row in grid for p in row]
    return CascadeEval(det_name, second_name, task, str(directory), len(frames), pairs[0].name,
                       max_error, min_agreement, pairs)


def format_cascade(result: CascadeEval) -> str:
    """The table, one row per pair, each pair's verdict and the gate's limits."""
    def cell(value: float | None, fmt: str) -> str:
        """A figure, or n/a where the head has none."""
        return "n/a" if value is None else format(value, fmt)

    head = (f"{'pair':<26}{'dets':>8}{'matched':>9}{'lm mean':>9}{'lm p90':>9}{'present':>9}{'sub-lab':>9}"
            f"{'gate':>6}")
    lines = [f"cascade: {result.detector} x {result.second} ({result.second_task}) on {result.images} image(s) "
             f"of {result.directory}; reference pair: {result.reference} (the first variant of each)",
             head, "-" * len(head)]
    for p in result.pairs:
        lines.append(f"{p.name[:25]:<26}{p.detection_agreement:>8.1%}{f'{p.matched}/{p.reference_detections}':>9}"
                     f"{cell(p.landmark_mean, '.4f'):>9}{cell(p.landmark_p90, '.4f'):>9}"
                     f"{cell(p.presence_agreement, '.1%'):>9}{cell(p.sub_label_agreement, '.1%'):>9}"
                     f"{'ok' if p.passed else 'FAIL':>6}")
    lines += [f"  {p.verdict}" for p in result.pairs]
    lines.append(f"dets = reference detections matched (IoU >= {MATCH_IOU}); lm = landmark distance in reference "
                 f"box widths; gate: lm p90 <= {result.max_error:g} (--max-cascade-error), each agreement >= "
                 f"{result.min_agreement:.0%} (--min-cascade-agreement)")
    return "\n".join(lines)
