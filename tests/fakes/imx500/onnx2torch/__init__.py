"""Fake ``onnx2torch``: ``convert`` gives a module that runs the ONNX in ONNX Runtime.

A batch (the gate's requests) is refused, as a module whose reshapes fix batch 1 would be, unless
``FAKE_MCT_BATCH`` is ``1`` (each row run alone: the answers one-at-a-time runs give) or ``skew``
(rows after the first moved by 0.05: a module whose batch changes its outputs). Every forward
call's batch size is logged (``FAKE IMX FORWARD n``).
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import onnxruntime as ort
import torch


class OnnxModule:
    def __init__(self, model):
        self.session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0]
        self.graph = types.SimpleNamespace(nodes=[])  # no module of the fake needs the job's tracing fixes

    def eval(self):
        return self

    def __call__(self, x):
        print(f"FAKE IMX FORWARD {x.array.shape[0]}", file=sys.stderr, flush=True)
        return self.forward(x)

    def forward(self, x):
        batch = os.environ.get("FAKE_MCT_BATCH", "")
        if batch and x.array.shape[0] > 1:
            rows = [self.forward(torch.Tensor(row[None])) for row in x.array]
            rows = [[r] if isinstance(r, torch.Tensor) else r for r in rows]
            outs = [np.concatenate([r[k].array for r in rows]) for k in range(len(rows[0]))]
            if batch == "skew":
                for o in outs:
                    o[1:] += 0.05
            return torch.Tensor(outs[0]) if len(outs) == 1 else [torch.Tensor(o) for o in outs]
        assert list(x.array.shape) == list(self.input.shape), (x.array.shape, self.input.shape)  # batch 1, NCHW
        outs = self.session.run(None, {self.input.name: x.array.astype(np.float32)})
        return torch.Tensor(outs[0]) if len(outs) == 1 else [torch.Tensor(o) for o in outs]


def convert(model):
    torch.record("onnx2torch.convert", [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
    return OnnxModule(model)
