"""Models with NMS in the graph: TFLite_Detection_PostProcess's four outputs.

The op (TF Object Detection API and MediaPipe TFLite exports) gives ``boxes`` ``[1, N, 4]``
as ``ymin, xmin, ymax, xmax`` normalised to [0, 1], ``classes`` ``[1, N]`` (class ids as
floats), ``scores`` ``[1, N]`` and ``count`` ``[1]`` (how many of the N rows are real). The
rows are already suppressed and sorted; only the score threshold and the count apply here.
"""

from __future__ import annotations

import numpy as np

from edgekit.detect.config import Candidates, DetectConfig
from edgekit.detect.scores import Quant, real
from edgekit.errors import ModelError


def _roles(shapes: list[tuple[int, ...]]) -> tuple[int, int, int, int] | None:
    """``(boxes, classes, scores, count)`` output indices from the shapes, or None.

    Boxes are the ``[1, N, 4]`` output, count the one-value output; classes and scores are
    the two ``[1, N]`` outputs in the op's order (classes first).
    """
    if len(shapes) != 4:
        return None
    boxes = [i for i, s in enumerate(shapes) if len(s) == 3 and s[0] == 1 and s[2] == 4]
    count = [i for i, s in enumerate(shapes) if int(np.prod(s)) == 1 and len(s) <= 2]
    rows = [i for i, s in enumerate(shapes) if len(s) == 2 and s[0] == 1 and i not in count]
    if len(boxes) != 1 or len(count) != 1 or len(rows) != 2:
        return None
    n = shapes[boxes[0]][1]
    if any(shapes[i][1] != n for i in rows):
        return None
    return boxes[0], rows[0], rows[1], count[0]


def fits(shapes: list[tuple[int, ...]], config: DetectConfig) -> bool:
    """Four outputs shaped like the op's: ``[1, N, 4]``, ``[1, N]``, ``[1, N]``, ``[1]``."""
    return _roles(shapes) is not None


def _classes_first(classes: np.ndarray, scores: np.ndarray) -> bool:
    """Whether the two ``[1, N]`` outputs are in the op's order (classes, scores).

    The converter may list the outputs in another order (the TF2 converter gives classes,
    count, boxes, scores); class ids are whole numbers, scores mostly not.
    """
    whole = [bool(np.all(v == np.round(v))) for v in (classes, scores)]
    return not (whole[1] and not whole[0])


def candidates(outputs: list[np.ndarray], config: DetectConfig, quant: list[Quant]) -> Candidates:
    """The first ``count`` rows above the score threshold, boxes in input pixels (xyxy)."""
    real_outputs = [real(np.asarray(o), quant[i] if i < len(quant) else None) for i, o in enumerate(outputs)]
    if config.outputs is not None:
        b, c, s, n = config.outputs
    else:
        found = _roles([o.shape for o in real_outputs])
        if found is None:
            raise ModelError("the outputs are not TFLite_Detection_PostProcess's four",
                             "choose another layout, or layout=auto")
        b, c, s, n = found
    count = int(np.clip(real_outputs[n].reshape(-1)[0], 0, real_outputs[s].shape[-1]))
    scores = real_outputs[s].reshape(-1)[:count]
    classes = real_outputs[c].reshape(-1)[:count]
    if config.outputs is None and not _classes_first(classes, scores):
        classes, scores = scores, classes
    keep = np.flatnonzero(scores > config.score_threshold)
    yx = real_outputs[b].reshape(-1, 4)[keep]
    w, h = config.input_size
    boxes = np.stack([yx[:, 1] * w, yx[:, 0] * h, yx[:, 3] * w, yx[:, 2] * h], axis=1)
    return Candidates(boxes.astype(np.float32), scores[keep], classes[keep].round().astype(np.int64), final=True)
