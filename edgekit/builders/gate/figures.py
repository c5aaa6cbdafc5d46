"""The figures a variant's gate judged and the ones it failed on, by name, for recovery's table.

Every gate records its failures as ``gate_failures`` (flag -> one line: builders/gate/fidelity.py,
builders/gate/verify.py ``classify_gate``, builders/gate/landmarks.py), a gate of one figure only its
``passed``. Recovery's rows (builders/int8/recovery.py) show, beside the figure it compares attempts by,
each figure an attempt failed on with its value and limit: a classifier's table said ``ratio 1.0,
missed`` of a model that missed on top-1 agreement 0.94 < 0.97, which it never named. :data:`FIGURES`
reads each flag's figure from a result; a flag it does not know is shown by its line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgekit.builders.gate.verdict import Verdict, judged_result

#: the flag that sets each task's gate
GATE_FLAG = {"classify": "--min-accuracy-ratio", "detect": "--min-map-ratio", "raw": "--min-cosine",
             "landmarks": "--max-landmark-error", "segment": "--min-mask-iou"}
#: the gate flag that is raised, not lowered, to let more through (builders/gate/fidelity.py)
RAISE_FLAG = "--max-map-gain"
#: every flag raised to let more through: the map gain, a landmark model's pixel limits (builders/gate/landmarks.py)
RAISE_FLAGS = (RAISE_FLAG, "--max-landmark-error", "--max-landmark-p95")


def _path(*keys: str) -> Callable[[Mapping[str, Any]], Any]:
    """A reader of ``res[k1][k2]...`` (None where a key is missing)."""

    def read(res: Mapping[str, Any]) -> Any:
        value: Any = res
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        return value

    return read


def _request(name: str, plus: float = 0.0) -> Callable[[Mapping[str, Any], Any], Any]:
    """A reader of the request's threshold ``name`` (None without a request)."""
    return lambda res, request: (getattr(request, name) + plus) if getattr(request, name, None) is not None else None


def _levels(res: Mapping[str, Any], request: Any) -> Any:
    """The score-level limit: ``--min-score-levels``, or the original's count when lower (detect_fidelity.py)."""
    want, original = getattr(request, "min_score_levels", None), _path("fidelity", "score_levels", "original")(res)
    return min(want, original) if want is not None and original is not None else want


@dataclass(frozen=True)
class Kind:
    """One gated figure: its name in the table, where a result holds it, its limit, which way is better."""

    name: str
    value: Callable[[Mapping[str, Any]], Any]
    limit: Callable[[Mapping[str, Any], Any], Any]
    higher: bool = True


FIGURES: dict[str, Kind] = {
    "--min-accuracy-ratio": Kind("top-1 ratio", _path("ratio"), _request("min_accuracy_ratio")),
    "--min-top1-agreement": Kind("top-1 agreement", _path("agreement"), _request("min_top1_agreement")),
    "--min-map-ratio": Kind("mAP ratio", _path("ratio"), _request("min_map_ratio")),
    "--max-map-gain": Kind("mAP gain", _path("ratio"), _request("max_map_gain", 1.0), higher=False),
    "--min-detect-agreement": Kind("detection agreement", _path("fidelity", "detections", "agreement"),
                                   _request("min_detect_agreement")),
    "--min-score-levels": Kind("score levels", _path("fidelity", "score_levels", "converted"), _levels),
    "--min-score-cosine": Kind("score cosine", _path("fidelity", "score_cosine", "cosine"),
                               _request("min_score_cosine")),
    "--max-landmark-error": Kind("px mean", _path("landmark_error_px", "mean"),
                                 lambda res, request: _path("landmark_gate", "max_mean_px")(res), higher=False),
    "--max-landmark-p95": Kind("px p95", _path("landmark_error_px", "p95"),
                               lambda res, request: _path("landmark_gate", "max_p95_px")(res), higher=False),
    "--min-presence-agreement": Kind("presence agreement", _path("presence_agreement"),
                                     lambda res, request: _path("landmark_gate", "min_presence_agreement")(res)),
    "--min-mask-iou": Kind("IoU mean", _path("mask_iou", "mean"),
                           lambda res, request: _path("mask_gate", "min_mean_iou")(res)),
    "--min-mask-iou-p5": Kind("IoU p5", _path("mask_iou", "p5"),
                              lambda res, request: _path("mask_gate", "min_p5_iou")(res)),
    "--min-cosine": Kind("worst cosine", _path("cosine"), _request("min_cosine")),
}
"""Flag -> the figure it gates."""
TASK_FLAGS = {"classify": ("--min-accuracy-ratio", "--min-top1-agreement"),
              "detect": ("--min-map-ratio", "--min-detect-agreement", "--min-score-levels", "--min-score-cosine"),
              "landmarks": ("--max-landmark-error", "--max-landmark-p95", "--min-presence-agreement"),
              "segment": ("--min-mask-iou", "--min-mask-iou-p5"), "raw": ("--min-cosine",)}
"""The figures each task's gate holds a result to (``--max-map-gain`` reads the mAP ratio again)."""


@dataclass(frozen=True)
class Figure:
    """One figure of one result: name, value, limit (None: unknown), flag, which way is better."""

    name: str
    value: float | None
    limit: float | None
    flag: str
    higher: bool = True
    line: str | None = None  # the gate's own line, for a flag :data:`FIGURES` does not know

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Figure:
        """The figure of a recovery row's ``missed`` entry (:meth:`to_dict`)."""
        return cls(d["figure"], d.get("value"), d.get("limit"), d.get("flag", ""), d.get("higher", True), d.get("line"))

    def value_text(self) -> str:
        """``0.94 < 0.97``: the value and, when known, the limit it missed (``missed`` unmeasured)."""
        if self.value is None:
            return "missed"
        if self.limit is None:
            return _num(self.value)
        return f"{_num(self.value)} {'<' if self.higher else '>'} {_num(self.limit)}"

    def text(self) -> str:
        """``top-1 agreement 0.94 < 0.97``; a figure not measured, the gate's own line."""
        if self.value is None:
            return self.line or f"{self.name} (not measured)"
        return f"{self.name} {self.value_text()}"

    def to_dict(self) -> dict[str, Any]:
        return {"figure": self.name, "value": self.value, "limit": self.limit, "flag": self.flag,
                "higher": self.higher, **({"line": self.line} if self.value is None and self.line else {})}


def _num(x: float) -> str:
    """A figure as the gate lines write it: six significant digits (a cosine of 0.999853 is not 1)."""
    return f"{x:.6g}" if isinstance(x, (int, float)) else str(x)


def missed(verification: Mapping[str, Any], task: str, request: Any = None) -> list[Figure]:
    """Each figure the gate failed ``verification`` on, in the gate's order (empty: it passed)."""
    res = judged_result(verification)
    verdict = Verdict.of(res)
    if not verdict.failed:
        return []
    flag = GATE_FLAG.get(task)  # a gate of one figure words no line of its own
    lines = verdict.failures or ({flag: None} if flag else {})
    return [figure(flag, res, request, line) for flag, line in lines.items()]


def figure(flag: str, res: Mapping[str, Any], request: Any = None, line: str | None = None) -> Figure:
    """The figure ``flag`` gates, read from ``res`` (its limit from ``request``, else ``res``)."""
    kind = FIGURES.get(flag)
    if kind is None:
        return Figure(flag.lstrip("-").replace("-", " "), None, None, flag, line=line)
    value = kind.value(res)
    return Figure(kind.name, float(value) if value is not None else None, _float(kind.limit(res, request)), flag,
                  kind.higher, line)


def _float(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def figures(verification: Mapping[str, Any], task: str) -> dict[str, float]:
    """Name -> value of each figure ``task``'s gate holds the judged result to (those it has)."""
    res = judged_result(verification)
    if res is None:
        return {}
    found = {FIGURES[flag].name: _float(FIGURES[flag].value(res)) for flag in TASK_FLAGS.get(task, ())}
    return {name: value for name, value in found.items() if value is not None}


def judged(verification: Mapping[str, Any], task: str | None) -> tuple[str, float] | None:
    """``(name, value)`` of the one figure attempts are compared by: a landmark model's mean pixel
    error (lower is better: ``px mean``), a segmenter's mean mask IoU (``IoU mean``), else the eval
    ratio (top-1 or mAP), a detector held to its original's detections on the held-back images (no
    eval set) its agreement at the bundle's threshold, else the worst output's cosine; None when
    there is none."""
    mean = _path("landmark_error_px", "mean")
    for dataset in ("eval", "holdout"):
        res = verification.get(dataset)
        if not isinstance(res, Mapping):
            continue
        if "landmark_gate" in res and mean(res) is not None:
            return "px mean", float(mean(res))
        if "mask_gate" in res and _path("mask_iou", "mean")(res) is not None:
            return "IoU mean", float(res["mask_iou"]["mean"])
        if res.get("ratio") is not None:
            return {"classify": "top-1 ratio", "detect": "mAP ratio"}.get(task or "", "ratio"), float(res["ratio"])
        agreement = _path("fidelity", "detections", "agreement")(res)
        if Verdict.of(res).passed is not None and agreement is not None:
            return "detection agreement", float(agreement)
        if res.get("cosine") is not None:
            return "worst cosine", float(res["cosine"])
    return None
