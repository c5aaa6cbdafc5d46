"""The TensorRT adapter against the recording fakes in tests/fakes (TensorRT 10.x/11.x API and
CUDA bindings). The fakes keep real bytes: pinned host memory is real memory, "device" memory
holds what was copied there, and the fake engine runs the ONNX graph with ONNX Runtime, so
wrong bindings, wrong copies or wrong output order give wrong numbers here. No real GPU or
TensorRT ran these tests.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from edgekit.bundle import load_bundle
from edgekit.errors import BackendUnavailable, ModelError
from edgekit.imaging.image import InputSpec, Preprocessor, read_image
from edgekit.runtime import Runtime
from edgekit.runtime.onnxrt import OnnxRuntime
from edgekit.runtime.tensorrt import TensorRTRuntime
from tests.runtime.test_trt_engine import SHAPE, calls, fake_gpu_fixture, tiny_fixture  # noqa: F401 - fixtures

SPEC = InputSpec(shape=SHAPE, colour="gray", name="image")


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(SHAPE, dtype=np.float32)


def _reference(model, x):
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(["logits", "probs"], {"image": x})


def test_satisfies_the_runtime_contract_and_matches_onnxruntime(fake_gpu, tiny):
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC) as rt:
        assert isinstance(rt, Runtime)
        assert rt.input_spec.shape == SHAPE and rt.input_spec.dtype == "float32" and rt.input_spec.colour == "gray"
        for seed in range(3):
            out = rt.infer(_x(seed))
            want = _reference(tiny["fp16"], _x(seed))
            assert [o.shape for o in out] == [(1, 3), (1, 3)]
            np.testing.assert_array_equal(out[0], want[0])
            np.testing.assert_array_equal(out[1], want[1])
        info = rt.describe()
    assert info["backend"] == "tensorrt" and info["version"] == "10.3.0"
    assert info["precision_requested"] == "fp16" and info["precision_used"] == "fp16"
    assert info["engine_built_now"] is True and info["typing"] == "weak+fp16-flag"
    assert info["gpu"] == "Orin (nvgpu)" and info["compute_capability"] == "8.7" and info["cuda_runtime"] == 12060
    assert info["outputs"] == ["logits", "probs"]


def test_tensors_are_bound_by_name_in_engine_order_and_returned_in_onnx_order(fake_gpu, tiny):
    trt, cudart = fake_gpu
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC) as rt:
        bound = calls(trt, "set_tensor_address")
        # the fake engine lists outputs in reverse ONNX order, as a real engine may
        assert [c[1] for c in bound] == ["image", "probs", "logits"]
        mallocs = {c[2]: c[1] for c in calls(cudart, "cudaMalloc")}
        assert {name: mallocs[ptr] for _, name, ptr in bound} == {"image": 8 * 8 * 4, "probs": 12, "logits": 12}
        out = rt.infer(_x())
    logits, probs = out
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)  # output 1 is the softmax, as in the ONNX
    assert not np.isclose(logits.sum(), 1.0)


def test_one_inference_is_h2d_execute_d2h_on_one_stream_with_pinned_buffers(fake_gpu, tiny):
    trt, cudart = fake_gpu
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC) as rt:
        trt.CALLS.clear()
        cudart.CALLS.clear()
        rt.infer(_x())
        seq = [
            c[0] if c[0] != "cudaMemcpyAsync" else c[1]
            for c in cudart.CALLS
            if c[0] in ("cudaEventRecord", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaEventElapsedTime")
        ]
        assert seq == [
            "cudaEventRecord",
            "cudaMemcpyHostToDevice",
            "cudaEventRecord",
            "cudaEventRecord",
            "cudaMemcpyDeviceToHost",
            "cudaMemcpyDeviceToHost",
            "cudaEventRecord",
            "cudaStreamSynchronize",
            "cudaEventElapsedTime",
            "cudaEventElapsedTime",
            "cudaEventElapsedTime",
        ]
        assert calls(trt, "execute_async_v3") == [("execute_async_v3", int(rt._stream))]
        # the fake CUDA refuses host pointers that are not from cudaMallocHost: all copies were pinned
        assert calls(trt, "set_tensor_address") == []  # addresses are bound once, at open


def test_returned_arrays_are_owned_by_the_caller(fake_gpu, tiny):
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC) as rt:
        first = rt.infer(_x(1))
        keep = [a.copy() for a in first]
        first[0][:] = 123.0  # scribbling on a result must not reach the next one
        second = rt.infer(_x(2))
        np.testing.assert_array_equal(rt.infer(_x(1))[0], keep[0])
    assert not np.shares_memory(first[0], second[0])
    np.testing.assert_array_equal(first[1], keep[1])  # the later inferences did not overwrite it


def test_stage_timings_like_trtexec(fake_gpu, tiny):
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC, warmup=1) as rt:
        for _ in range(5):
            rt.infer(_x())
        assert set(rt.last_timings_ms) == {"h2d", "compute", "d2h", "host"}
        summary = rt.stage_summary()
        assert set(summary) == {"h2d", "compute", "d2h", "host"}
        assert all(s["count"] == 4 for s in summary.values())  # the warm-up inference is set aside
        assert all(s["min_ms"] >= 0 for s in summary.values())
        # GPU stages are nested inside the host wall time
        last = rt.last_timings_ms
        assert last["h2d"] + last["compute"] + last["d2h"] <= last["host"]
        assert rt.describe()["stage_ms"]["compute"]["count"] == 4


def test_close_releases_every_buffer_stream_and_event(fake_gpu, tiny):
    _, cudart = fake_gpu
    rt = TensorRTRuntime(tiny["fp16"], input_spec=SPEC)
    assert cudart.live() == {"device": 3, "host": 3, "streams": 1, "events": 4}
    rt.infer(_x())
    rt.close()
    rt.close()  # idempotent
    assert cudart.live() == {"device": 0, "host": 0, "streams": 0, "events": 0}
    with pytest.raises(ModelError, match="after close"):
        rt.infer(_x())


def test_failure_while_opening_frees_what_was_allocated(fake_gpu, tiny):
    _, cudart = fake_gpu
    cudart.FAIL["cudaMalloc"] = cudart.cudaError_t.cudaErrorMemoryAllocation
    with pytest.raises(BackendUnavailable, match="cudaMalloc failed: cudaErrorMemoryAllocation"):
        TensorRTRuntime(tiny["fp16"], input_spec=SPEC)
    assert cudart.live() == {"device": 0, "host": 0, "streams": 0, "events": 0}


def test_dynamic_input_shape_is_set_before_binding(fake_gpu, tiny):
    trt, _ = fake_gpu
    with TensorRTRuntime(tiny["dynamic"], input_spec=SPEC) as rt:
        names = [c[0] for c in trt.CALLS if c[0] in ("set_input_shape", "set_tensor_address")]
        assert names[0] == "set_input_shape" and ("set_input_shape", "image", SHAPE) in trt.CALLS
        np.testing.assert_array_equal(rt.infer(_x())[0], _reference(tiny["dynamic"], _x())[0])


def test_wrong_input_shape_is_refused(fake_gpu, tiny):
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC) as rt, pytest.raises(ModelError, match="input shape"):
        rt.infer(np.zeros((1, 4, 4, 1), np.float32))


def test_second_open_reuses_the_engine(fake_gpu, tiny):
    trt, _ = fake_gpu
    TensorRTRuntime(tiny["fp16"], input_spec=SPEC).close()
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC) as rt:
        assert rt.describe()["engine_built_now"] is False
    assert trt.BUILDS == 1


def test_a_plan_file_opens_directly_and_keeps_onnx_output_order(fake_gpu, tiny):
    trt, _ = fake_gpu
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC) as rt:
        plan = rt.plan_path
    with TensorRTRuntime(plan) as rt:  # no input spec: read from the engine
        assert rt.input_spec.shape == SHAPE and rt.input_spec.layout == "NHWC" and rt.input_spec.colour == "gray"
        assert rt.describe()["outputs"] == ["logits", "probs"]  # from the sidecar
        assert rt.describe()["engine_reason"] == "plan file given"
    trt.reset("10.4.0")  # the plan was built by another TensorRT
    with pytest.raises(ModelError, match="cannot load tiny_fp16.fp16.plan"):
        TensorRTRuntime(plan)


def test_trt11_path_runs_the_fp16_onnx(fake_gpu, tiny):
    trt, _ = fake_gpu
    trt.reset("11.0.0")
    with TensorRTRuntime(tiny["fp16"], input_spec=SPEC) as rt:
        out = rt.infer(_x())
        assert rt.describe()["typing"] == "strong" and rt.describe()["precision_used"] == "fp16"
    np.testing.assert_array_equal(out[0], _reference(tiny["fp16"], _x())[0])
    assert calls(trt, "removed_api") == []


def test_without_tensorrt_the_error_names_the_fix(tiny, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BackendUnavailable, match="TensorRT") as exc:
        TensorRTRuntime(tiny["fp16"], input_spec=SPEC)
    assert "JetPack" in exc.value.hint


@pytest.fixture(scope="module")
def jetson_bundle(tmp_path_factory):
    """A real jetson bundle of the demo model (the lead's build pipeline; a few seconds)."""
    from edgekit.builders.build import build
    from tests.conftest import CALIB, DEMO_MODEL

    (result,) = build(DEMO_MODEL, "jetson", [CALIB], out=tmp_path_factory.mktemp("dist"), quiet=True)
    assert result.passed
    return result.bundle


def test_jetson_bundle_runs_through_the_adapter_and_agrees_with_onnxruntime(fake_gpu, jetson_bundle):
    from tests.conftest import CALIB

    bundle = load_bundle(jetson_bundle)
    images = [read_image(p) for p in sorted(CALIB.glob("*.png"))[:16]]
    with (
        TensorRTRuntime(jetson_bundle) as rt,
        OnnxRuntime(bundle.path / bundle.model("fp32").file, bundle.model("fp32").input) as ref,
    ):
        assert rt.model_path.name == "demo_fp16.onnx"  # the bundle's default model
        assert rt.describe()["precision_used"] == "fp16"
        pre = Preprocessor(rt.input_spec)
        got = np.concatenate([rt.infer(pre(img))[0] for img in images])
        want = np.concatenate([ref.infer(pre(img))[0] for img in images])
    assert got.shape == (16, len(bundle.labels))  # one score per class of the demo model
    assert (got.argmax(1) == want.argmax(1)).mean() == 1.0
    assert np.abs(got - want).max() < 0.05  # fp16 ONNX vs fp32 ONNX on the CPU
    # the engine cache beside the bundle does not break the bundle's integrity check
    assert (jetson_bundle / ".engines" / "demo_fp16.fp16.plan").is_file()
    load_bundle(jetson_bundle, check_hashes=True)


def test_importing_the_gpu_adapters_loads_no_backend_and_no_tensorflow():
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; import edgekit.runtime.tensorrt, edgekit.runtime.trt_engine, edgekit.runtime.onnxrt_gpu; "
        "print(sorted(m for m in ('tensorflow', 'keras', 'torch', 'tensorrt', 'cuda') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
