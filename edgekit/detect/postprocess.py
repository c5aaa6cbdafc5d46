"""Models with NMS in the graph: TFLite_Detection_PostProcess's four outputs.

The op (TF Object Detection API and MediaPipe TFLite exports) gives ``boxes`` ``[1, N, 4]``
as ``ymin, xmin, ymax, xmax`` normalised to [0, 1], ``classes`` ``[1, N]`` (class ids as
floats), ``scores`` ``[1, N]`` and ``count`` ``[1]`` (how many of the N rows are real). The
rows are already suppressed and sorted; only the score threshold and the count apply here.
"""

from __future__ import annotations

import numpy as np

from edgekit.detect.head import Candidates, DetectConfig


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


def fits(shapes: list[tuple[int, ...]], num_classes: int | None) -> bool:
    """Four outputs shaped like the op's: ``[1, N, 4]``, ``[1, N]``, ``[1, N]``, ``[1]``."""
    return _roles(shapes) is not None


def candidates(outputs: list[np.ndarray], config: DetectConfig) -> Candidates:
    """The first ``count`` rows above the score threshold, boxes in input pixels (xyxy)."""
    if config.outputs is not None:
        b, c, s, n = config.outputs
    else:
        roles = _roles([np.asarray(o).shape for o in outputs])
        if roles is None:
            raise ValueError("the outputs are not TFLite_Detection_PostProcess's four")
        b, c, s, n = roles
    count = int(np.clip(np.asarray(outputs[n]).reshape(-1)[0], 0, np.asarray(outputs[s]).shape[-1]))
    scores = np.asarray(outputs[s], np.float32).reshape(-1)[:count]
    keep = np.flatnonzero(scores > config.score_threshold)
    yx = np.asarray(outputs[b], np.float32).reshape(-1, 4)[keep]
    w, h = config.input_size
    boxes = np.stack([yx[:, 1] * w, yx[:, 0] * h, yx[:, 3] * w, yx[:, 2] * h], axis=1)
    classes = np.asarray(outputs[c]).reshape(-1)[keep].round().astype(np.int64)
    return Candidates(boxes.astype(np.float32), scores[keep], classes, final=True)
