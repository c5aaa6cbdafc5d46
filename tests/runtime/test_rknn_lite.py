"""The rknn-lite adapter against a fake ``rknnlite`` that checks the calls the real RKNNLite takes."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from edgekit.errors import BackendUnavailable, DeviceError, ModelError
from edgekit.imaging.image import InputSpec
from edgekit.runtime import BACKENDS, check_options
from edgekit.runtime.rknn_lite import CORE_MASKS, RknnLiteRuntime

NCHW = InputSpec(shape=(1, 1, 32, 32), layout="NCHW", colour="gray")


class FakeRKNNLite:
    """Just enough of ``rknnlite.api.RKNNLite``: records every call, checks what it is given."""

    NPU_CORE_AUTO, NPU_CORE_0, NPU_CORE_1, NPU_CORE_2 = 0, 1, 2, 4
    NPU_CORE_0_1, NPU_CORE_0_1_2, NPU_CORE_ALL = 3, 7, 0xFFFF
    instances: list[FakeRKNNLite] = []
    load_ret = 0
    init_ret = 0

    def __init__(self, verbose=False):
        self.calls: list[tuple] = []
        self.released = False
        FakeRKNNLite.instances.append(self)

    def load_rknn(self, path):
        assert isinstance(path, str) and path.endswith(".rknn")
        self.calls.append(("load_rknn", path))
        return self.load_ret

    def init_runtime(self, core_mask=0):
        assert self.calls and self.calls[-1][0] == "load_rknn", "init_runtime before load_rknn"
        self.calls.append(("init_runtime", core_mask))
        return self.init_ret

    def inference(self, inputs, data_format=None):
        assert data_format == "nhwc" and len(inputs) == 1
        x = inputs[0]
        assert x.shape == (1, 32, 32, 1) and x.flags.c_contiguous, x.shape  # NCHW handed over as NHWC
        self.calls.append(("inference", x.shape))
        return [np.array([[x.mean(), 1.0 - x.mean()]], dtype=np.float32)]

    def release(self):
        self.released = True


@pytest.fixture
def fake_rknnlite(monkeypatch):
    package, api = types.ModuleType("rknnlite"), types.ModuleType("rknnlite.api")
    api.RKNNLite = FakeRKNNLite
    package.api = api
    monkeypatch.setitem(sys.modules, "rknnlite", package)
    monkeypatch.setitem(sys.modules, "rknnlite.api", api)
    FakeRKNNLite.instances.clear()
    monkeypatch.setattr(FakeRKNNLite, "load_ret", 0)
    monkeypatch.setattr(FakeRKNNLite, "init_ret", 0)
    return FakeRKNNLite


@pytest.fixture
def rknn_file(tmp_path):
    path = tmp_path / "model.rknn"
    path.write_bytes(b"RKNN fake")
    return path


def test_it_loads_binds_the_cores_and_hands_an_nchw_tensor_over_as_nhwc(fake_rknnlite, rknn_file):
    x = np.random.default_rng(0).random((1, 1, 32, 32), dtype=np.float32)
    with RknnLiteRuntime(rknn_file, input_spec=NCHW, core_mask="0_1_2") as rt:
        out = rt.infer(x)
        assert rt.describe()["backend"] == "rknn-lite"
    fake = fake_rknnlite.instances[0]
    assert [c[0] for c in fake.calls] == ["load_rknn", "init_runtime", "inference", "inference"]  # warm-up + one
    assert rt.output_details() == [{"name": "output0", "shape": [1, 2]}]
    assert fake.calls[1] == ("init_runtime", FakeRKNNLite.NPU_CORE_0_1_2)
    assert out[0].dtype == np.float32 and out[0][0, 0] == pytest.approx(x.mean())
    assert fake.released


def test_every_core_mask_choice_names_a_constant_of_the_api():
    assert all(hasattr(FakeRKNNLite, name) for name in CORE_MASKS.values())


def test_failures_are_one_line_errors(fake_rknnlite, rknn_file, monkeypatch):
    monkeypatch.setattr(FakeRKNNLite, "load_ret", -1)
    with pytest.raises(ModelError, match="cannot load"):
        RknnLiteRuntime(rknn_file, input_spec=NCHW)
    assert fake_rknnlite.instances[-1].released
    monkeypatch.setattr(FakeRKNNLite, "load_ret", 0)
    monkeypatch.setattr(FakeRKNNLite, "init_ret", -1)
    with pytest.raises(DeviceError, match="NPU runtime"):
        RknnLiteRuntime(rknn_file, input_spec=NCHW)
    with pytest.raises(ModelError, match="preprocessing"):
        RknnLiteRuntime(rknn_file)


def test_without_the_library_it_says_what_to_install(rknn_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "rknnlite", None)
    with pytest.raises(BackendUnavailable, match="rknn-toolkit-lite2"):
        RknnLiteRuntime(rknn_file, input_spec=NCHW)


def test_the_backends_table_has_both_rknn_rows_and_checks_their_options():
    assert BACKENDS["rknn-lite"].formats == ("rknn",) and BACKENDS["rknn-sim"].formats == ("rknn",)
    assert check_options(RknnLiteRuntime, {"core_mask": "0"}, ValueError) == {"core_mask": "0"}
    with pytest.raises(ValueError):
        check_options(RknnLiteRuntime, {"core_mask": "7"}, ValueError)
