"""Fake ``torch``: just what the imx500 job calls (tensors are numpy arrays in a wrapper)."""

from __future__ import annotations

import contextlib
import json
import sys
import types

import numpy as np


def record(*call) -> None:
    print("FAKE IMX CALL " + json.dumps(list(call)), file=sys.stderr, flush=True)


class Tensor:
    def __init__(self, array):
        self.array = np.asarray(array)

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.array


def from_numpy(array) -> Tensor:
    assert isinstance(array, np.ndarray) and array.flags.c_contiguous
    return Tensor(array)


def no_grad():
    return contextlib.nullcontext()


def _export(*args, dynamo=True, **kwargs):
    raise AssertionError("MCT's exporter calls torch.onnx.export itself")


onnx = types.SimpleNamespace(export=_export)
