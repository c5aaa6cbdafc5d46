"""The ``segment`` task head: one or more probability masks, each as an area and a box in frame pixels.

A segmentation model gives a grid of per-pixel values, ``[1, H, W, C]`` (or ``[1, C, H, W]``, ``[1, H, W]``)
at its input's resolution or below. The conventions of MediaPipe's ``TensorsToSegmentationCalculator``
(mediapipe v0.10.14, ``mediapipe/calculators/tensor/tensors_to_segmentation_calculator.proto``) are the
options: ``activation`` ``none`` (the selfie models' one channel is already a probability),
``sigmoid`` (a logit per channel: pose landmark's mask) or ``softmax`` (over the C channels: the hair
model's two, the multiclass selfie model's six).

A pixel is in a class's mask when its probability is at least ``threshold`` (default 0.5); with
``softmax`` over several channels, when the class is the pixel's most probable one (MediaPipe's
category mask) and at least ``threshold`` likely, so for two channels the two rules agree.
``channels`` picks the classes reported (default all; the hair model's ``[1]``), ``class_names`` names
them (default the bundle's labels, else ``mask`` for one channel, ``class_N`` for several; not ``labels``,
which every head already takes from the bundle), ``output`` is the
model output holding the grid (default 0), ``masks`` puts each mask into the JSON (COCO's uncompressed
run-length encoding of the model's grid, column-major, with where the grid lies on the frame).

Per class the result gives the mask's share of the frame (``area``), its bounding box and the mean
probability inside it, in the frame's pixels through the inverse of the model's own resize
(:func:`edgekit.imaging.geometry.box_map`: crop, letterbox or stretch); a class with no pixel is left out
of the list, as a detector leaves out what it did not find. numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import UsageError
from edgekit.heads.options import check_head_options
from edgekit.heads.tensors import dequantize, output_quantization, softmax
from edgekit.util.optionspec import Option, defaults

ACTIVATIONS = ("none", "sigmoid", "softmax")

OPTIONS = (
    Option("output", "int", 0, "the model output holding the mask grid", ge=0, le=63),
    Option("activation", "str", "none", "none (probabilities), sigmoid (a logit per channel) or softmax "
           "(over the channels)", choices=ACTIVATIONS),
    Option("threshold", "float", 0.5, "a pixel is in a mask at this probability or more", ge=0.0, le=1.0),
    Option("channels", "ints", None, "the channels reported (default: all)", ge=0, le=4095),
    Option("class_names", "strs", None, "a name per channel (default: the bundle's labels, else mask / class_N)"),
    Option("masks", "bool", False, "each mask in the JSON (run-length, on the model's grid)"),
)
"""The ``segment`` head's options (its row in :data:`edgekit.heads.table.TASK_HEADS` lists these)."""
_DEFAULT = defaults(OPTIONS)


def grid_of(values: np.ndarray) -> np.ndarray:
    """A model output as ``[H, W, C]``: channels last (``[1, H, W, C]``, ``[H, W]``), or first when the
    first of the three is the smallest (``[1, C, H, W]``, a PyTorch export's)."""
    a = np.asarray(values)
    while a.ndim > 3 and a.shape[0] == 1:
        a = a[0]
    if a.ndim == 2:
        return a[:, :, None]
    if a.ndim != 3:
        raise UsageError(f"segment: a mask output is [1, H, W, C] or [1, C, H, W], not {list(np.shape(values))}",
                         "set -T output=N to the output holding the mask grid, or use --task raw")
    if a.shape[0] < min(a.shape[1], a.shape[2]):
        return np.moveaxis(a, 0, -1)  # channels first: the smallest axis leads
    return a


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-np.clip(x, -80, 80)))).astype(np.float32)


@dataclass(frozen=True)
class GridMap:
    """Where the model's grid lies on the frame: cell ``(i, j)`` covers frame pixels
    ``x = offset_x + [j, j + 1) * cell_x`` (likewise y), cut to ``bounds`` (the region the model saw)."""

    cell: tuple[float, float]
    offset: tuple[float, float]
    bounds: tuple[float, float, float, float]
    size: tuple[int, int]  # the frame's (width, height)

    def extent(self, n: int, axis: int) -> np.ndarray:
        """Each of ``n`` cells' length along ``axis`` (0: x, 1: y) in frame pixels, cut to the bounds."""
        edges = self.offset[axis] + np.arange(n + 1, dtype=np.float64) * self.cell[axis]
        edges = np.clip(edges, self.bounds[axis], self.bounds[axis + 2])
        return np.diff(edges)

    def box(self, rows: tuple[int, int], cols: tuple[int, int]) -> tuple[float, float, float, float]:
        """The frame box of the cells ``rows[0]..rows[1]`` x ``cols[0]..cols[1]`` (inclusive), cut to the bounds."""
        x1, x2 = (self.offset[0] + c * self.cell[0] for c in (cols[0], cols[1] + 1))
        y1, y2 = (self.offset[1] + r * self.cell[1] for r in (rows[0], rows[1] + 1))
        b = self.bounds
        return (float(np.clip(x1, b[0], b[2])), float(np.clip(y1, b[1], b[3])),
                float(np.clip(x2, b[0], b[2])), float(np.clip(y2, b[1], b[3])))


@dataclass(frozen=True)
class Segment:
    """One class's mask in a frame: its channel, label, share of the frame, box and mean probability."""

    index: int
    label: str
    area: float
    box: tuple[float, float, float, float]
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "label": self.label, "area": round(self.area, 6),
                "box": [round(v, 2) for v in self.box], "score": round(self.score, 6)}


def rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed run-length encoding of a boolean ``[H, W]`` mask (column-major runs, a
    run of zeros first), what ``pycocotools.mask.frPyObjects`` reads."""
    flat = np.asarray(mask, bool).ravel(order="F")
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    counts = np.diff(np.concatenate([[0], changes, [flat.size]])).tolist()
    if flat.size and flat[0]:
        counts = [0, *counts]
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}


@dataclass(frozen=True)
class Segmentation:
    """What the ``segment`` head returns for one frame.

    ``segments``: the classes with at least one pixel, in channel order. ``masks``: boolean ``[K, H, W]``
    on the model's grid for every reported channel (``indices``, ``labels``), empty ones included;
    ``grid`` says where that grid lies on the frame (:meth:`frame_mask` samples it there).
    ``include_masks``: :meth:`to_dict` adds each mask (the ``masks`` option).
    """

    segments: tuple[Segment, ...]
    masks: np.ndarray
    indices: tuple[int, ...]
    labels: tuple[str, ...]
    grid: GridMap
    include_masks: bool = False

    def __len__(self) -> int:
        return len(self.segments)

    def frame_mask(self, k: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Channel ``indices[k]``'s mask at a frame's resolution (``shape``: (H, W, ...); default the
        frame decoded), nearest grid cell per pixel, False outside the region the model saw."""
        w, h = self.grid.size
        fh, fw = (int(shape[0]), int(shape[1])) if shape is not None else (h, w)
        xs = (np.arange(fw) + 0.5) * (w / fw)  # frame pixel centres in the decoded frame's pixels
        ys = (np.arange(fh) + 0.5) * (h / fh)
        grid = self.masks[k]
        cols = np.floor((xs - self.grid.offset[0]) / self.grid.cell[0]).astype(np.int64)
        rows = np.floor((ys - self.grid.offset[1]) / self.grid.cell[1]).astype(np.int64)
        b = self.grid.bounds
        col_ok = (cols >= 0) & (cols < grid.shape[1]) & (xs >= b[0]) & (xs < b[2])
        row_ok = (rows >= 0) & (rows < grid.shape[0]) & (ys >= b[1]) & (ys < b[3])
        picked = grid[np.clip(rows, 0, grid.shape[0] - 1)][:, np.clip(cols, 0, grid.shape[1] - 1)]
        return picked & row_ok[:, None] & col_ok[None, :]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``segments`` (index, label, area, box, score), ``count``, ``image_size``; with the
        ``masks`` option each segment's ``mask`` (run-length) and the grid's frame box (``mask_box``)."""
        d: dict[str, Any] = {"segments": [s.to_dict() for s in self.segments], "count": len(self.segments),
                             "image_size": list(self.grid.size)}
        if self.include_masks:
            for entry, seg in zip(d["segments"], self.segments):
                entry["mask"] = rle(self.masks[self.indices.index(seg.index)])
            h, w = self.masks.shape[1:3]
            g = self.grid
            d["mask_box"] = [round(g.offset[0], 2), round(g.offset[1], 2), round(g.offset[0] + w * g.cell[0], 2),
                             round(g.offset[1] + h * g.cell[1], 2)]
        return d

    def __str__(self) -> str:
        if not self.segments:
            return "no mask"
        return "  ".join(f"{s.label} {s.area:.1%} [{', '.join(f'{v:.0f}' for v in s.box)}]" for s in self.segments)


class SegmentDecoder:
    """The ``segment`` decoder: ``decoder(outputs, frame_shape=None) -> Segmentation``.

    :meth:`class_masks` gives the boolean masks on the model's grid (what the build's gate compares).
    """

    maps_boxes = True  # the pipeline passes frame_shape

    def __init__(self, spec: Any = None, quantization: Sequence[Any] = (), labels: Sequence[str] = (), **options: Any):
        given = check_head_options("segment", OPTIONS, options)
        o = {**_DEFAULT, **{k: v for k, v in given.items() if v is not None}}  # None: the default
        self.spec = spec
        self.quantization = list(quantization)
        self.output, self.activation, self.threshold = int(o["output"]), str(o["activation"]), float(o["threshold"])
        self.channels = None if o["channels"] is None else tuple(int(c) for c in o["channels"])
        names = o["class_names"] if o["class_names"] is not None else labels
        self.names = [names] if isinstance(names, str) else list(names or ())
        self.include_masks = bool(o["masks"])

    def probabilities(self, outputs: Sequence[np.ndarray]) -> np.ndarray:
        """``[H, W, C]`` float32 probabilities of the mask output (dequantised, the activation applied)."""
        if self.output >= len(outputs):
            raise UsageError(f"segment: the model has {len(outputs)} outputs, no output {self.output}",
                             "set -T output=N to the output holding the mask grid")
        q = self.quantization[self.output] if self.output < len(self.quantization) else None
        grid = grid_of(dequantize(np.asarray(outputs[self.output]), *(q or (None, None))))
        if self.activation == "sigmoid":
            return _sigmoid(grid)
        if self.activation == "softmax":
            return softmax(grid, axis=-1, work=np.float32)
        return grid.astype(np.float32, copy=False)

    def reported(self, count: int) -> tuple[int, ...]:
        """The channels reported of ``count`` (UsageError for one the output lacks)."""
        if self.channels is None:
            return tuple(range(count))
        bad = [c for c in self.channels if c >= count]
        if bad:
            raise UsageError(f"segment: channel {bad[0]} asked for, the mask output has {count}",
                             f"give -T channels=[...] from 0 to {count - 1}")
        return self.channels

    def class_masks(self, outputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
        """(probabilities ``[K, H, W]``, boolean masks ``[K, H, W]``, channels) of the reported channels."""
        return self._masks(self.probabilities(outputs))

    def _masks(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
        channels = self.reported(probs.shape[-1])
        picked = np.moveaxis(probs[..., list(channels)], -1, 0)
        masks = picked >= np.float32(self.threshold)
        if self.activation == "softmax" and probs.shape[-1] > 1:  # the category mask: the most probable class
            best = probs.argmax(axis=-1)
            masks &= best[None] == np.asarray(channels)[:, None, None]
        return picked, masks, channels

    def label(self, channel: int, count: int) -> str:
        """The name of ``channel``: the labels given, else ``mask`` (one channel) or ``class_N``."""
        if channel < len(self.names):
            return str(self.names[channel])
        return "mask" if count == 1 else f"class_{channel}"

    def __call__(self, outputs: Sequence[np.ndarray], frame_shape: tuple[int, ...] | None = None) -> Segmentation:
        all_probs = self.probabilities(outputs)
        probs, masks, channels = self._masks(all_probs)
        count = all_probs.shape[-1]
        grid = self._grid(masks.shape[1:], frame_shape)
        widths, heights = grid.extent(masks.shape[2], 0), grid.extent(masks.shape[1], 1)
        frame_area = float(grid.size[0] * grid.size[1]) or 1.0
        segments = []
        for k, channel in enumerate(channels):
            rows, cols = np.flatnonzero(masks[k].any(axis=1)), np.flatnonzero(masks[k].any(axis=0))
            if not rows.size:
                continue
            area = float(heights @ masks[k].astype(np.float64) @ widths) / frame_area
            box = grid.box((int(rows[0]), int(rows[-1])), (int(cols[0]), int(cols[-1])))
            segments.append(Segment(channel, self.label(channel, count), area, box, float(probs[k][masks[k]].mean())))
        labels = tuple(self.label(c, count) for c in channels)
        return Segmentation(tuple(segments), masks, tuple(channels), labels, grid, self.include_masks)

    def _grid(self, shape: tuple[int, ...], frame_shape: tuple[int, ...] | None) -> GridMap:
        """Where a grid of ``shape`` (H, W) lies: on the frame through the model's resize, else on the
        model input (a decoder without the frame), else on itself (no input spec)."""
        h, w = int(shape[0]), int(shape[1])
        if self.spec is None:
            return GridMap((1.0, 1.0), (0.0, 0.0), (0.0, 0.0, float(w), float(h)), (w, h))
        cx, cy = self.spec.width / w, self.spec.height / h  # input pixels per cell: a grid may be coarser
        if frame_shape is None:
            return GridMap((cx, cy), (0.0, 0.0), (0.0, 0.0, float(self.spec.width), float(self.spec.height)),
                           (self.spec.width, self.spec.height))
        from edgekit.imaging.geometry import box_map

        m = box_map(self.spec, frame_shape)
        return GridMap((cx * m.scale[0], cy * m.scale[1]), m.offset, m.bounds, m.size)


def segment(labels: Sequence[str] = (), runtime: Any = None, **options: Any) -> SegmentDecoder:
    """The ``segment`` head: a :class:`SegmentDecoder` for ``runtime``'s outputs (``labels``: a name per
    channel; the ``class_names`` option wins). UsageError for an option it does not take or a bad value."""
    spec = getattr(runtime, "input_spec", None)
    count = len(getattr(runtime, "output_quantization", None) or ())
    quant = [output_quantization(runtime, i) for i in range(count)] if runtime is not None else []
    return SegmentDecoder(spec, quant, labels, **options)
