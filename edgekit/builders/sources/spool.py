"""Fixed-shape rows (shaped images, reference outputs) kept in a temporary file, read back in chunks.

A build walks its calibration and evaluation images several times (int8 calibration, the
original model's reference outputs, every variant's verification). Holding them in memory
costs N x H x W x C bytes and more as float32; a :class:`Spool` costs one chunk. The file is
an unlinked :func:`tempfile.TemporaryFile` (in ``TMPDIR``), so nothing is left behind however
the build ends, SIGKILL included.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np


# Pixels (H x W, all images together) one chunk of float tensors may hold: 8 images of
# 224x224. A chunk's activations in the original model grow with it (benchmarks/build_scaling.py).
class Spool:
    """Rows of one shape and dtype appended to an unlinked temporary file; read back by position."""

    def __init__(self, shape: Sequence[int] | None = None, dtype: str | np.dtype = np.uint8):
        self.shape: tuple[int, ...] | None = None if shape is None else tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        # lives as long as the spool (close() or garbage collection deletes it)
        self._file = tempfile.TemporaryFile(prefix="edgekit-spool-")  # noqa: SIM115
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape or ())) * self.dtype.itemsize

    def append(self, row: np.ndarray) -> int:
        """Write one row (its shape fixes the spool's on the first call); returns its position."""
        row = np.ascontiguousarray(row, dtype=self.dtype)
        if self.shape is None:
            self.shape = tuple(row.shape)
        if tuple(row.shape) != self.shape:
            raise ValueError(f"row of shape {row.shape} in a spool of {self.shape}")
        os.pwrite(self._file.fileno(), row.tobytes(), self._rows * self.row_bytes)
        self._rows += 1
        return self._rows - 1

    def extend(self, rows: np.ndarray) -> None:
        """Append every row of a batch (first axis)."""
        for row in rows:
            self.append(row)

    def read(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The rows at ``positions``, as one array (a copy; the spool is unchanged)."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty((len(positions), *(self.shape or ())), dtype=self.dtype)
        size = self.row_bytes
        fd = self._file.fileno()
        if len(positions) > 1 and np.all(np.diff(positions) == 1) and positions[0] >= 0 and positions[-1] < self._rows:
            # a run of consecutive rows (the usual chunk): one read
            data = os.pread(fd, size * len(positions), int(positions[0]) * size)
            return np.frombuffer(data, dtype=self.dtype).reshape(out.shape).copy()
        for i, pos in enumerate(positions):
            if not 0 <= pos < self._rows:
                raise IndexError(f"row {pos} of a spool of {self._rows}")
            out[i] = np.frombuffer(os.pread(fd, size, int(pos) * size), dtype=self.dtype).reshape(self.shape or ())
        return out

    def chunks(self, size: int) -> Iterator[np.ndarray]:
        """Every row in order, ``size`` at a time."""
        for start in range(0, self._rows, size):
            yield self.read(range(start, min(start + size, self._rows)))

    def close(self) -> None:
        self._file.close()
