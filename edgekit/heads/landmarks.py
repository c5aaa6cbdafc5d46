"""The ``landmarks`` task head: N points a model regresses in pixels of its own input.

Option names are MediaPipe's (``TensorsToLandmarksCalculatorOptions``, mediapipe v0.10.14
``mediapipe/calculators/tensor/tensors_to_landmarks_calculator.proto``), so a user copies them from a
model's graph file:

``landmarks``: ``num_landmarks`` (how many points; default: the output's size / 3),
``input_image_width`` / ``input_image_height`` (the pixel frame the model's x, y are in; default the
model input's own size), ``normalize_z`` (z is divided by ``input_image_width`` and then
by this, as MediaPipe's tensors_to_landmarks_calculator.cc does; default 1), ``output`` (which
model output holds the points; default 0),
``visibility_activation`` (``none`` or ``sigmoid``: for models with 4+ values per point, the 4th
is a visibility logit, e.g. pose landmarks).

``presence``: ``output`` (which model output holds the "is there one" score), ``activation``
(``none`` when the model gives a probability, ``sigmoid`` for a logit, as face_landmark's), and
``threshold`` (default 0.5): below it the landmarks are dropped and the result says so.

Run alone on a frame, the points come back in that frame's pixels through the inverse of the model's
own resize (crop, letterbox or stretch, :func:`edgekit.imaging.geometry.box_map`). Points are never
clipped to the frame: a landmark model may place a point outside the crop it saw (a chin below the
image edge), and a pipeline needs it where the model put it. In a cascade
(:mod:`edgekit.cascade`) the points come back through the region's rotation instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import UsageError
from edgekit.heads.options import check_head_options
from edgekit.heads.tensors import dequantize, output_quantization
from edgekit.util.optionspec import Option, OptionValueError, by_name, did_you_mean

OPTIONS = (
    Option("landmarks", "table", None, "MediaPipe TensorsToLandmarks options: num_landmarks, input_image_width, "
           "input_image_height, normalize_z, output, visibility_activation"),
    Option("presence", "table", None, "the presence score that gates the landmarks: output, activation "
           "(none|sigmoid), threshold"),
)
"""The ``landmarks`` head's options (its row in :data:`edgekit.heads.table.TASK_HEADS` lists these)."""

ACTIVATIONS = ("none", "sigmoid")

LANDMARK_OPTIONS = (
    Option("num_landmarks", "int", None, "points in the output", ge=1, le=100_000),
    Option("input_image_width", "int", None, "width of the pixel frame the x values are in", ge=1, le=16384),
    Option("input_image_height", "int", None, "height of the pixel frame the y values are in", ge=1, le=16384),
    Option("normalize_z", "float", 1.0, "z is divided by input_image_width, then by this",
           gt=0.0, le=1e6),
    Option("output", "int", 0, "the model output holding the points", ge=0, le=63),
    Option("visibility_activation", "str", "none", "the 4th value per point", choices=ACTIVATIONS),
)
"""``landmarks={...}``: MediaPipe's names, edgekit's ranges."""

PRESENCE_OPTIONS = (
    Option("output", "int", None, "the model output holding the presence score", ge=0, le=63),
    Option("activation", "str", "none", "none (a probability) or sigmoid (a logit)", choices=ACTIVATIONS),
    Option("threshold", "float", 0.5, "below it the landmarks are dropped", ge=0.0, le=1.0),
)
"""``presence={...}``."""

_DOCS = "see the landmarks head in docs/pipelines.md (MediaPipe TensorsToLandmarks names)"


def _table(name: str, spec: tuple[Option, ...], given: Any) -> dict[str, Any]:
    """One sub-option table checked against ``spec``, defaults filled in."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise UsageError(f"landmarks head: {name} must be a table of options, not {given!r}",
                         f"e.g. -T '{name}={{\"output\": 1}}'; {_DOCS}")
    declared = by_name(spec)
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise UsageError(f"landmarks head: {name} has no option {unknown[0]!r}", did_you_mean(unknown[0], declared))
    out = {o.name: o.default for o in spec}
    for key, value in given.items():
        try:
            out[key] = declared[key].coerce(value, text=False)
        except OptionValueError as exc:
            raise UsageError(f"landmarks head: {name}.{key} must be {exc.what}, not {value!r}", _DOCS) from None
    return out


@dataclass(frozen=True)
class LandmarkConfig:
    """The head's options checked: where the points are, how many, and what gates them."""

    num_landmarks: int | None
    input_width: int | None
    input_height: int | None
    normalize_z: float
    output: int
    visibility_sigmoid: bool
    presence_output: int | None
    presence_sigmoid: bool
    presence_threshold: float

    @classmethod
    def from_options(cls, landmarks: Any = None, presence: Any = None) -> LandmarkConfig:
        """Read the two option tables (UsageError, one line, for anything unknown or out of range)."""
        lm = _table("landmarks", LANDMARK_OPTIONS, landmarks)
        pr = _table("presence", PRESENCE_OPTIONS, presence)
        if presence is not None and pr["output"] is None:
            raise UsageError("landmarks head: presence needs its output index",
                             "e.g. -T 'presence={\"output\": 1, \"activation\": \"sigmoid\"}'")
        if pr["output"] is not None and pr["output"] == lm["output"]:
            raise UsageError(f"landmarks head: presence.output {pr['output']} is also the landmarks' output",
                             "give the index of the score output (a 1-value tensor)")
        return cls(lm["num_landmarks"], lm["input_image_width"], lm["input_image_height"], lm["normalize_z"],
                   lm["output"], lm["visibility_activation"] == "sigmoid", pr["output"],
                   pr["activation"] == "sigmoid", pr["threshold"])


@dataclass(frozen=True)
class Landmarks:
    """What the ``landmarks`` head returns for one image.

    ``points`` ``[N, 3]`` float32 x, y, z in pixels of ``size`` (``(width, height)``: the frame when the
    decoder was given its shape, else the model input); z is in the same pixels as x (MediaPipe's z
    scaled like x). ``visibility`` ``[N]`` when the model gives one. ``score`` is the presence score
    (None without a presence output); when ``present`` is False the points are empty.
    """

    points: np.ndarray
    score: float | None = None
    present: bool = True
    size: tuple[int, int] | None = None
    visibility: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.points.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``landmarks`` ``[[x, y, z], ...]``, ``landmark_score``, ``present``."""
        d: dict[str, Any] = {"landmarks": np.round(self.points.astype(np.float64), 2).tolist(),
                             "present": self.present, "count": len(self)}
        if self.score is not None:
            d["landmark_score"] = round(float(self.score), 6)
        if self.visibility is not None:
            d["visibility"] = np.round(self.visibility.astype(np.float64), 4).tolist()
        if self.size is not None:
            d["image_size"] = list(self.size)
        return d

    def __str__(self) -> str:
        score = f" (presence {self.score:.2f})" if self.score is not None else ""
        if not self.present:
            return f"no landmarks{score}"
        x0, y0 = (self.points[:, :2].min(axis=0) if len(self) else (0.0, 0.0))
        x1, y1 = (self.points[:, :2].max(axis=0) if len(self) else (0.0, 0.0))
        return f"{len(self)} landmarks{score} in [{x0:.0f}, {y0:.0f}, {x1:.0f}, {y1:.0f}]"


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-np.clip(x.astype(np.float64), -80, 80)))).astype(np.float32)


class LandmarkDecoder:
    """The ``landmarks`` decoder: ``decoder(outputs, frame_shape=None) -> Landmarks``.

    :meth:`normalized` gives the points as fractions of the model input (x, y in [0, 1] inside it,
    z scaled like x), which a cascade projects through its region.
    """

    maps_boxes = True  # the pipeline passes frame_shape

    def __init__(self, config: LandmarkConfig, spec: Any = None, quantization: Sequence[Any] = ()):
        self.config = config
        self.spec = spec
        self.quantization = list(quantization)
        self.stage_ns: dict[str, int] = {}

    def _real(self, outputs: Sequence[np.ndarray], index: int) -> np.ndarray:
        if index >= len(outputs):
            raise UsageError(f"landmarks: the model has {len(outputs)} outputs, no output {index}",
                             "set landmarks.output / presence.output to an index the model has")
        q = self.quantization[index] if index < len(self.quantization) else None
        scale, zero = q or (None, None)
        return dequantize(np.asarray(outputs[index]), scale, zero).reshape(-1)

    def presence(self, outputs: Sequence[np.ndarray]) -> float | None:
        """The presence score (after the activation), or None without a presence output."""
        c = self.config
        if c.presence_output is None:
            return None
        raw = self._real(outputs, c.presence_output)
        value = _sigmoid(raw[:1]) if c.presence_sigmoid else raw[:1]
        return float(value[0]) if value.size else 0.0

    def normalized(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
        """``[N, 3]`` points as fractions of the model input (z scaled like x), and visibility ``[N]`` or None."""
        c = self.config
        flat = self._real(outputs, c.output)
        n = c.num_landmarks or _guess_count(flat.size)
        if n <= 0 or flat.size % n:
            raise UsageError(f"landmarks: output {c.output} holds {flat.size} values, not a multiple of "
                             f"num_landmarks {n}", "set -T 'landmarks={\"num_landmarks\": N}' to the model's count")
        per = flat.size // n
        values = flat.reshape(n, per)
        width = c.input_width or (self.spec.width if self.spec is not None else 1)
        height = c.input_height or (self.spec.height if self.spec is not None else 1)
        points = np.zeros((n, 3), np.float32)
        points[:, 0] = values[:, 0] / width
        points[:, 1] = values[:, 1] / height if per > 1 else 0.0
        if per > 2:
            points[:, 2] = values[:, 2] / width / c.normalize_z  # MediaPipe divides: z / width / normalize_z
        visibility = None
        if per > 3:
            visibility = _sigmoid(values[:, 3]) if c.visibility_sigmoid else values[:, 3].astype(np.float32)
        return points, visibility

    def __call__(self, outputs: Sequence[np.ndarray], frame_shape: tuple[int, ...] | None = None) -> Landmarks:
        score = self.presence(outputs)
        present = score is None or score >= self.config.presence_threshold
        if not present:
            return Landmarks(np.zeros((0, 3), np.float32), score, False, self._size(frame_shape))
        points, visibility = self.normalized(outputs)
        return Landmarks(self._to_pixels(points, frame_shape), score, True, self._size(frame_shape), visibility)

    def _size(self, frame_shape: tuple[int, ...] | None) -> tuple[int, int] | None:
        if frame_shape is not None:
            return int(frame_shape[1]), int(frame_shape[0])
        return (self.spec.width, self.spec.height) if self.spec is not None else None

    def _to_pixels(self, points: np.ndarray, frame_shape: tuple[int, ...] | None) -> np.ndarray:
        """Fractions of the input -> input pixels, then through the model's own resize to the frame's."""
        if self.spec is None:
            return points
        w, h = self.spec.width, self.spec.height
        out = points * np.float32([w, h, w])
        if frame_shape is None:
            return out
        from edgekit.imaging.geometry import box_map

        mapping = box_map(self.spec, frame_shape)
        sx, sy = mapping.scale
        ox, oy = mapping.offset
        out[:, 0] = out[:, 0] * sx + ox
        out[:, 1] = out[:, 1] * sy + oy
        out[:, 2] = out[:, 2] * sx
        return out


def _guess_count(size: int) -> int:
    """Points in an output nobody described: x, y, z triples when they divide it, else pairs."""
    return size // 3 if size % 3 == 0 else size // 2 if size % 2 == 0 else size


def landmarks(labels: Sequence[str] = (), runtime: Any = None, landmarks: Any = None,
              presence: Any = None) -> LandmarkDecoder:
    """The ``landmarks`` head: a :class:`LandmarkDecoder` for ``runtime``'s outputs.

    ``labels`` are not used (landmarks have no classes). UsageError for a bad option table.
    """
    check_head_options("landmarks", OPTIONS, {"landmarks": landmarks, "presence": presence},
                       skip=("landmarks", "presence"))
    config = LandmarkConfig.from_options(landmarks, presence)
    spec = getattr(runtime, "input_spec", None)
    count = len(getattr(runtime, "output_quantization", None) or ())
    quant = [output_quantization(runtime, i) for i in range(count)] if runtime is not None else []
    return LandmarkDecoder(config, spec, quant)

