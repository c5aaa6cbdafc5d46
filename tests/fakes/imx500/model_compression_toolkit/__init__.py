"""Fake ``model_compression_toolkit``: PTQ gives a model whose outputs are the float ones on a 1/256 grid."""

from __future__ import annotations

import enum
import functools
import os
import types

import numpy as np
import torch


def get_target_platform_capabilities(fw_name, target_platform_name, target_platform_version=None):
    torch.record("get_target_platform_capabilities", fw_name, target_platform_name, target_platform_version)
    return {"tpc": target_platform_name}


class Quantised:
    def __init__(self, model):
        self.model = model

    def eval(self):
        return self

    def __call__(self, x):
        out = self.model(x)
        array = np.round(out.array * 256) / 256
        if os.environ.get("FAKE_MCT_SWAP") == "1":
            array = array[:, ::-1].copy()
        return torch.Tensor(array)


class QuantizationConfig:
    def __init__(self, **settings):
        unknown = set(settings) - {"relu_bound_to_power_of_2", "activation_error_method", "z_threshold"}
        if unknown:
            raise TypeError(f"QuantizationConfig.__init__() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        self.settings = settings


class CoreConfig:
    def __init__(self, quantization_config=None):
        self.quantization_config = quantization_config or QuantizationConfig()


QuantizationErrorMethod = enum.Enum("QuantizationErrorMethod", "MSE NOCLIPPING MAE")


def _ptq(in_module, representative_data_gen, core_config=None, target_platform_capabilities=None):
    batches = [b for b in representative_data_gen()]
    assert all(len(b) == 1 and b[0].array.shape[0] == 1 for b in batches)
    settings = {k: getattr(v, "name", v) for k, v in core_config.quantization_config.settings.items()}
    torch.record("pytorch_post_training_quantization", len(batches), target_platform_capabilities, settings)
    return Quantised(in_module), None


def _export(model, save_model_path, repr_dataset=None):
    export = torch.onnx.export
    assert isinstance(export, functools.partial) and export.keywords == {"dynamo": False}
    torch.record("pytorch_export_model", os.path.basename(save_model_path))
    with open(save_model_path, "wb") as f:
        f.write(b"fake quantised onnx")


core = types.SimpleNamespace(CoreConfig=CoreConfig, QuantizationConfig=QuantizationConfig,
                             QuantizationErrorMethod=QuantizationErrorMethod)
ptq = types.SimpleNamespace(pytorch_post_training_quantization=_ptq)
exporter = types.SimpleNamespace(pytorch_export_model=_export)
