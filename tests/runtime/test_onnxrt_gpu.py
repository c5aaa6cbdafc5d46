"""ONNX Runtime GPU adapter: provider options and the refusal of silent CPU fallback.

The provider checks run against the real (CPU-only) onnxruntime installed here. The ``gpu``
test runs a jetson bundle's FP16 ONNX through onnxruntime-gpu's CUDA provider and skips, with
the reason, where there is no NVIDIA GPU or no onnxruntime-gpu.
"""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import onnxruntime as ort
import pytest

from edgekit.errors import BackendUnavailable, ModelError
from edgekit.imaging.image import InputSpec
from edgekit.runtime import Runtime
from edgekit.runtime.onnxrt import OnnxRuntime
from edgekit.runtime.onnxrt_gpu import (
    OnnxRuntimeGPU,
    check_providers,
    cuda_ep_options,
    tensorrt_ep_options,
)
from tests.runtime.test_trt_engine import SHAPE, tiny_fixture  # noqa: F401 - fixture

SPEC = InputSpec(shape=SHAPE, colour="gray", name="image")
CPU_ONLY = "CUDAExecutionProvider" not in ort.get_available_providers()


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(SHAPE, dtype=np.float32)


@pytest.mark.skipif(not CPU_ONLY, reason="checks the behaviour of a CPU-only onnxruntime build")
def test_requesting_cuda_on_a_cpu_only_build_is_a_clear_error(tiny):
    with pytest.raises(BackendUnavailable, match="CUDAExecutionProvider not available in this onnxruntime") as exc:
        OnnxRuntimeGPU(tiny["fp16"], SPEC, providers=["cuda"])
    assert "onnxruntime-gpu" in exc.value.hint and "--allow-fallback" in exc.value.hint
    with pytest.raises(BackendUnavailable, match="TensorrtExecutionProvider, CUDAExecutionProvider"):
        OnnxRuntimeGPU(tiny["fp16"], SPEC)  # default: tensorrt, cuda


@pytest.mark.skipif(not CPU_ONLY, reason="checks the behaviour of a CPU-only onnxruntime build")
def test_allow_fallback_runs_on_the_cpu_and_describe_says_so(tiny):
    with pytest.warns(RuntimeWarning, match="runs without"):
        rt = OnnxRuntimeGPU(tiny["fp16"], SPEC, providers=["tensorrt", "cuda"], allow_fallback=True)
    with rt, OnnxRuntime(tiny["fp16"], SPEC, providers=["cpu"]) as cpu:
        assert isinstance(rt, Runtime)
        info = rt.describe()
        assert info["backend"] == "onnxruntime-gpu"
        assert info["providers_used"] == ["CPUExecutionProvider"] and info["on_cpu_only"] is True
        assert info["fallback"] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
        for got, want in zip(rt.infer(_x()), cpu.infer(_x())):
            np.testing.assert_array_equal(got, want)


def test_a_provider_dropped_at_session_creation_is_caught(tiny, monkeypatch):
    # onnxruntime lists CUDA as available but cannot load it (say libcudnn is missing): it
    # warns and builds a CPU session. Emulated by claiming CUDA on this CPU-only build.
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with (
        warnings.catch_warnings(record=True) as seen,
        pytest.raises(BackendUnavailable, match=r"silently run without \['CUDAExecutionProvider'\]"),
    ):
        warnings.simplefilter("always")
        OnnxRuntimeGPU(tiny["fp16"], SPEC, providers=["cuda"])
    if CPU_ONLY:  # what onnxruntime alone would have done: warn, and carry on on the CPU
        assert any("not in available provider names" in str(w.message) for w in seen)


def test_cpu_can_be_requested_explicitly(tiny):
    with OnnxRuntimeGPU(tiny["fp16"], SPEC, providers=["cpu"]) as rt:
        assert rt.describe()["fallback"] == [] and rt.providers_used == ["CPUExecutionProvider"]
        assert rt.input_spec.shape == SHAPE


def test_tensorrt_ep_options(tmp_path):
    opts = tensorrt_ep_options(tmp_path / "cache", fp16=True, workspace_mb=512, device_id=1)
    assert opts == {
        "device_id": "1",
        "trt_fp16_enable": "True",
        "trt_max_workspace_size": str(512 << 20),
        "trt_engine_cache_enable": "True",
        "trt_timing_cache_enable": "True",
        "trt_engine_cache_path": str(tmp_path / "cache"),
        "trt_timing_cache_path": str(tmp_path / "cache"),
    }
    plain = tensorrt_ep_options(tmp_path, fp16=False, engine_cache=False, timing_cache=False)
    assert plain["trt_fp16_enable"] == "False" and "trt_engine_cache_path" not in plain
    assert all(isinstance(v, str) for v in opts.values())  # ONNX Runtime takes strings


def test_cuda_ep_options():
    assert cuda_ep_options() == {"device_id": "0", "cudnn_conv_algo_search": "HEURISTIC"}
    assert cuda_ep_options(gpu_mem_limit_mb=256)["gpu_mem_limit"] == str(256 << 20)
    with pytest.raises(ModelError, match="cuDNN"):
        cuda_ep_options(conv_algo_search="FAST")


def test_provider_options_reach_the_session_with_caches_beside_the_model(tiny, monkeypatch):
    seen = {}
    real = ort.InferenceSession

    def spy(path, sess_options=None, providers=None, provider_options=None):
        seen.update(providers=providers, provider_options=provider_options)
        return real(path, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(
        ort,
        "get_available_providers",
        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    monkeypatch.setattr(ort, "InferenceSession", spy)
    with pytest.warns(RuntimeWarning):
        OnnxRuntimeGPU(tiny["fp16"], SPEC, allow_fallback=True).close()
    assert seen["providers"] == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    trt_opts, cuda_opts, cpu_opts = seen["provider_options"]
    assert trt_opts["trt_engine_cache_path"] == str(tiny["dir"].resolve() / ".engines" / "ort-trt")
    assert trt_opts["trt_fp16_enable"] == "True" and cuda_opts["cudnn_conv_algo_search"] == "HEURISTIC"
    assert cpu_opts == {}


def test_check_providers():
    assert check_providers(["CUDAExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"], False) == []
    assert check_providers(["CUDAExecutionProvider"], ["CPUExecutionProvider"], True) == ["CUDAExecutionProvider"]
    with pytest.raises(BackendUnavailable):
        check_providers(["CUDAExecutionProvider"], ["CPUExecutionProvider"], False)


def _gpu_skip_reason() -> str | None:
    if CPU_ONLY:
        return "onnxruntime here has no CUDAExecutionProvider (CPU-only build): needs onnxruntime-gpu and an NVIDIA GPU"
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi: no NVIDIA GPU driver on this machine"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_skip_reason() is not None, reason=_gpu_skip_reason() or "")
def test_fp16_onnx_on_cuda_agrees_with_cpu_and_the_original_model(tmp_path):
    """On an NVIDIA GPU: the jetson bundle's FP16 ONNX on the CUDA provider vs the same file on the
    CPU, the FP32 ONNX, and the original Keras model."""
    import keras

    from edgekit.builders.build import build
    from edgekit.bundle import load_bundle
    from edgekit.imaging.image import Preprocessor, read_image
    from tests.conftest import CALIB, DEMO_MODEL

    (result,) = build(DEMO_MODEL, "jetson", [CALIB], out=tmp_path, quiet=True)
    bundle = load_bundle(result.bundle)
    fp16, fp32 = bundle.model("fp16"), bundle.model("fp32")
    pre = Preprocessor(fp16.input)
    batch = [pre(read_image(p)) for p in sorted(CALIB.glob("*.png"))[:64]]
    with (
        OnnxRuntimeGPU(bundle.path / fp16.file, fp16.input, providers=["cuda"]) as gpu,
        OnnxRuntime(bundle.path / fp16.file, fp16.input, providers=["cpu"]) as cpu16,
        OnnxRuntime(bundle.path / fp32.file, fp32.input, providers=["cpu"]) as cpu32,
    ):
        assert gpu.providers_used[0] == "CUDAExecutionProvider"
        on_gpu = np.concatenate([gpu.infer(x)[0] for x in batch])
        on_cpu = np.concatenate([cpu16.infer(x)[0] for x in batch])
        ref32 = np.concatenate([cpu32.infer(x)[0] for x in batch])
    original = keras.models.load_model(DEMO_MODEL).predict(np.concatenate(batch), verbose=0)
    print(
        f"max |gpu16-cpu16| {np.abs(on_gpu - on_cpu).max():.2e}  |gpu16-fp32| {np.abs(on_gpu - ref32).max():.2e}  "
        f"|gpu16-keras| {np.abs(on_gpu - original).max():.2e}"
    )
    assert np.abs(on_gpu - on_cpu).max() < 1e-2
    assert np.abs(on_gpu - original).max() < 5e-2
    assert (on_gpu.argmax(1) == original.argmax(1)).mean() >= 0.98
    assert (on_gpu.argmax(1) == on_cpu.argmax(1)).mean() >= 0.98
