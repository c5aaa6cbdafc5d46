"""Runtime adapters against the real ai_edge_litert and onnxruntime, on tiny real models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgekit.bundle import BundleWriter
from edgekit.errors import BackendUnavailable, BundleError, ModelError
from edgekit.imaging.image import InputSpec, Preprocessor
from edgekit.runtime import BACKENDS, Runtime, open_runtime
from edgekit.runtime import litert as litert_mod
from edgekit.runtime.litert import LiteRTRuntime, edgetpu_device_string, is_edgetpu_compiled
from edgekit.runtime.onnxrt import OnnxRuntime, summarize_profile
from tests.helpers import tflite_models

SPEC = InputSpec(shape=(1, 32, 32, 1), colour="gray", crop="square")


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """float32 and int8 (uint8 I/O) TFLite of one small CNN, a compiled-for-Edge-TPU copy, an ONNX model."""
    d = tmp_path_factory.mktemp("rt_models")
    fp32 = tflite_models.model_path("small_float")
    int8 = tflite_models.model_path("small_int8")
    compiled = compiled_for_edgetpu(int8, d / "small_int8_edgetpu.tflite")
    renamed = d / "innocent.tflite"
    shutil.copy(compiled, renamed)
    return {"fp32": fp32, "int8": int8, "compiled": compiled, "renamed": renamed, "onnx": onnx_model(d / "m.onnx")}


def compiled_for_edgetpu(src, dest):
    """A model as edgetpu_compiler leaves it: its ops turned into ``edgetpu-custom-op``."""
    from ai_edge_litert.tools import flatbuffer_utils

    m = flatbuffer_utils.read_model(str(src))
    for code in m.operatorCodes:
        code.builtinCode = code.deprecatedBuiltinCode = 32  # CUSTOM
        code.customCode = b"edgetpu-custom-op"
    flatbuffer_utils.write_model(m, str(dest))
    return dest


def onnx_model(path):
    """A 2-class linear ONNX model built with onnx.helper (logit 1 wins when the mean pixel > 0.5)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32, 32, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1024, 2], np.tile([[-1.0, 1.0]], (1024, 1)).ravel().tolist())
    b = helper.make_tensor("b", TensorProto.FLOAT, [2], [512.0, -512.0])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 1024])
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "w"], ["l"]),
        helper.make_node("Add", ["l", "b"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [w, b, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def frame(value: int = 128) -> np.ndarray:
    return np.full((48, 64, 3), value, np.uint8)


def write_bundle(dest, model_files: dict, spec: InputSpec = SPEC, **manifest):
    """A bundle made with the real BundleWriter: {variant: model file}."""
    with BundleWriter(dest) as w:
        entries = []
        for name, src in model_files.items():
            shutil.copy(src, w.dir / f"model_{name}{src.suffix}")
            entries.append(
                {
                    "name": name,
                    "file": f"model_{name}{src.suffix}",
                    "format": src.suffix[1:],
                    "precision": name,
                    "input": spec.to_dict(),
                    "outputs": [{"name": "scores"}],
                }
            )
        (w.dir / "labels.txt").write_text("a\nb\nc\nd\ne\n")
        base = {
            "target": "cpu",
            "default_model": next(iter(model_files)),
            "labels": "labels.txt",
            "runtime": {"adapter": "edgekit.runtime.litert:LiteRTRuntime", "options": {"num_threads": 1}},
            "models": entries,
        }
        return w.commit({**base, **manifest})


# ---------------------------------------------------------------------------------------------
# LiteRT


def test_litert_float_runs_with_xnnpack_and_says_so(models):
    with LiteRTRuntime(models["fp32"], input_spec=SPEC, num_threads=1) as rt:
        assert isinstance(rt, Runtime)
        x = Preprocessor(rt.input_spec)(frame())
        out = rt.infer(x)
        assert out[0].shape == (1, 5) and out[0].sum() == pytest.approx(1.0, abs=1e-5)
        info = rt.describe()
        assert info["backend"] == "ai_edge_litert" and info["delegate_requested"] == "xnnpack"
        assert info["delegate_applied"] and info["delegated_nodes"] == info["total_nodes"] > 0
        assert info["num_threads"] == 1 and info["outputs"][0]["quantization"] is None
        assert rt.output_quantization == [None]
        assert rt.input_spec.crop == "square"  # the bundle's preprocessing survives


def test_litert_results_are_copies_owned_by_the_caller(models):
    with LiteRTRuntime(models["fp32"]) as rt:
        a = rt.infer(Preprocessor(rt.input_spec)(frame(0)))[0]
        keep = a.copy()
        rt.infer(Preprocessor(rt.input_spec)(frame(255)))
        np.testing.assert_array_equal(a, keep)


def test_litert_int8_reads_quantisation_from_the_model(models):
    with LiteRTRuntime(models["int8"], input_spec=SPEC) as rt:
        spec = rt.input_spec
        assert spec.dtype == "uint8" and spec.scale and spec.zero_point is not None
        out = rt.infer(Preprocessor(spec)(frame()))[0]
        assert out.dtype == np.uint8
        scale, zp = rt.output_quantization[0]
        assert scale > 0
        from edgekit.heads.classify import Decoder

        probs, _ = Decoder(quantization=(scale, zp)).scores([out])
        assert probs.sum() == pytest.approx(1.0, abs=0.05)


def test_litert_delegate_none_uses_builtin_kernels(models):
    with LiteRTRuntime(models["int8"], delegate="none") as rt:
        info = rt.describe()
        assert not info["delegate_applied"] and info["delegated_nodes"] == 0
        rt.infer(Preprocessor(rt.input_spec)(frame()))
        ops = rt.op_profile()
        assert sum(o["count"] for o in ops) == info["total_nodes"]
        assert all(o["delegated"] == 0 for o in ops)


def test_litert_bad_arguments(models, tmp_path):
    with pytest.raises(ModelError, match="unknown LiteRT delegate"):
        LiteRTRuntime(models["fp32"], delegate="gpu")
    with pytest.raises(ModelError, match="num_threads"):
        LiteRTRuntime(models["fp32"], num_threads=0)
    with pytest.raises(ModelError, match="does not exist"):
        LiteRTRuntime(tmp_path / "nope.tflite")
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"not a flatbuffer at all" * 10)
    with pytest.raises(ModelError, match="LiteRT cannot load"):
        LiteRTRuntime(junk)


def test_compiled_edgetpu_model_is_refused_on_the_cpu(models):
    assert is_edgetpu_compiled(models["compiled"]) and not is_edgetpu_compiled(models["int8"])
    for path in (models["compiled"], models["renamed"]):  # by content, not only by name
        with pytest.raises(ModelError, match="compiled for the Edge TPU"):
            LiteRTRuntime(path)


def test_edgetpu_delegate_missing_library_is_one_clear_error(models, monkeypatch):
    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(litert_mod.ctypes, "CDLL", no_library)
    with pytest.raises(BackendUnavailable, match="libedgetpu.so.1 is not installed"):
        LiteRTRuntime(models["compiled"], delegate="edgetpu", device="usb")


def test_edgetpu_library_present_but_no_tpu(models, monkeypatch):
    # The real code path up to LiteRT's load_delegate, which fails as it does without a TPU.
    class FakeLiteRT:
        @staticmethod
        def load_delegate(library, options):
            assert (library, options) == ("libedgetpu.so.1", {"device": "usb:1"})
            raise ValueError("Failed to load delegate from libedgetpu.so.1\n")

    monkeypatch.setattr(litert_mod.ctypes, "CDLL", lambda name: object())
    with pytest.raises(BackendUnavailable, match=r"no Edge TPU found \(device usb:1\)") as err:
        litert_mod.load_edgetpu_delegate(FakeLiteRT, "usb:1")
    assert "\n" not in err.value.message


def test_edgetpu_device_strings():
    assert edgetpu_device_string(None) is None and edgetpu_device_string("auto") is None
    for ok in ("usb", "usb:0", "pci", "pci:1", ":0"):
        assert edgetpu_device_string(ok) == ok
    for bad in ("usb:x", "gpu", ":", "pcie:0"):
        with pytest.raises(ModelError):
            edgetpu_device_string(bad)


@pytest.mark.edgetpu
def test_real_edgetpu(models):
    import ctypes

    try:
        ctypes.CDLL("libedgetpu.so.1")
    except OSError:
        pytest.skip("needs libedgetpu.so.1 and a Coral Edge TPU")
    with LiteRTRuntime(models["int8"], delegate="edgetpu", device="usb") as rt:
        assert rt.describe()["delegate_requested"] == "edgetpu"


# ---------------------------------------------------------------------------------------------
# ONNX Runtime


def test_onnx_runs_and_reports_providers(models):
    with OnnxRuntime(models["onnx"], providers="cpu", num_threads=1) as rt:
        assert rt.input_spec.shape == (1, 32, 32, 1) and rt.input_spec.colour == "gray"
        out = rt.infer(Preprocessor(rt.input_spec)(frame(250)))[0]
        assert out.shape == (1, 2) and out[0, 1] > out[0, 0]
        info = rt.describe()
        assert info["providers_used"] == ["CPUExecutionProvider"] == info["providers_requested"]
        assert info["input"]["name"] == "x" and rt.output_quantization == [None]
        assert rt.output_details() == [{"name": "y", "shape": ["batch", 2], "type": "tensor(float)"}]


def test_onnx_refuses_a_silent_provider_fallback(models):
    with pytest.raises(BackendUnavailable, match="none of the requested"):
        OnnxRuntime(models["onnx"], providers="tensorrt")
    if not _cuda_missing():
        pytest.skip("CUDA is available here: nothing to fall back from")
    with pytest.raises(BackendUnavailable, match="silently run without"):
        OnnxRuntime(models["onnx"], providers=["cuda", "cpu"])
    with OnnxRuntime(models["onnx"], providers=["cuda", "cpu"], allow_fallback=True) as rt:
        assert rt.describe()["providers_used"][-1] == "CPUExecutionProvider"


def _cuda_missing() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" not in ort.get_available_providers()


def test_onnx_profile_summarised_by_op_type(models, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rt = OnnxRuntime(models["onnx"], profile=True)
    for _ in range(5):
        rt.infer(Preprocessor(rt.input_spec)(frame()))
    trace = rt.end_profiling()
    rt.close()
    assert trace and not list(tmp_path.iterdir())  # the trace is not dropped in the cwd
    rows = summarize_profile(trace)
    ops = {r["op_type"] for r in rows}  # what really ran: ORT fuses MatMul + Add into Gemm
    assert "Reshape" in ops and ops <= {"Reshape", "MatMul", "Add", "Gemm"}
    assert all(r["calls"] == 5 for r in rows)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert rows == sorted(rows, key=lambda r: -r["total_ms"])
    json.loads(Path(trace).read_text())


def test_onnx_corrupt_model(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(ModelError, match="ONNX Runtime cannot load"):
        OnnxRuntime(bad)


# ---------------------------------------------------------------------------------------------
# open_runtime on bundles, and bundles that must be refused


def test_open_runtime_bundle_variants(models, tmp_path):
    b = write_bundle(tmp_path / "b", {"fp32": models["fp32"], "int8": models["int8"]})
    with open_runtime(b) as rt:
        assert rt.input_spec.dtype == "float32" and rt.num_threads == 1
    with open_runtime(b, model="int8", num_threads=2) as rt:
        assert rt.input_spec.dtype == "uint8" and rt.num_threads == 2
    with pytest.raises(BundleError, match="no model 'fp16'"):
        open_runtime(b, model="fp16")


def test_bad_bundles(models, tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        open_runtime(tmp_path / "missing")
    b = write_bundle(tmp_path / "b", {"fp32": models["fp32"]})
    manifest = b / "edgekit.json"
    good = manifest.read_text()

    manifest.write_text(good[: len(good) // 2])
    with pytest.raises(BundleError, match="corrupt"):
        open_runtime(b)

    manifest.write_text(good.replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(BundleError, match="upgrade edgekit"):
        open_runtime(b)

    manifest.write_text(good)
    with open(b / "model_fp32.tflite", "r+b") as f:
        f.seek(200)
        f.write(b"\xff\xff")
    with pytest.raises(BundleError, match="sha256"):
        open_runtime(b)


def test_bundle_with_a_compiled_model_for_another_machine(models, tmp_path):
    b = write_bundle(tmp_path / "tpu", {"edgetpu": models["compiled"]}, target="edgetpu")
    with pytest.raises(ModelError, match="compiled for the Edge TPU"):
        open_runtime(b)


# ---------------------------------------------------------------------------------------------
# Options: every adapter declares what it takes; open_runtime refuses anything else


def _with_options(bundle, runtime=None, entry=None):
    """Edit a bundle's edgekit.json (not in its sha256 list) to carry other runtime options."""
    path = bundle / "edgekit.json"
    manifest = json.loads(path.read_text())
    if runtime is not None:
        manifest["runtime"]["options"] = runtime
    if entry is not None:
        manifest["models"][0]["runtime_options"] = entry
    path.write_text(json.dumps(manifest))
    return bundle


def _one_line(exc) -> str:
    assert "\n" not in exc.message
    return exc.message


def test_bundle_with_an_unknown_runtime_option_is_refused_naming_the_key(models, tmp_path):
    b = _with_options(write_bundle(tmp_path / "b", {"fp32": models["fp32"]}), runtime={"num_thread": 2})
    with pytest.raises(BundleError) as info:
        open_runtime(b)
    message = _one_line(info.value)
    assert "'num_thread'" in message and "edgekit.json" in message
    assert "num_threads" in message and "delegate" in message  # the options LiteRT takes
    _with_options(b, runtime={}, entry={"providers": ["cpu"]})  # the model entry's options too
    with pytest.raises(BundleError, match="takes no option 'providers'"):
        open_runtime(b)
    _with_options(b, runtime={"delegate": "gpu"}, entry={})  # and values it cannot use
    with pytest.raises(BundleError, match="delegate='gpu' is not one of: xnnpack, none, edgetpu"):
        open_runtime(b)


def test_a_typo_in_a_python_keyword_is_an_error_naming_it(models, tmp_path):
    from edgekit.errors import UsageError

    b = write_bundle(tmp_path / "b", {"fp32": models["fp32"]})
    with pytest.raises(UsageError) as info:
        open_runtime(b, num_thread=1)
    assert "'num_thread'" in _one_line(info.value) and info.value.hint == "did you mean 'num_threads'?"
    with pytest.raises(UsageError, match="LiteRTRuntime takes no option 'providers'"):
        open_runtime(models["fp32"], providers="cpu")  # an option of another adapter
    with pytest.raises(UsageError, match="OnnxRuntime takes no option 'delegate'"):
        open_runtime(models["onnx"], delegate="none")
    with pytest.raises(UsageError, match="num_threads=0 must be a whole number from 1 to"):
        open_runtime(b, num_threads=0)
    with pytest.raises(TypeError, match="num_thread"):  # the adapters themselves take no **kwargs
        LiteRTRuntime(models["fp32"], num_thread=1)


def test_options_from_the_command_line_may_be_text(models):
    with open_runtime(models["onnx"], num_threads="1", providers="cpu", allow_fallback=False) as rt:
        assert rt.describe()["providers_used"] == ["CPUExecutionProvider"] and rt.num_threads == 1


def test_tensorrt_device_must_be_a_cuda_index(tmp_path, models):
    from edgekit.errors import UsageError

    b = write_bundle(tmp_path / "b", {"onnx": models["onnx"]},
                     runtime={"adapter": "edgekit.runtime.tensorrt:TensorRTRuntime", "options": {}})
    with pytest.raises(UsageError, match="TensorRTRuntime option device='usb' must be a whole number"):
        open_runtime(b, device="usb")  # refused before TensorRT is even looked for


@pytest.mark.parametrize("adapter", sorted({row.adapter for row in BACKENDS.values()})
                         + ["edgekit.runtime.fake:FakeRuntime"])  # the fake keeps the contract too
def test_declared_options_are_the_constructor_keywords(adapter):
    import inspect

    from edgekit.util.plugins import resolve

    cls = resolve(adapter)
    params = list(inspect.signature(cls).parameters.values())[2:]  # after the model (or fn) and input_spec
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)  # no **kwargs swallowing typos
    assert [(o.name, o.default) for o in cls.OPTIONS] == [(p.name, p.default) for p in params]
    for option in cls.OPTIONS:
        assert option.coerce(option.default) == option.default, option.name  # every default fits its spec


def test_backend_defaults_fit_their_adapters():
    from edgekit.errors import UsageError
    from edgekit.runtime import check_options
    from edgekit.util.plugins import resolve

    for row in BACKENDS.values():
        check_options(resolve(row.adapter), row.defaults, UsageError)


def test_litert_public_accessors(models):
    with LiteRTRuntime(models["int8"]) as rt:
        (inp,) = rt.input_details()
        assert inp["dtype"] == np.uint8 and tuple(inp["shape"]) == rt.input_spec.shape
        assert [d["index"] for d in rt.output_details()] and rt.output_quantization[0] is not None
        assert {t["index"] for t in rt.tensor_details()} >= {inp["index"]}
        ops = rt.ops_details()
        assert {"index", "op_name", "inputs", "outputs"} <= set(ops[0]) and "CONV_2D" in {o["op_name"] for o in ops}
        rt.input_details().clear()  # a copy: the adapter's own list is untouched
        assert rt.input_details()
    with pytest.raises(ModelError, match="after close"):
        rt.ops_details()
