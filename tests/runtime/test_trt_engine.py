"""The TensorRT engine builder and its cache, against the recording fake ``tensorrt`` (10.x and
11.x APIs) and fake CUDA bindings in tests/fakes: TensorRT cannot be installed on this
project's machines. What is real here: the ONNX models (built with onnx.helper and converted
to FP16 with onnxconverter-common), the parsing of them, the files and the cache logic.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.bundle import sha256_file
from edgekit.errors import BackendUnavailable, ModelError
from edgekit.runtime import trt_build, trt_cache, trt_engine

FAKES = Path(__file__).parents[1] / "fakes"
SHAPE = (1, 8, 8, 1)


def _tiny_model(batch: int | str = 1, seed: int = 0) -> onnx.ModelProto:
    """NHWC image -> conv -> relu -> pool -> fc; two outputs: logits (fc + bias) and probs (softmax)."""
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 8, 8, 1])
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 1, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "fw"),
        numpy_helper.from_array(np.linspace(-1, 1, 3).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Transpose", ["image"], ["t"], perm=[0, 3, 1, 2], name="to_nchw"),
        helper.make_node("Conv", ["t", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fw"], ["mm"], name="fc"),
        helper.make_node("Add", ["mm", "b"], ["logits"], name="bias"),
        helper.make_node("Softmax", ["mm"], ["probs"], name="softmax"),
    ]
    outs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3]),
        helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "tiny", [x], outs, inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    return model


@pytest.fixture(name="tiny")
def tiny_fixture(tmp_path):
    """A bundle-like folder with tiny_fp32.onnx, tiny_fp16.onnx (keep_io_types) and a dynamic-batch model."""
    from onnxconverter_common import float16

    d = tmp_path / "bundle"
    d.mkdir()
    fp32 = _tiny_model()
    onnx.save(fp32, d / "tiny_fp32.onnx")
    onnx.save(float16.convert_float_to_float16(fp32, keep_io_types=True), d / "tiny_fp16.onnx")
    onnx.save(_tiny_model(batch="N"), d / "tiny_dynamic.onnx")
    return {"dir": d, "fp32": d / "tiny_fp32.onnx", "fp16": d / "tiny_fp16.onnx", "dynamic": d / "tiny_dynamic.onnx"}


def _fake_modules() -> list[str]:
    return [m for m in sys.modules if m == "tensorrt" or m == "cuda" or m.startswith("cuda.")]


@pytest.fixture(name="fake_gpu")
def fake_gpu_fixture():
    """Put the fake tensorrt (10.3.0) and cuda packages first on sys.path; yields (trt, cudart).

    Uses its own MonkeyPatch so the fakes are gone from sys.modules before the next test, and any
    real tensorrt/cuda modules come back, whatever the test itself patched.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(FAKES))
        for name in _fake_modules():
            mp.delitem(sys.modules, name)
        import tensorrt
        from cuda.bindings import runtime as cudart

        cudart.reset()
        tensorrt.reset("10.3.0")
        yield tensorrt, cudart
        for name in _fake_modules():
            sys.modules.pop(name, None)


def calls(trt, name):
    return [c for c in trt.CALLS if c[0] == name]


# ------------------------------------------------------------------------------ TensorRT 10


def test_trt10_sets_fp16_flag_pool_limit_and_detailed_verbosity(fake_gpu, tiny):
    trt, _ = fake_gpu
    engine = trt_engine.load_or_build(tiny["fp16"], SHAPE, "fp16", workspace_mb=256)
    assert engine.built and engine.reason == "no cached engine"
    assert ("config.set_flag", "FP16") in trt.CALLS
    assert ("config.set_memory_pool_limit", "WORKSPACE", 256 << 20) in trt.CALLS
    assert ("config.profiling_verbosity", "DETAILED") in trt.CALLS
    assert calls(trt, "create_network") == [("create_network", 0)]  # explicit batch is implicit in 10.x
    assert calls(trt, "config.add_optimization_profile") == []  # static input: no profile
    assert not calls(trt, "removed_api")
    rec = engine.record
    assert rec["typing"] == "weak+fp16-flag"
    assert rec["precision"]["requested"] == "fp16" and engine.precision_used == "fp16"
    assert rec["precision"]["layers"]["fp16"] >= 5 and rec["precision"]["fp32_layers"] == []
    assert rec["outputs"] == ["logits", "probs"]  # ONNX order, recorded for the adapter


def test_plan_is_cached_beside_the_bundle_unmodified_with_a_json_sidecar(fake_gpu, tiny):
    trt, _ = fake_gpu
    engine = trt_engine.load_or_build(tiny["fp16"], SHAPE)
    assert engine.plan_path == tiny["dir"].resolve() / ".engines" / "tiny_fp16.fp16.plan"
    plan = engine.plan_path.read_bytes()
    assert plan.startswith(trt.PLAN_MAGIC)  # exactly what TensorRT serialised: nothing spliced in
    side = json.loads(trt_cache.sidecar_path(engine.plan_path).read_text())
    assert side["plan_sha256"] == trt_cache.sha256_bytes(plan)
    assert side["key"] == {
        "tensorrt": "10.3.0",
        "gpu": "Orin (nvgpu)",
        "compute_capability": "8.7",
        "onnx_sha256": sha256_file(tiny["fp16"]),
        "precision": "fp16",
        "input_shape": list(SHAPE),
    }
    assert trt.Runtime(None).deserialize_cuda_engine(plan) is not None


def test_timing_cache_is_loaded_and_saved_round_trip(fake_gpu, tiny):
    trt, _ = fake_gpu
    first = trt_engine.load_or_build(tiny["fp16"], SHAPE)
    caches = list(first.plan_path.parent.glob("timing-*.cache"))
    assert [c.name for c in caches] == ["timing-trt10.3.0-orin-nvgpu-sm87.cache"]
    assert calls(trt, "config.create_timing_cache") == [("config.create_timing_cache", 0)]
    assert first.record["timing_cache_loaded"] is False
    saved = caches[0].read_bytes()
    assert json.loads(saved[len(trt.CACHE_MAGIC) :])["entries"] == 1
    trt.CALLS.clear()
    second = trt_engine.load_or_build(tiny["fp16"], SHAPE, rebuild=True)
    assert second.built and second.reason == "rebuild requested"
    assert calls(trt, "config.create_timing_cache") == [("config.create_timing_cache", len(saved))]
    assert ("config.set_timing_cache", 1, False) in trt.CALLS  # loaded, mismatches not ignored
    assert second.record["timing_cache_loaded"] is True
    assert json.loads(caches[0].read_bytes()[len(trt.CACHE_MAGIC) :])["entries"] == 2  # grew and was saved


def test_foreign_or_corrupt_timing_cache_is_replaced_not_trusted(fake_gpu, tiny, tmp_path):
    trt, cudart = fake_gpu
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"garbage")
    result = trt_build.build_plan(trt, tiny["fp16"], SHAPE, timing_cache=cache)
    assert not result.timing_cache_loaded and "unusable" in result.notes[0]
    assert cache.read_bytes().startswith(trt.CACHE_MAGIC)  # a fresh, valid cache replaced it
    cudart.reset(devices=[{"name": b"NVIDIA H100", "major": 9, "minor": 0}])  # same file, another GPU
    result = trt_build.build_plan(trt, tiny["fp16"], SHAPE, timing_cache=cache)
    assert not result.timing_cache_loaded  # TensorRT refused it (ignore_mismatch=False)


def test_fp32_request_sets_no_precision_flag(fake_gpu, tiny):
    trt, _ = fake_gpu
    engine = trt_engine.load_or_build(tiny["fp32"], SHAPE, "fp32")
    assert not calls(trt, "config.set_flag")
    assert engine.record["typing"] == "weak" and engine.precision_used == "fp32"


def test_trt10_gpu_without_fast_fp16_is_an_error_not_a_silent_fp32_engine(fake_gpu, tiny):
    trt, _ = fake_gpu
    trt.IGNORE_FP16 = True  # the builder honours the flag but finds no FP16 kernels
    with pytest.raises(ModelError, match="FP16 was requested but TensorRT built every one of"):
        trt_engine.load_or_build(tiny["fp16"], SHAPE)
    assert not list((tiny["dir"] / ".engines").glob("*.plan"))  # nothing cached


# ------------------------------------------------------------------------------ TensorRT 11


def test_trt11_builds_strongly_typed_from_fp16_onnx_without_removed_apis(fake_gpu, tiny):
    trt, _ = fake_gpu
    trt.reset("11.0.0")
    engine = trt_engine.load_or_build(tiny["fp16"], SHAPE)
    assert calls(trt, "removed_api") == []
    assert calls(trt, "config.set_flag") == []
    assert ("config.set_memory_pool_limit", "WORKSPACE", trt_build.WORKSPACE_MB << 20) in trt.CALLS
    assert engine.record["typing"] == "strong" and engine.precision_used == "fp16"
    # the fake really lacks the removed API: touching it raises and is recorded
    with pytest.raises(AttributeError):
        trt.BuilderFlag.FP16  # noqa: B018
    with pytest.raises(AttributeError):
        trt.IInt8EntropyCalibrator2  # noqa: B018
    assert calls(trt, "removed_api") == [
        ("removed_api", "BuilderFlag.FP16"),
        ("removed_api", "IInt8EntropyCalibrator2"),
    ]


def test_trt11_fp32_onnx_with_fp16_requested_raises_with_the_fix(fake_gpu, tiny):
    trt, _ = fake_gpu
    trt.reset("11.1.0")
    with pytest.raises(ModelError, match="FP16 was requested") as exc:
        trt_engine.load_or_build(tiny["fp32"], SHAPE)
    assert "_fp16.onnx" in exc.value.hint
    assert calls(trt, "removed_api") == []


# ------------------------------------------------------------------------------ shapes


def test_dynamic_input_gets_one_profile_pinned_to_the_bundle_shape(fake_gpu, tiny):
    trt, _ = fake_gpu
    engine = trt_engine.load_or_build(tiny["dynamic"], SHAPE)
    assert calls(trt, "profile.set_shape") == [("profile.set_shape", "image", SHAPE, SHAPE, SHAPE)]
    assert len(calls(trt, "config.add_optimization_profile")) == 1
    assert engine.record["dynamic_input"] is True
    assert engine.record["inputs"][0]["onnx_shape"] == [-1, 8, 8, 1]


def test_dynamic_input_without_a_bundle_shape_is_refused(fake_gpu, tiny):
    with pytest.raises(ModelError, match="dynamic shape"):
        trt_engine.load_or_build(tiny["dynamic"], None)


def test_bundle_shape_that_does_not_fit_the_onnx_is_refused(fake_gpu, tiny):
    with pytest.raises(ModelError, match=r"\[1, 16, 16, 1\] does not fit"):
        trt_engine.load_or_build(tiny["fp16"], (1, 16, 16, 1))


def test_unparsable_onnx_reports_the_parser_error(fake_gpu, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelError, match="TensorRT cannot parse bad.onnx"):
        trt_engine.load_or_build(bad, SHAPE)


# ------------------------------------------------------------------------------ the cache


def test_same_key_reuses_the_engine(fake_gpu, tiny):
    trt, _ = fake_gpu
    trt_engine.load_or_build(tiny["fp16"], SHAPE)
    again = trt_engine.load_or_build(tiny["fp16"], SHAPE)
    assert not again.built and again.reason == "cached engine reused" and trt.BUILDS == 1
    bare = trt_engine.load_or_build(tiny["fp16"], None)  # a bare .onnx: the static engine still fits
    assert not bare.built and trt.BUILDS == 1


@pytest.mark.parametrize(
    "change, reason",
    [
        ("onnx", "ONNX model (sha256) changed"),
        ("tensorrt", "TensorRT version changed: 10.3.0 -> 10.7.0"),
        ("gpu", "GPU changed: Orin (nvgpu) -> Xavier"),
        ("tampered", "plan file does not match its sidecar"),
        ("sidecar", "cached engine has no valid sidecar"),
    ],
)
def test_any_key_change_rebuilds_and_says_why(fake_gpu, tiny, change, reason):
    trt, cudart = fake_gpu
    first = trt_engine.load_or_build(tiny["fp16"], SHAPE)
    if change == "onnx":
        onnx.save(_tiny_model(seed=1), tiny["fp16"])  # the bundle was rebuilt with new weights
    elif change == "tensorrt":
        trt.reset("10.7.0")  # a JetPack upgrade
    elif change == "gpu":
        cudart.reset(devices=[{"name": b"Xavier", "major": 7, "minor": 2}])  # the SD card moved boards
    elif change == "tampered":
        with open(first.plan_path, "ab") as f:
            f.write(b"\0")
    else:
        trt_cache.sidecar_path(first.plan_path).write_text("{")
    builds = trt.BUILDS
    second = trt_engine.load_or_build(tiny["fp16"], SHAPE)
    assert second.built and reason in second.reason and trt.BUILDS - builds == 1
    assert second.plan_path == first.plan_path  # replaced in place: no stale engines pile up
    assert trt_engine.load_or_build(tiny["fp16"], SHAPE).built is False


def test_precisions_are_cached_side_by_side(fake_gpu, tiny):
    a = trt_engine.load_or_build(tiny["fp32"], SHAPE, "fp16")
    b = trt_engine.load_or_build(tiny["fp32"], SHAPE, "fp32")
    assert a.plan_path != b.plan_path and a.plan_path.exists() and b.plan_path.exists()
    assert not trt_engine.load_or_build(tiny["fp32"], SHAPE, "fp16").built


def test_engine_key_differences():
    key = trt_cache.EngineKey("10.3.0", "Orin", "8.7", "a" * 64, "fp16", SHAPE)
    assert key.differences(None) == ["no cached engine"]
    assert key.differences(key.to_dict()) == []
    old = {**key.to_dict(), "compute_capability": "7.2", "input_shape": [1, 4, 4, 1]}
    assert key.differences(old) == [
        "compute capability changed: 7.2 -> 8.7",
        "input shape changed: [1, 4, 4, 1] -> [1, 8, 8, 1]",
    ]


def test_read_only_bundle_caches_in_the_user_cache_dir(fake_gpu, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    real_access = os.access
    # Tests run as root here, for whom chmod 0555 changes nothing: report the bundle read-only.
    monkeypatch.setattr(
        trt_cache.os, "access", lambda p, mode: False if Path(p).name == ".engines" else real_access(p, mode)
    )
    engine = trt_engine.load_or_build(tiny["fp16"], SHAPE)
    assert engine.plan_path.is_relative_to(tmp_path / "xdg" / "edgekit" / "engines")
    assert not trt_engine.load_or_build(tiny["fp16"], SHAPE).built


def test_explicit_cache_dir(fake_gpu, tiny, tmp_path):
    engine = trt_engine.load_or_build(tiny["fp16"], SHAPE, cache_dir=tmp_path / "engines")
    assert engine.plan_path.parent == tmp_path / "engines"


# ------------------------------------------------------------------------------ precision report


def test_layer_precisions_reads_both_inspector_schemas():
    trt10 = {
        "Layers": [
            {
                "Name": "Reformatting CopyNode for Input Tensor 0",
                "LayerType": "Reformat",
                "Outputs": [{"Format/Datatype": "Row major linear FP32 format"}],
            },
            {
                "Name": "conv + relu",
                "LayerType": "CaskConvolution",
                "Outputs": [{"Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
            },
            {"Name": "softmax", "LayerType": "CaskSoftMaxV2", "Outputs": [{"Format/Datatype": "Float"}]},
        ],
        "Bindings": ["x", "y"],
    }
    assert trt_build.layer_precisions(json.dumps(trt10)) == {
        "counts": {"fp16": 1, "fp32": 1},
        "fp32_layers": ["softmax"],
        "inspected": True,
    }
    trt11 = {
        "Layers": [
            {
                "Name": "gemm",
                "LayerType": "MatrixMultiply",
                "Outputs": [{"Format": "Row major linear (kLINEAR)", "DataType": "Half"}],
            }
        ],
        "I/O Tensors": [{"Name": "x", "IOMode": "Input", "DataType": "Float"}],
    }
    assert trt_build.layer_precisions(trt11)["counts"] == {"fp16": 1}
    names_only = {"Layers": ["conv + relu", "softmax"], "Bindings": ["x", "y"]}
    assert trt_build.layer_precisions(names_only)["inspected"] is False


def test_summarize_precision_never_silently_fp32():
    only32 = {"counts": {"fp32": 7}, "inspected": True}
    with pytest.raises(ModelError, match="FP16 was requested"):
        trt_build.summarize_precision("fp16", only32)
    assert trt_build.summarize_precision("fp32", only32) == "fp32"
    assert (
        trt_build.summarize_precision("fp16", {"counts": {"fp16": 5, "fp32": 1}, "inspected": True})
        == "mixed fp16 5 / fp32 1"
    )
    with pytest.warns(RuntimeWarning, match="cannot confirm"):
        assert trt_build.summarize_precision("fp16", {"counts": {}, "inspected": False}) == "unknown"


# ------------------------------------------------------------------------------ imports and devices


def test_missing_tensorrt_and_cuda_python_name_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BackendUnavailable, match="not installed") as exc:
        trt_engine.import_tensorrt()
    assert "JetPack" in exc.value.hint
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(BackendUnavailable, match="cuda-python") as exc:
        trt_engine.import_cudart()
    assert "pip install cuda-python" in exc.value.hint


def test_old_cuda_python_import_path_is_used_as_fallback(fake_gpu, monkeypatch):
    _, cudart = fake_gpu
    from cuda import cudart as old

    assert old is cudart
    with monkeypatch.context() as mp:  # undone before fake_gpu removes the fakes
        mp.setitem(sys.modules, "cuda.bindings", None)  # cuda-python < 12.6: no cuda.bindings
        mp.setitem(sys.modules, "cuda.bindings.runtime", None)
        assert trt_engine.import_cudart() is cudart


def test_no_cuda_device_is_a_clear_error(fake_gpu, tiny):
    _, cudart = fake_gpu
    cudart.reset(devices=[])
    with pytest.raises(BackendUnavailable, match="cudaErrorNoDevice"):
        trt_engine.load_or_build(tiny["fp16"], SHAPE)


def test_gpu_info(fake_gpu):
    _, cudart = fake_gpu
    assert trt_engine.gpu_info(cudart) == trt_cache.GpuInfo("Orin (nvgpu)", "8.7", 0)
    with pytest.raises(BackendUnavailable, match="no CUDA device 3"):
        trt_engine.gpu_info(cudart, 3)
